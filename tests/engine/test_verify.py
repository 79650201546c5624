"""Verification against transformers: a good package passes, a wrong one fails."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.errors import PackageError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.verify import (
    FLAT_REFERENCE,
    FLOAT_TOLERANCES,
    NEAR_COSINE,
    QUANTIZED_TOLERANCE,
    flatness,
    tolerance_for,
    verify,
)
from tests._support.cli import cli
from tests._support.tiny_gemma import make_checkpoint


@pytest.fixture(scope="module")
def made(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verify")
    model_dir, _ = tiny_models.get("all_features")
    other_seed = root / "seed1"
    make_checkpoint(other_seed, seed=1)
    packages = {
        "fp32": (model_dir, ExportOptions(ep="cpu", dtype="fp32")),
        "fp16": (model_dir, ExportOptions(ep="cpu", dtype="fp16")),
        "int8": (model_dir, ExportOptions(ep="cpu", weight_bits=8, block_size=16)),
        "other_seed": (other_seed, ExportOptions(ep="cpu", dtype="fp32")),
        "other_seed_int8": (other_seed, ExportOptions(ep="cpu", weight_bits=8, block_size=16)),
        "preset": (None, ExportOptions(ep="cpu", random_weights=True)),
    }
    out = {"model": model_dir}
    for name, (source, options) in packages.items():
        target = root / name
        if source is None:
            export(target, preset="gemma4-tiny", options=options)
        else:
            export(target, model_dir=source, options=options)
        out[name] = target
    return out


def test_fp32_package_passes_with_numbers(made):
    result = verify(made["fp32"], made["model"], steps=12)
    assert result.passed and result.reasons == ()
    assert result.tolerance == FLOAT_TOLERANCES["fp32"]
    assert result.max_abs_diff <= 1e-4 and result.min_cosine > 0.99999
    assert result.greedy_tokens_identical and result.agreement == 1.0
    assert len(result.steps) == 12 and result.provider == "CPUExecutionProvider"
    assert result.adapter is None  # a built-in EP
    data = json.loads(json.dumps(result.to_json()))
    assert data["verdict"] == "PASS" and len(data["reference_tokens"]) == 12


def test_fp16_package_passes_under_the_fp16_tolerance(made):
    result = verify(made["fp16"], made["model"], steps=8)
    assert result.tolerance == FLOAT_TOLERANCES["fp16"]
    assert result.passed, result.reasons
    assert result.max_abs_diff > 1e-4  # fp16 really is looser than fp32


def test_package_from_another_seed_fails(made):
    result = verify(made["other_seed"], made["model"], steps=8)
    assert not result.passed
    assert any("relative logit difference" in r for r in result.reasons)
    assert result.max_rel_diff > 0.1 and result.agreement < 0.5


def test_quantized_package_uses_the_agreement_tolerance(made):
    result = verify(made["int8"], made["model"], steps=8)
    assert result.quantized and result.tolerance == QUANTIZED_TOLERANCE
    # The tiny random checkpoints have near-flat logits, which 8-bit weights disturb:
    # the verdict must reflect the measured agreement, whichever way it goes.
    expected = result.agreement >= 0.8 and result.min_cosine >= 0.98
    assert result.passed is expected


def test_a_ranking_failure_on_flat_reference_logits_says_what_it_cannot_tell(made):
    """The tiny random checkpoint's next-token distributions are nearly uniform: a
    quantized package failing top-1 or cosine there gets a note saying so (a new user
    read such a FAIL as a broken package); a package that is really wrong does not."""
    assert flatness([np.zeros(512)]) == pytest.approx(1.0)
    assert flatness([np.r_[30.0, np.zeros(511)]]) < 0.01
    result = verify(made["int8"], made["model"], steps=8)
    assert result.reference_flatness > FLAT_REFERENCE
    failed = replace(result, passed=False, reasons=("top-1 agreement 12% < 80%",))
    (note,) = failed.notes
    assert "nearly flat" in note and "trained checkpoint" in note
    assert failed.to_json()["notes"] == [note]
    wrong = verify(made["other_seed"], made["model"], steps=4)
    assert any("relative logit difference" in r for r in wrong.reasons) and wrong.notes == ()
    # a quantized package of other weights fails on ranking alone, and is far off: no note
    wrong = verify(made["other_seed_int8"], made["model"], steps=4)
    assert not wrong.passed and wrong.min_cosine < NEAR_COSINE and wrong.notes == ()
    assert replace(failed, reference_flatness=0.5).notes == ()


def test_package_of_another_architecture_is_refused(made):
    with pytest.raises(
        PackageError, match=r"vocabulary \(512\) differs from the checkpoint's \(320\)"
    ):
        verify(made["preset"], made["model"])


def test_a_checkpoint_of_another_shape_with_the_same_vocabulary_is_refused(made, tmp_path: Path):
    """A package verified against the wrong checkpoint must not be blamed for it (before:
    a full run, then FAIL on cosine -0.08). Same vocabulary, wider MLP and more heads."""
    wider = tmp_path / "wider"
    make_checkpoint(wider, intermediate_size=192, num_attention_heads=8)
    with pytest.raises(PackageError) as refused:
        verify(made["fp32"], wider, steps=2)
    message = str(refused.value)
    assert "fp32 was exported from a different model" in message
    assert "attention heads 4 in the package, 8 in the checkpoint" in message
    assert "MLP widths [128, 256] in the package, [192, 384] in the checkpoint" in message
    assert "verify the package against the checkpoint it was exported from" in message


def test_tolerance_follows_the_manifest(made):
    from engine.runtime.package import open_package

    assert tolerance_for(open_package(made["fp16"])) == FLOAT_TOLERANCES["fp16"]
    assert tolerance_for(open_package(made["int8"])) == QUANTIZED_TOLERANCE


def test_verify_cli_exit_codes_and_verdicts(made):
    good = cli(
        "verify", str(made["fp32"]), "--model", str(made["model"]), "--steps", "4", "--quiet"
    )
    assert good.returncode == 0, good.stderr
    assert "verdict: PASS" in good.stdout and "greedy tokens identical" in good.stdout
    assert "Loading weights" not in good.stderr  # --quiet: no transformers bar either
    bad = cli(
        "verify", str(made["other_seed"]), "--model", str(made["model"]), "--steps", "4", "--json"
    )
    assert bad.returncode == 1, bad.stderr
    assert json.loads(bad.stdout)["verdict"] == "FAIL"


def test_verify_cli_without_a_checkpoint_is_a_clear_error(made, tmp_path: Path):
    result = cli("verify", str(made["fp32"]), "--model", str(tmp_path), "--quiet")
    assert result.returncode == 2 and "has no config.json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("damage", ["removed", "truncated", "config removed"])
def test_verify_does_not_pass_a_package_whose_tokenizer_genai_cannot_load(
    made, tmp_path: Path, damage: str
):
    """A PASS vouches for a package genai can run text through: a broken or missing
    tokenizer is refused before transformers runs, naming the file."""
    import shutil

    package = tmp_path / "pkg"
    shutil.copytree(made["fp32"], package)
    tokenizer = package / "tokenizer.json"
    if damage == "removed":
        tokenizer.unlink()
    elif damage == "truncated":
        tokenizer.write_bytes(tokenizer.read_bytes()[: tokenizer.stat().st_size // 2])
    else:
        (package / "tokenizer_config.json").unlink()
    result = cli("verify", str(package), "--model", str(made["model"]), "--steps", "2", "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "tokenizer" in line and "verdict" not in result.stdout, line


def test_verify_on_webgpu_says_which_adapter_ran_it(made, tmp_path: Path):
    """The plugin EP runs on a GPU or on the software adapter: the verdict says which."""
    from tests._support.webgpu import require_webgpu

    require_webgpu()
    package = tmp_path / "webgpu"
    export(package, model_dir=made["model"], options=ExportOptions(ep="webgpu", dtype="fp32"))
    args = ("verify", str(package), "--model", str(made["model"]), "--steps", "3", "--quiet")
    result = cli(*args, "--ep", "webgpu")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "ran on WebGpuExecutionProvider" in lines[0]
    assert lines[1].strip().startswith("through the WebGpuExecutionProvider plugin 0.4")
    as_json = json.loads(cli(*args, "--ep", "webgpu", "--json").stdout)
    assert as_json["adapter"] == lines[1].strip().removeprefix("through the ")
    assert as_json["cpu_fallback"] == {} and "on the CPU instead" not in result.stdout
    # A CPU package on WebGPU keeps nodes on the CPU: said, as onnxruntime's warning was.
    cpu_args = ("verify", str(made["fp32"]), "--model", str(made["model"]), "--steps", "2")
    moved = cli(*cpu_args, "--ep", "webgpu", "--quiet")
    assert "nodes that ran on the CPU instead: " in moved.stdout, moved.stdout + moved.stderr
    assert json.loads(cli(*cpu_args, "--ep", "webgpu", "--json").stdout)["cpu_fallback"]
