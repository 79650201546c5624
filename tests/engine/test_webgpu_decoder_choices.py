"""Decoder choices made for WebGPU's per-kernel costs: split-K float linears (which linears
are split, into how many slices, and that the split graph computes ``x @ W``: onnxruntime
on the CPU against numpy).

End to end, split linears are checked on lavapipe against transformers by
tests/engine/test_webgpu_head_sizes.py (fp32 within 2e-3; there only o_proj, K = 1024 /
2048, is deep enough to split), and the one-KV-head scores Gemm by the ``mqa`` cases of
tests/engine/test_parity.py and tests/engine/test_webgpu.py."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import onnxscript
import pytest

from engine.caps import get_caps
from engine.graph import components
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.plan import SPLIT_K_MIN_DEPTH, SPLIT_K_MIN_SLICE, plan, split_k_groups
from engine.presets import load_preset


@pytest.mark.parametrize(
    ("ep", "dtype", "k", "groups"),
    [
        ("webgpu", "fp16", 1536, 4),
        ("webgpu", "fp16", 12288, 4),
        ("webgpu", "fp32", 1536, 16),
        ("webgpu", "fp32", 1152, 16),
        ("webgpu", "fp32", 1025, 1),  # odd: no power of two divides it
        ("webgpu", "fp16", 1030, 2),  # 2 x 515: 4 does not divide it, 2 does
        ("webgpu", "fp16", 512, 1),  # too shallow to gain
        ("webgpu", "fp32", 256, 1),
        ("webgpu", "bf16", 1536, 1),  # no entry for the dtype
        ("cpu", "fp32", 1536, 1),
        ("cuda", "fp16", 1536, 1),
    ],
)
def test_groups_follow_the_ep_dtype_and_depth(ep: str, dtype: str, k: int, groups: int) -> None:
    got = split_k_groups(get_caps(ep).split_k.get(dtype, 1), k)
    assert got == groups
    assert got == 1 or (k % got == 0 and k // got >= SPLIT_K_MIN_SLICE and k >= SPLIT_K_MIN_DEPTH)


def test_only_the_decoders_float_linears_are_split() -> None:
    """Planned as [G, 1, K / G, N] in the decoder; the towers' linears stay [K, N]."""
    spec = load_preset("gemma4-e2b")
    planned = plan(spec, ExportOptions(ep="webgpu", modalities=("text", "vision", "audio")))
    shapes = {
        session.name: {
            w.name: w.pieces[0].tensors[0].shape for w in session.weights if w.storage == "float_t"
        }
        for session in planned.sessions
    }
    assert shapes["decoder"]["layers.0.mlp.down_proj.weight"] == (4, 1, 1536, 1536)
    assert shapes["decoder"]["layers.0.per_layer_projection.weight"] == (256, 1536)
    for session in ("vision", "speech"):
        assert shapes[session], session
        assert all(len(shape) == 2 for shape in shapes[session].values()), session


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (2, 3)])
def test_split_graph_computes_x_at_w(shape: tuple[int, int]) -> None:
    import onnxruntime as ort

    k, n, groups = 256, 48, 4
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)  # stored [G, 1, K / G, N]
    x = rng.standard_normal((*shape, k)).astype(np.float32)
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 23}, name="split_k")
    builder = onnxscript.GraphBuilder(graph)
    ctx = SimpleNamespace(
        op=builder.op,
        ints=lambda values: builder.initializer(
            ir.tensor(np.array(values, np.int64)), name=f"ints_{len(graph.initializers)}"
        ),
    )
    x_in = builder.input("x", ir.DataType.FLOAT, ["b", "s", k])
    weight = builder.initializer(ir.tensor(w.reshape(groups, 1, k // groups, n)), name="w")
    y = components._split_k_matmul(ctx, x_in, weight, groups, k // groups)  # type: ignore[arg-type]
    y.name = "y"
    graph.outputs.append(y)
    model = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-4)


def test_e2b_fp16_decoder_splits_every_deep_float_linear() -> None:
    """E2B fp16 on WebGPU: q/k/v, o, gate/up, down and the per-layer input gate of every
    layer are split (K >= 1536), the per-layer projection (K = 256) is not; INT4 weights
    are never split."""
    spec = load_preset("gemma4-e2b")
    fp16 = Counter(n.op_type for n in build_decoder(plan(spec, ExportOptions(ep="webgpu"))).graph)
    layers = spec.num_layers
    int4 = Counter(
        n.op_type
        for n in build_decoder(
            plan(spec, ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4))
        ).graph
    )
    # qkv (or q), o, gate_up, down, the per-layer input gate; the LM head is the float
    # table's own MatMul.
    split = fp16["ReduceSum"] - int4["ReduceSum"]
    assert split == 5 * layers, fp16
    assert fp16["MatMul"] >= split + layers  # per-layer projections stay one MatMul
    assert fp16["Transpose"] >= split
    assert int4["MatMulNBits"] >= 6 * layers
    assert int4["ReduceSum"] < 6, int4  # only the position arithmetic's


def test_plan_report_names_the_split() -> None:
    from engine.plan_report import render_plan

    spec = load_preset("gemma4-e2b")
    webgpu = plan(spec, ExportOptions(ep="webgpu", modalities=("text",)))
    down = next(w for w in webgpu.sessions[0].weights if w.name.endswith("15.mlp.down_proj.weight"))
    assert down.k_slices == 4
    assert "layers.15.mlp.gate_up_proj.weight" in render_plan(webgpu)
    assert "K in 4 slices (split-K MatMul)" in render_plan(webgpu)
    cpu = plan(spec, ExportOptions(ep="cpu", modalities=("text",)))
    assert all(w.k_slices == 1 for s in cpu.sessions for w in s.weights)
    assert "split-K" not in render_plan(cpu)
