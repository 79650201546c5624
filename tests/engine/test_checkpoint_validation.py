"""safetensors checkpoints are validated fully, the shard index is the truth, and values that
cannot make a working package (NaN, infinities, float16 overflow, integers) are refused with
the tensor named."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine.errors import WeightsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.weights.checkpoint import Checkpoint
from tests._support.fake_checkpoint import write_checkpoint

WEIGHTS = "model.safetensors"


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "M")


def raw_file(path: Path, header: Any, data: bytes, *, raw: bytes | None = None) -> None:
    """A safetensors file with exactly this header (JSON of ``header``, or ``raw`` bytes)."""
    text = raw if raw is not None else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def two_tensors(a: list[int], b: list[int], dtype: str = "F32") -> dict[str, Any]:
    return {
        "a": {"dtype": dtype, "shape": [4], "data_offsets": a},
        "b": {"dtype": dtype, "shape": [4], "data_offsets": b},
    }


DATA = np.arange(8, dtype=np.float32).tobytes()


@pytest.mark.parametrize(
    ("header", "data", "needle"),
    [
        (two_tensors([0, 16], [8, 24]), DATA, "tensor 'b' overlaps the data of 'a'"),
        (two_tensors([0, 16], [0, 16]), DATA[:16], "tensor 'b' overlaps the data of 'a'"),
        (two_tensors([0, 16], [20, 36]), DATA + b"\0" * 4, "starts 4 bytes after"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, DATA, "belong to no"),
        (two_tensors([0, 16], [16, 48]), DATA, "has 32 bytes of data for its shape [4]"),
        (two_tensors([0, 16], [16, 32]), DATA[:24], "points outside the file"),
        (two_tensors([0, 16], [32, 16]), DATA, "has -16 bytes of data"),
        (two_tensors([0, 16], [16.0, 32]), DATA, "is not a [begin, end] pair"),
        (two_tensors([0, 16], [True, 32]), DATA, "is not a [begin, end] pair"),
        (two_tensors([0, 16], [-16, 0]), DATA, "is not a [begin, end] pair"),
        (two_tensors([0, 16], [16, 32], dtype="F17"), DATA, "unknown dtype 'F17'"),
        ({"a": {"dtype": "F32", "shape": [-8], "data_offsets": [0, 32]}}, DATA, "shape [-8]"),
        ({"a": {"dtype": "F32", "shape": "8", "data_offsets": [0, 32]}}, DATA, "shape '8'"),
        ({"a": [1, 2]}, DATA, "not a JSON object"),
        ({"__metadata__": {"format": 1}}, b"", "__metadata__ must map names to strings"),
        ({"__metadata__": ["pt"]}, b"", "__metadata__ must map names to strings"),
        ([1, 2, 3], b"", "not a JSON object"),
    ],
)
def test_corrupt_headers_are_refused_like_the_safetensors_library_does(
    tmp_path: Path, header: Any, data: bytes, needle: str
):
    from safetensors import SafetensorError
    from safetensors.numpy import load_file as reference_load

    path = tmp_path / WEIGHTS
    raw_file(path, header, data)
    with pytest.raises(WeightsError) as info:
        Checkpoint(tmp_path)
    assert needle in str(info.value)
    assert WEIGHTS in str(info.value)
    with pytest.raises(SafetensorError):  # the library agrees the file is bad
        reference_load(str(path))


def test_a_name_twice_in_one_header_is_refused(tmp_path: Path):
    raw = (
        b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, '
        b'"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}'
    )
    raw_file(tmp_path / WEIGHTS, None, DATA, raw=raw)
    with pytest.raises(WeightsError, match="the name 'a' appears twice"):
        Checkpoint(tmp_path)


def test_good_headers_in_any_order_and_empty_tensors_are_read(tmp_path: Path):
    header = {
        "__metadata__": {"format": "pt"},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]},
        "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "ids": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]},
    }
    raw_file(tmp_path / WEIGHTS, header, DATA + b"\0" * 8)
    checkpoint = Checkpoint(tmp_path)
    assert checkpoint.read("b").tolist() == [4, 5, 6, 7]
    assert checkpoint.read("empty").shape == (0, 3)
    with pytest.raises(WeightsError, match="dtype I64, which the engine does not read"):
        checkpoint.read("ids")


def _shard(model: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    tensors = load_file(model / WEIGHTS)
    names = sorted(tensors)
    half = len(names) // 2
    (model / WEIGHTS).unlink()
    first = {n: tensors[n] for n in names[:half]}
    second = {n: tensors[n] for n in names[half:]}
    return first, second


def _write_index(model: Path, weight_map: Any) -> None:
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def _sharded(model: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    first, second = _shard(model)
    save_file(first, str(model / "model-00001-of-00002.safetensors"))
    save_file(second, str(model / "model-00002-of-00002.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in second})
    _write_index(model, weight_map)
    return weight_map, {**first, **second}


def test_the_same_tensor_in_two_files_is_refused(model: Path, tmp_path: Path):
    tensors = load_file(model / WEIGHTS)
    save_file({"model.norm.weight": tensors["model.norm.weight"] * 2}, str(model / "b.safetensors"))
    with pytest.raises(WeightsError, match=r"'model\.norm\.weight' is stored twice"):
        export(tmp_path / "out", model_dir=model)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_the_index_is_the_truth(model: Path, tmp_path: Path):
    weight_map, tensors = _sharded(model)
    # A stray file beside an index is not part of the checkpoint, even a broken one.
    (model / "stray.safetensors").write_bytes(b"garbage")
    export(tmp_path / "ok", model_dir=model)
    # The same tensor in a second shard is refused rather than "later file wins".
    name = "model.norm.weight"
    other = "model-00002-of-00002.safetensors"
    if weight_map[name] == other:
        other = "model-00001-of-00002.safetensors"
    save_file({**load_file(model / other), name: tensors[name] * 3}, str(model / other))
    with pytest.raises(WeightsError, match=r"'model\.norm\.weight' is stored twice"):
        export(tmp_path / "twice", model_dir=model)


def test_an_index_that_disagrees_with_its_shards_is_refused(model: Path, tmp_path: Path):
    weight_map, _ = _sharded(model)
    name = next(iter(weight_map))
    wrong = dict(weight_map)
    wrong[name] = next(f for f in set(weight_map.values()) if f != weight_map[name])
    _write_index(model, wrong)
    with pytest.raises(WeightsError, match="does not match its shards") as info:
        export(tmp_path / "out", model_dir=model)
    assert f"'{name}' (the index says {wrong[name]}" in str(info.value)


@pytest.mark.parametrize(
    "shard",
    ["../outside.safetensors", "/etc/outside.safetensors", "sub/../../outside.safetensors"],
)
def test_an_index_may_not_point_outside_the_folder(model: Path, tmp_path: Path, shard: str):
    weight_map, tensors = _sharded(model)
    save_file(tensors, str(tmp_path / "outside.safetensors"))
    _write_index(model, {**weight_map, next(iter(weight_map)): shard})
    with pytest.raises(WeightsError, match="outside the checkpoint folder"):
        export(tmp_path / "out", model_dir=model)


@pytest.mark.parametrize("weight_map", [[], {}, "x", {"a": 3}, None])
def test_a_malformed_index_is_refused(model: Path, tmp_path: Path, weight_map: Any):
    _write_index(model, weight_map)
    with pytest.raises(WeightsError, match="weight_map"):
        export(tmp_path / "out", model_dir=model)


def test_integer_tensors_where_float_weights_belong_are_refused(model: Path, tmp_path: Path):
    tensors = load_file(model / WEIGHTS)
    name = "model.layers.2.mlp.down_proj.weight"
    tensors[name] = (tensors[name] * 100).astype(np.uint8)
    # An integer buffer of a tower the text export does not read is fine.
    tensors["model.vision_tower.position_ids"] = np.arange(4, dtype=np.int64)
    save_file(tensors, str(model / WEIGHTS))
    with pytest.raises(WeightsError, match="stored as integers") as info:
        export(tmp_path / "out", model_dir=model)
    assert f"{name}: U8" in str(info.value)
    assert "vision_tower" not in str(info.value)


def _poison(model: Path, name: str, index: tuple[int, ...], value: float) -> None:
    tensors = load_file(model / WEIGHTS)
    tensors[name][index] = value
    save_file(tensors, str(model / WEIGHTS))


@pytest.mark.parametrize(
    ("name", "index", "options"),
    [
        ("model.layers.1.mlp.up_proj.weight", (9, 3), {}),  # float_t
        ("model.embed_tokens.weight", (300, 5), {"dtype": "fp16"}),  # float table
        ("model.layers.0.input_layernorm.weight", (17,), {}),  # a norm
        ("model.layers.4.self_attn.q_proj.weight", (2, 40), {"weight_bits": 4}),  # quantized
        ("model.embed_tokens_per_layer.weight", (511, 100), {"embedding_bits": 8}),
    ],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_infinities_are_refused_naming_the_tensor(
    model: Path, tmp_path: Path, name: str, index: tuple[int, ...], options: dict, bad: float
):
    _poison(model, name, index, bad)
    with pytest.raises(WeightsError, match="NaN or infinite") as info:
        export(tmp_path / "out", model_dir=model, options=ExportOptions(**options))
    message = str(info.value)
    assert f"'{name}'" in message and "checkpoint is damaged" in message
    if not options.get("weight_bits") and not options.get("embedding_bits"):
        assert f"the first at {list(index)}" in message
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_float16_overflow_is_refused_and_float32_takes_it(model: Path, tmp_path: Path):
    name = "model.layers.3.self_attn.o_proj.weight"
    _poison(model, name, (5, 6), -70000.0)
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "fp16", model_dir=model, options=ExportOptions(dtype="fp16"))
    message = str(info.value)
    assert f"'{name}' holds -70000 at [5, 6]" in message
    assert "largest fp16 value (65504)" in message and "--dtype fp32" in message
    assert leftovers(tmp_path) == []
    export(tmp_path / "fp32", model_dir=model, options=ExportOptions(dtype="fp32"))
