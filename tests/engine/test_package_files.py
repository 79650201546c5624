"""Hand-edited package files get one error line, and bench fits the package it runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.errors import OptionsError, PackageError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.bench import bench, fit_lengths, sequence_limit
from engine.runtime.package import open_package
from tests._support.cli import cli


@pytest.fixture(scope="module")
def short_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package for 32 tokens: the default 128 + 64 does not fit it."""
    out = tmp_path_factory.mktemp("short") / "pkg"
    export(out, preset="gemma4-tiny", options=ExportOptions(random_weights=True, max_length=32))
    return out


def test_bench_defaults_fit_a_short_package(short_package: Path):
    package = open_package(short_package)
    assert sequence_limit(package) == 32
    prompt, new = fit_lengths(package)
    assert prompt + new <= 32 and new >= 2
    result = bench(short_package, repeats=1, warmup=0)
    assert (result.prompt_length, result.new_tokens) == (prompt, new)
    assert len(result.tokens) == new


@pytest.mark.parametrize("runtime", ["ort", "genai"])
def test_the_cli_benchmarks_a_short_package_with_fitted_defaults(short_package: Path, runtime):
    done = cli("bench", str(short_package), "--runtime", runtime, "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["prompt_length"] + data["new_tokens"] <= 32


@pytest.mark.parametrize(
    ("prompt", "new", "total"), [(30, 8, 38), (None, 40, None), (33, None, None)]
)
def test_lengths_over_the_package_are_refused_up_front_with_the_numbers(
    short_package: Path, prompt, new, total
):
    with pytest.raises(OptionsError) as info:
        bench(short_package, prompt_length=prompt, new_tokens=new)
    message = str(info.value)
    assert "more than the 32 this package supports" in message
    assert "--prompt-len" in message and "--max-length" in message
    if total:
        assert f"is {total} tokens" in message
    args = ["bench", str(short_package)]
    args += ["--prompt-len", str(prompt)] if prompt else []
    args += ["--new-tokens", str(new)] if new else []
    done = cli(*args)
    assert done.returncode == 2 and done.stderr.startswith("error: a prompt of")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_package_too_short_for_any_benchmark_is_refused(tmp_path: Path):
    out = tmp_path / "pkg"
    export(out, preset="gemma4-tiny", options=ExportOptions(random_weights=True, max_length=2))
    with pytest.raises(OptionsError, match="supports sequences of 2 token"):
        bench(out)


def _edited(package: Path, tmp_path: Path, edit: Any, file: str = "genai_config.json") -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(package, copy)
    data = json.loads((copy / file).read_text())
    edit(data)
    (copy / file).write_text(json.dumps(data))
    return copy


def _set(path: str, value: Any) -> Any:
    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        data[last] = value

    return edit


GENAI_EDITS = [
    ("model.vocab_size", "lots", "'model.vocab_size' must be a whole number"),
    ("model.context_length", -5, "'model.context_length' must be a whole number"),
    ("search", [1, 2], "'search' must be an object"),
    ("search.max_length", 12.5, "'search.max_length' must be a whole number"),
    ("search.past_present_share_buffer", "yes", "must be true or false"),
    ("model.eos_token_id", "one", "'model.eos_token_id' must be a token id"),
    ("model.decoder.inputs", ["input_ids"], "'model.decoder.inputs' must be an object"),
    ("model.decoder.outputs", {"logits": 3}, "'model.decoder.outputs' must be an object"),
    ("model.decoder.session_options", "fast", "'model.decoder.session_options' must be"),
    ("model.decoder.session_options.provider_options", {"cpu": {}}, "must be a list"),
    ("model.decoder.session_options.provider_options", ["webgpu"], "provider_options"),
    ("model.decoder.filename", 7, "model.decoder.filename is missing"),
    ("model.decoder.filename", "../model.onnx", "outside the package folder"),
    ("model.decoder.inputs.past_key_names", "past.key", "must hold one '%d'"),
    ("model.type", ["gemma4"], "'model.type' must be a name"),
    ("model", "gemma", "the 'model' section is missing"),
]


@pytest.mark.parametrize(("path", "value", "needle"), GENAI_EDITS)
def test_wrong_typed_genai_config_fields_are_one_error_line(
    short_package: Path, tmp_path: Path, path: str, value: Any, needle: str
):
    edited = _edited(short_package, tmp_path, _set(path, value))
    with pytest.raises(PackageError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        open_package(edited)
    for command in (["bench", str(edited)], ["audit", str(edited), "--no-placement"]):
        done = cli(*command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("options", [[1, 2], "cpu", {"ep": 3, "dtype": ["fp32"]}])
def test_wrong_typed_manifest_fields_do_not_break_opening(
    short_package: Path, tmp_path: Path, options: Any
):
    edited = _edited(short_package, tmp_path, _set("options", options), "export_studio.json")
    if isinstance(options, dict):
        package = open_package(edited)  # unknown values are ignored, the package opens
        assert package.ep == "cpu" and package.dtype is None
    else:
        with pytest.raises(PackageError, match="'options' must be an object"):
            open_package(edited)


def test_a_run_that_fails_after_loading_leaves_no_profile_behind(
    short_package: Path, tmp_path: Path
):
    """The first run is profiled (to count nodes per provider); a run that failed before the
    profile was read left onnxruntime's profile file in the temporary folder (fuzz case)."""
    import os
    import subprocess
    import sys

    from tests._support.cli import ROOT

    edited = _edited(short_package, tmp_path, _set("model.decoder.inputs.input_ids", "ids"))
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "engine", "bench", str(edited), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(temp)},
        timeout=300,
    )
    assert done.returncode == 2 and "has no input 'ids'" in done.stderr, done.stderr
    # onnxruntime keeps one session-id file there (.ses) whatever we do.
    assert sorted(p.name for p in temp.iterdir() if p.name != ".ses") == []


def test_a_genai_config_onnxruntime_genai_cannot_parse_is_one_error_line(
    short_package: Path, tmp_path: Path
):
    edited = _edited(short_package, tmp_path, _set("model.bos_token_id", [[1, 2]]))
    done = cli("bench", str(edited), "--runtime", "genai", "--quiet")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: onnxruntime-genai cannot read ")
    assert "fix the file or rebuild the package" in done.stderr and "Traceback" not in done.stderr
