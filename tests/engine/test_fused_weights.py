"""Fused weights (Q/K/V, gate/up, per-head norm scales) read their checkpoint tensors part
by part and hold exactly the bytes of the separate weights, quantized or not."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engine.errors import WeightsError
from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.pipeline import export
from engine.weights.sources import CheckpointSource, RandomSource, read_fused


def _initializers(package: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(package / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


class ArraySource:
    """Checkpoint-like tensors by key, sliced on demand (RandomSource draws per slice)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def read(
        self,
        weight: LogicalWeight,
        axis: int,
        start: int,
        stop: int,
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray:
        if weight.parts:
            return read_fused(weight, axis, start, stop, self, rows)
        data = (
            np.full(weight.shape, weight.fill, np.float32)
            if weight.source is None
            else self.arrays[weight.source]
        )
        data = data.take(range(start, stop), axis)
        return data if rows is None or axis == 0 else data[rows[0] : rows[1]]


def test_fused_rows_are_the_parts_rows_whatever_the_slice():
    rng = np.random.default_rng(5)
    arrays = {"a": rng.random((3, 8), np.float32), "b": rng.random((5, 8), np.float32)}
    source = ArraySource(arrays)
    a = LogicalWeight("a", (3, 8), "linear", source="a")
    b = LogicalWeight("b", (5, 8), "linear", source="b")
    fused = LogicalWeight("fused", (8, 8), "linear", parts=(a, b))
    whole = np.concatenate([arrays["a"], arrays["b"]])
    np.testing.assert_array_equal(source.read(fused, 0, 0, 8), whole)
    np.testing.assert_array_equal(source.read(fused, 1, 2, 6), whole[:, 2:6])
    # A row slice across the boundary reads only the overlapping rows of each part.
    calls: list[tuple[str, int, int, int]] = []

    class Spy:
        def read(
            self,
            part: LogicalWeight,
            axis: int,
            start: int,
            stop: int,
            rows: tuple[int, int] | None = None,
        ) -> np.ndarray:
            calls.append((part.name, axis, start, stop, rows))
            return source.read(part, axis, start, stop, rows)

    spy = Spy()

    np.testing.assert_array_equal(read_fused(fused, 0, 2, 5, spy), whole[2:5])
    assert calls == [("a", 0, 2, 3, None), ("b", 0, 0, 2, None)]
    # So does a column slice restricted to a block of rows (the streamed writer's chunks).
    calls.clear()
    np.testing.assert_array_equal(read_fused(fused, 1, 2, 6, spy, rows=(4, 7)), whole[4:7, 2:6])
    assert calls == [("b", 1, 2, 6, (1, 4))]
    calls.clear()
    np.testing.assert_array_equal(read_fused(fused, 1, 2, 6, spy, rows=(1, 5)), whole[1:5, 2:6])
    assert calls == [("a", 1, 2, 6, (1, 3)), ("b", 1, 2, 6, (0, 2))]


def test_repeated_and_constant_parts_fill_their_rows():
    row = np.arange(4, dtype=np.float32) + 2
    scale = LogicalWeight("q_norm", (4,), "norm", source="q_norm", repeat=3)
    ones = LogicalWeight("ones", (4,), "norm", fill=1.0, repeat=2)
    fused = LogicalWeight("table", (5, 4), "norm", parts=(scale, ones))
    source = ArraySource({"q_norm": row})
    table = source.read(fused, 0, 0, 5)
    np.testing.assert_array_equal(table[:3], np.stack([row] * 3))
    np.testing.assert_array_equal(table[3:], np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(source.read(fused, 0, 2, 4), table[2:4])
    np.testing.assert_array_equal(source.read(fused, 1, 1, 3), table[:, 1:3])
    np.testing.assert_array_equal(source.read(fused, 1, 1, 3, rows=(2, 5)), table[2:5, 1:3])


def test_random_fused_weight_draws_its_parts_numbers():
    """A random-weights package fuses the same numbers the separate weights would hold."""
    source = RandomSource(seed=5)
    a = LogicalWeight("a", (3, 8), "linear", source="a")
    b = LogicalWeight("b", (5, 8), "linear", source="b")
    fused = LogicalWeight("fused", (8, 8), "linear", parts=(a, b))
    whole = np.concatenate([source.read(a, 0, 0, 3), source.read(b, 0, 0, 5)])
    np.testing.assert_array_equal(source.read(fused, 0, 0, 8), whole)


@pytest.mark.parametrize(
    "options",
    [
        dict(dtype="fp32"),
        dict(dtype="fp16", weight_bits=4, block_size=16),
        dict(dtype="fp16", weight_bits=8, block_size=16),
    ],
    ids=["float", "int4", "int8"],
)
def test_fused_projections_hold_the_separate_weights_bytes(tiny_models, tmp_path, options):
    """A WebGPU package (fused) and a CPU package (separate) of one checkpoint store the
    same bytes: quantization runs per output row, so it commutes with concatenation."""
    model_dir, _ = tiny_models.get("all_features")
    fused = export(
        tmp_path / "webgpu", model_dir=model_dir, options=ExportOptions(ep="webgpu", **options)
    )
    split = export(
        tmp_path / "cpu", model_dir=model_dir, options=ExportOptions(ep="cpu", **options)
    )
    got, want = _initializers(fused.output), _initializers(split.output)
    layer = "layers.0"
    groups = {
        f"{layer}.self_attn.qkv_proj.weight": [f"{layer}.self_attn.{n}_proj.weight" for n in "qkv"],
        f"{layer}.mlp.gate_up_proj.weight": [
            f"{layer}.mlp.{n}_proj.weight" for n in ("gate", "up")
        ],
    }
    for fused_name, names in groups.items():
        if "weight_bits" in options:
            for part in ("qweight", "scales", "zero_points"):
                expected = np.concatenate([want[f"{n}.{part}"] for n in names], axis=0)
                np.testing.assert_array_equal(got[f"{fused_name}.{part}"], expected)
        else:  # MatMul layout [in, out]: the parts sit side by side
            expected = np.concatenate([want[n] for n in names], axis=1)
            np.testing.assert_array_equal(got[fused_name], expected)
        planned = fused.plan.decoder.weight(fused_name).nbytes
        assert planned == sum(split.plan.decoder.weight(n).nbytes for n in names)


def test_head_norm_table_repeats_each_heads_scale(tiny_models, tmp_path):
    model_dir, model = tiny_models.get("all_features")
    result = export(
        tmp_path / "pkg", model_dir=model_dir, options=ExportOptions(ep="webgpu", dtype="fp32")
    )
    table = _initializers(result.output)["layers.0.self_attn.qkv_norm.weight"]
    attention = model.model.layers[0].self_attn
    heads, kv = model.config.num_attention_heads, model.config.num_key_value_heads
    expected = np.concatenate(
        [
            np.stack([attention.q_norm.weight.detach().numpy()] * heads),
            np.stack([attention.k_norm.weight.detach().numpy()] * kv),
            np.ones((kv, table.shape[1]), np.float32),
        ]
    )
    np.testing.assert_array_equal(table, expected)


def test_a_missing_part_is_reported_by_its_checkpoint_key(tiny_models, tmp_path):
    model_dir, _ = tiny_models.get("all_features")
    result = export(
        tmp_path / "pkg", model_dir=model_dir, options=ExportOptions(ep="webgpu", dtype="fp32")
    )
    weights = [wp.weight for wp in result.plan.decoder.weights if not wp.shares]
    fused = next(w for w in weights if w.name == "layers.0.self_attn.qkv_proj.weight")
    ghost = LogicalWeight(
        fused.name,
        fused.shape,
        "linear",
        parts=(
            *fused.parts[:2],
            LogicalWeight("ghost", fused.parts[2].shape, "linear", source="ghost.weight"),
        ),
    )
    source = CheckpointSource(model_dir, [*weights, ghost], lambda key: False)
    with pytest.raises(WeightsError, match=r"ghost\.weight"):
        source.validate()


class _Spy:
    """A source that records how many elements each read returned."""

    def __init__(self, inner: CheckpointSource) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def read(self, weight, axis, start, stop, rows=None) -> np.ndarray:
        data = self.inner.read(weight, axis, start, stop, rows)
        self.sizes.append(data.size)
        return data


@pytest.mark.parametrize(
    "options", [dict(weight_bits=4, block_size=16), dict(dtype="fp16")], ids=["int4", "fp16"]
)
def test_fused_weights_stream_in_bounded_row_chunks(tiny_models, monkeypatch, options):
    """The streamed writer's chunks of a fused quantized weight read at most the chunk
    budget from the checkpoint (no part, let alone the fused tensor, whole in memory) and
    join into the bytes one whole read gives. A float linear is stored transposed, which
    needs the whole (fused) layer: one read, nothing more."""
    from engine.models import load_spec
    from engine.plan import plan
    from engine.weights import factory as factory_module
    from engine.weights.factory import TensorFactory

    model_dir, _ = tiny_models.get("all_features")
    export_plan = plan(load_spec(model_dir), ExportOptions(ep="webgpu", **options))
    linears = [
        wp
        for wp in export_plan.decoder.weights
        if wp.weight.parts and not wp.shares and wp.weight.role == "linear"
    ]
    assert {wp.name.split(".")[-2] for wp in linears} == {"qkv_proj", "gate_up_proj"}
    source = CheckpointSource(model_dir, (w.weight for w in export_plan.decoder.weights), str)
    budget = 64
    for wp in linears:
        (piece,) = wp.pieces
        monkeypatch.setattr(factory_module, "CHUNK_ELEMENTS", 1 << 40)
        (whole,) = TensorFactory(export_plan, source).chunks(wp, piece)
        monkeypatch.setattr(factory_module, "CHUNK_ELEMENTS", budget)
        spy = _Spy(source)
        chunks = list(TensorFactory(export_plan, spy).chunks(wp, piece))
        if wp.storage == "float_t":
            assert spy.sizes == [math.prod(wp.weight.shape)]
        else:
            assert max(spy.sizes) <= max(budget, wp.weight.shape[1]), (wp.name, spy.sizes)
            assert len(chunks) > 1
        for part, data in whole.items():
            joined = np.concatenate([c[part] for c in chunks])
            np.testing.assert_array_equal(joined, data, err_msg=f"{wp.name} {part}")
