"""Bad input gets a clear error and leaves nothing half-written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from engine.errors import CancelledError, OptionsError, PackageError, SpecError, WeightsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.progress import CancelToken
from engine.weights.checkpoint import Checkpoint


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


@pytest.fixture()
def checkpoint(tiny_models, tmp_path: Path) -> Path:
    source, _ = tiny_models.get("all_features")
    copy = tmp_path / "model"
    shutil.copytree(source, copy)
    return copy


def test_truncated_safetensors_is_reported(checkpoint: Path, tmp_path: Path):
    weights = checkpoint / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="truncated or corrupt"):
        export(tmp_path / "out", model_dir=checkpoint)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_garbage_header_is_reported(checkpoint: Path, tmp_path: Path):
    (checkpoint / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(WeightsError, match="corrupt safetensors header"):
        export(tmp_path / "out", model_dir=checkpoint)


def test_missing_unexpected_and_misshaped_tensors_listed_together(checkpoint: Path, tmp_path: Path):
    weights = checkpoint / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.q_proj.weight"] = tensors[
        "model.layers.0.self_attn.q_proj.weight"
    ][:8]
    tensors["model.mystery.weight"] = tensors["model.norm.weight"]
    save_file(tensors, weights)
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "out", model_dir=checkpoint)
    message = str(info.value)
    assert "1 tensor(s) missing" in message and "model.layers.1.mlp.up_proj.weight" in message
    assert "wrong shape" in message and "model.layers.0.self_attn.q_proj.weight" in message
    assert "unexpected" in message and "model.mystery.weight" in message
    assert not (tmp_path / "out").exists()


def test_unknown_model_type(checkpoint: Path, tmp_path: Path):
    config = json.loads((checkpoint / "config.json").read_text())
    config["model_type"] = "falcon"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="model type 'falcon' is not supported"):
        export(tmp_path / "out", model_dir=checkpoint)


def test_folder_without_config(tmp_path: Path):
    with pytest.raises(SpecError, match=r"no config\.json"):
        export(tmp_path / "out", model_dir=tmp_path)


def test_unwritable_output_folder(checkpoint: Path, tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(PackageError, match="cannot create the folder"):
        export(blocker / "out", model_dir=checkpoint)


def test_existing_output_needs_overwrite(checkpoint: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PackageError, match="--overwrite"):
        export(out, model_dir=checkpoint)
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({}, "give a model folder (--model) or a preset (--preset)"),
        (
            {"preset": "gemma4-tiny"},
            "give a model folder (--model) or a preset (--preset), not both",
        ),
    ],
)
def test_model_folder_or_preset_exactly_one(checkpoint: Path, tmp_path: Path, given, words):
    if given:  # both
        given = {**given, "model_dir": checkpoint}
    with pytest.raises(OptionsError) as caught:
        export(tmp_path / "out", options=ExportOptions(random_weights=True), **given)
    assert str(caught.value) == words
    assert caught.value.raw.count("{opt:") == 2  # each face words both options its own way
    assert not (tmp_path / "out").exists()


def test_preset_without_random_weights_is_refused(tmp_path: Path):
    with pytest.raises(OptionsError, match="--random-weights"):
        export(tmp_path / "out", preset="gemma4-tiny")


@pytest.mark.parametrize("overwrite", [False, True])
def test_cancel_midway_leaves_nothing_and_keeps_existing(
    checkpoint: Path, tmp_path: Path, overwrite: bool
):
    out = tmp_path / "out"
    if overwrite:
        export(out, model_dir=checkpoint)
    before = {p.name: p.read_bytes() for p in out.iterdir()} if overwrite else {}
    cancel = CancelToken()
    seen: list[str] = []

    def progress(fraction: float, message: str) -> None:
        seen.append(message)
        if message.startswith("writing layers.2"):
            cancel.cancel()

    with pytest.raises(CancelledError):
        export(out, model_dir=checkpoint, overwrite=overwrite, progress=progress, cancel=cancel)
    assert any(m.startswith("writing layers.2") for m in seen)
    assert leftovers(tmp_path) == []
    if overwrite:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists()


def test_failure_while_writing_keeps_existing_package(
    checkpoint: Path, tmp_path: Path, monkeypatch
):
    out = tmp_path / "out"
    export(out, model_dir=checkpoint)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    original = Checkpoint.read

    def failing_read(self, name, *args, **kwargs):
        if "layers.3.mlp" in name:
            raise WeightsError(f"simulated read error in {name}")
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(Checkpoint, "read", failing_read)
    with pytest.raises(WeightsError, match="simulated read error"):
        export(out, model_dir=checkpoint, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == []


def test_dtype_the_ep_cannot_run_is_refused_before_any_work(tmp_path: Path):
    with pytest.raises(
        OptionsError, match="CPU does not run bf16 models; choose one of: fp32, fp16"
    ):
        export(
            tmp_path / "out",
            preset="gemma4-tiny",
            options=ExportOptions(ep="cpu", dtype="bf16", random_weights=True),
        )
    assert list(tmp_path.iterdir()) == []
