"""The written package follows the plan byte for byte, and splits change no logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from engine.dtypes import ir_dtype
from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
SMALL_CONSTANT_BYTES = 1024


def stored_initializers(model_path: Path) -> dict[str, tuple[int, tuple[int, ...], int, bool]]:
    """name -> (onnx data type, shape, stored bytes, external) read from the saved file."""
    proto = onnx.load(str(model_path), load_external_data=False)
    out = {}
    for init in proto.graph.initializer:
        external = init.data_location == onnx.TensorProto.EXTERNAL
        if external:
            length = int(next(e.value for e in init.external_data if e.key == "length"))
        else:
            length = len(init.raw_data)
        out[init.name] = (init.data_type, tuple(init.dims), length, external)
    return out


@pytest.mark.parametrize(
    "options",
    [
        dict(ep="cpu"),
        # Limits small enough to split the tables leave some linears over them: forced.
        dict(ep="webgpu", dtype="fp32", max_buffer_size=40_000, force=True),
        dict(ep="cpu", weight_bits=4, embedding_bits=8, block_size=16),
        # 8-bit tables: the 4-bit per-layer pieces of these tiny models (one block of 16)
        # are what WebGPU's GatherBlockQuantized refuses (an odd block count).
        dict(
            ep="webgpu",
            weight_bits=4,
            embedding_bits=8,
            block_size=16,
            max_buffer_size=4096,
            force=True,
        ),
        # 4-bit tables split the same way, on the CPU EP (which reads odd block counts).
        dict(
            ep="cpu",
            weight_bits=4,
            embedding_bits=4,
            block_size=16,
            max_buffer_size=4096,
            force=True,
        ),
        dict(ep="cpu", weight_bits=4, symmetric=True, block_size=16),
    ],
    ids=["float", "split-float", "int4-int8emb", "split-int8", "split-int4", "int4-sym"],
)
@pytest.mark.parametrize("config", ["all_features", "untied"])
def test_written_initializers_match_the_plan_exactly(tiny_models, tmp_path: Path, config, options):
    model_dir, _ = tiny_models.get(config)
    result = export(tmp_path / "pkg", model_dir=model_dir, options=ExportOptions(**options))
    stored = stored_initializers(result.output / "model.onnx")
    planned = {t.name: t for t in result.plan.decoder.tensors()}
    for name, tensor in planned.items():
        assert name in stored, f"planned initializer {name} is not in the package"
        data_type, shape, nbytes, _ = stored[name]
        assert data_type == ir_dtype(tensor.dtype).value, name
        assert shape == tensor.shape, name
        assert nbytes == tensor.nbytes, name
    extra = {n: v for n, v in stored.items() if n not in planned}
    assert all(v[2] <= SMALL_CONSTANT_BYTES for v in extra.values()), extra
    external = sum(v[2] for v in stored.values() if v[3])
    assert (result.output / "model.onnx.data").stat().st_size == external
    # The plan's total is exactly what the package stores for its planned tensors.
    assert sum(stored[name][2] for name in planned) == result.plan.nbytes


@pytest.mark.parametrize(
    ("config", "options", "split"),
    [
        (
            "all_features",
            dict(ep="webgpu", dtype="fp32"),
            {"embed_tokens_per_layer.weight": 6, "embed_tokens.weight": 4},
        ),
        ("untied", dict(ep="webgpu", dtype="fp32"), {"lm_head.weight": 4}),
        (
            # The CPU EP: WebGPU refuses 4-bit tables of one block per row, which this makes.
            "all_features",
            dict(ep="webgpu", dtype="fp32", embedding_bits=8, weight_bits=4, block_size=16),
            {"embed_tokens.weight": 4},
        ),
    ],
    ids=["ple-and-embedding", "untied-head", "quantized-embedding"],
)
def test_split_graphs_give_the_same_logits(tiny_models, tmp_path: Path, config, options, split):
    model_dir, _ = tiny_models.get(config)
    whole = export(tmp_path / "whole", model_dir=model_dir, options=ExportOptions(**options))
    limit = 40_000 if not options.get("embedding_bits") else 5120
    pieces = export(
        tmp_path / "split",
        model_dir=model_dir,
        options=ExportOptions(**options, max_buffer_size=limit, force=True),
    )
    for name, count in split.items():
        assert not whole.plan.decoder.weight(name).is_split
        assert len(pieces.plan.decoder.weight(name).pieces) == count, name
    tokens_a, logits_a = ort_greedy(whole.output, PROMPT, 16)
    tokens_b, logits_b = ort_greedy(pieces.output, PROMPT, 16)
    assert tokens_a == tokens_b
    assert max(float(np.abs(a - b).max()) for a, b in zip(logits_a, logits_b, strict=True)) <= 1e-5
