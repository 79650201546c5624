"""Quality on text in ``verify``: KL divergence, top-1 agreement and perplexity of a
package against transformers on the built-in sample or the user's own file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from engine.errors import OptionsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.quality import SAMPLE, measure, read_text
from engine.runtime.verify import verify
from tests._support.cli import cli


@pytest.fixture(scope="module")
def made(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quality")
    model_dir, _ = tiny_models.get("all_features")
    out = {"model": model_dir}
    for name, options in {
        "fp32": ExportOptions(ep="cpu", dtype="fp32"),
        "int4": ExportOptions(ep="cpu", dtype="fp32", weight_bits=4, block_size=16),
    }.items():
        export(root / name, model_dir=model_dir, options=options)
        out[name] = root / name
    return out


def test_measure_is_the_textbook_kld_top1_and_perplexity():
    half = np.log([0.5, 0.5])
    skewed = np.log([0.9, 0.1])
    # logits shifted by a constant are the same distribution
    quality = measure(np.stack([half, half + 3.0]), np.stack([skewed, half]), np.array([0, 1]), "t")
    first = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert quality.mean_kld == pytest.approx(first / 2)
    assert quality.max_kld == pytest.approx(first)
    assert quality.reference_perplexity == pytest.approx(2.0)
    assert quality.package_perplexity == pytest.approx(
        math.exp(-(math.log(0.9) + math.log(0.5)) / 2)
    )
    # ties break to the first token in both: agreement on both rows
    assert quality.top1_agreement == 1.0 and quality.tokens == 2


def test_a_float_package_loses_nothing_on_the_sample(made):
    result = verify(made["fp32"], made["model"], steps=4)
    quality = result.quality
    assert quality is not None and quality.source == SAMPLE
    assert quality.tokens == 128  # the sample is longer than the default positions
    assert quality.mean_kld < 1e-8 and quality.top1_agreement == 1.0
    assert quality.perplexity_ratio == pytest.approx(1.0, abs=1e-4)
    assert result.passed


def test_int4_loses_measurably_and_max_kld_judges_it(made):
    loose = verify(made["int4"], made["model"], steps=4, max_kld=10.0)
    assert loose.quality is not None and loose.quality.mean_kld > 1e-4
    assert loose.quality.package_perplexity != loose.quality.reference_perplexity
    strict = verify(made["int4"], made["model"], steps=4, max_kld=loose.quality.mean_kld / 2)
    assert not strict.passed
    assert any("mean KL divergence on text" in r for r in strict.reasons)


def test_the_users_own_text_and_its_length(made, tmp_path: Path):
    text = tmp_path / "mine.txt"
    text.write_text("A short note about rivers, tea and the budget for May. " * 3, encoding="utf-8")
    result = verify(made["int4"], made["model"], steps=2, text=text, quality_tokens=16)
    assert result.quality is not None
    assert result.quality.source == str(text) and result.quality.tokens == 16
    assert verify(made["fp32"], made["model"], steps=2, quality_tokens=0).quality is None


def _verify_cli(made: dict[str, Path], package: str, *args: str):
    return cli("verify", str(made[package]), "--model", str(made["model"]), *args)


def test_the_cli_prints_quality_and_refuses_bad_text(made, tmp_path: Path):
    ok = _verify_cli(made, "int4", "--steps", "2", "--text-tokens", "24", "--json")
    assert ok.returncode in (0, 1), ok.stderr
    data = json.loads(ok.stdout)["quality"]
    assert data["tokens"] == 24 and data["source"] == SAMPLE and data["mean_kld"] > 0
    shown = _verify_cli(made, "fp32", "--steps", "2", "--text-tokens", "8", "--quiet")
    assert "quality  on 8 tokens of built-in sample: mean KLD" in shown.stdout, shown.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    for path, message in ((empty, "holds no text"), (tmp_path / "nope.txt", "does not exist")):
        bad = _verify_cli(made, "fp32", "--text", str(path), "--quiet")
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr
    with pytest.raises(OptionsError, match="cannot be read as UTF-8"):
        binary = tmp_path / "bin.txt"
        binary.write_bytes(b"\xff\xfe\x00\x81")
        read_text(binary)


def test_longrope_past_its_original_length_is_verified_through_the_cache(tmp_path: Path):
    """Phi-4's longrope takes its long factors once a run passes the original length (16):
    the package rotates each new token with the set of its step, as transformers does
    through its cache, so verify's transformers runs that way too. A float package then
    loses nothing over 24 steps and 40 text positions past the switch."""
    from tests._support.tiny_llama import make_checkpoint

    make_checkpoint(tmp_path / "phi4", "phi4")
    export(tmp_path / "pkg", model_dir=tmp_path / "phi4", options=ExportOptions(dtype="fp32"))
    result = verify(tmp_path / "pkg", tmp_path / "phi4", steps=24, quality_tokens=40)
    assert result.passed, result.reasons
    assert result.max_abs_diff <= 1e-4 and result.greedy_tokens_identical
    assert result.quality is not None and result.quality.tokens == 40
    assert result.quality.mean_kld < 1e-8 and result.quality.top1_agreement == 1.0


def test_the_cli_default_is_the_engines():
    from engine.commands.verify import TEXT_TOKENS
    from engine.runtime.quality import DEFAULT_TOKENS

    assert TEXT_TOKENS == DEFAULT_TOKENS
