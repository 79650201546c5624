"""The static-empty-KV rule family: textual ONNX -> apply -> count -> numerically equal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from engine.models import build_decoder
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset
from engine.rewrites import apply_rewrites
from engine.rewrites.static_empty_kv import rules
from engine.weights.factory import TensorFactory
from engine.weights.sources import RandomSource
from tests._support.ort_loop import ort_greedy

TEMPLATE = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[1, S, 8] x, int64[1, S] ids) => (float[1, S, 8] y, {out_type} empty) {{
    batch = Shape <start = 0, end = 1> (ids)
    tail = Constant <value = int64[2] {{{tail}}}> ()
    dims = Concat <axis = 0> (batch, tail)
    zeros = ConstantOfShape (dims)
    empty = {cast}
    y = Identity (x)
}}
"""


def model_text(cast: str, tail: str = "0, 8", out_type: str = "float[1, 0, 8]") -> str:
    return TEMPLATE.format(cast=cast, tail=tail, out_type=out_type)


def run(model: ir.Model) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = {"x": np.ones((1, 3, 8), np.float32), "ids": np.zeros((1, 3), np.int64)}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


@pytest.mark.parametrize(
    ("cast", "out_type", "dtype"),
    [
        ("Cast <to = 1> (zeros)", "float[1, 0, 8]", np.float32),
        ("Cast <to = 10> (zeros)", "float16[1, 0, 8]", np.float16),
        ("CastLike (zeros, x)", "float[1, 0, 8]", np.float32),
    ],
    ids=["cast-fp32", "cast-fp16", "castlike"],
)
def test_rule_replaces_the_dynamic_empty_tensor(cast: str, out_type: str, dtype):
    model = ir.from_onnx_text(model_text(cast, out_type=out_type))
    before = run(model)
    assert rules.apply_to_model(model) == 1
    ops = [node.op_type for node in model.graph]
    assert "Shape" not in ops and "ConstantOfShape" not in ops
    after = run(model)
    assert after["empty"].shape == before["empty"].shape == (1, 0, 8)
    assert after["empty"].dtype == dtype
    np.testing.assert_array_equal(after["y"], before["y"])


def test_bfloat16_goes_through_a_float32_constant_and_cast():
    model = ir.from_onnx_text(model_text("Cast <to = 16> (zeros)", out_type="bfloat16[1, 0, 8]"))
    assert rules.apply_to_model(model) == 1
    nodes = {node.op_type: node for node in model.graph}
    assert nodes["Cast"].attributes.get_int("to") == ir.DataType.BFLOAT16
    constant = nodes["Constant"].attributes["value"].as_tensor()
    assert constant.dtype == ir.DataType.FLOAT and list(constant.shape) == [1, 0, 8]
    onnx.checker.check_model(ir.to_proto(model))


@pytest.mark.parametrize(
    "text",
    [
        model_text("Cast <to = 1> (zeros)", tail="2, 8", out_type="float[1, 2, 8]"),
        model_text("Cast <to = 1> (zeros)").replace("<start = 0, end = 1>", "<start = 1, end = 2>"),
    ],
    ids=["not-empty", "not-the-batch-dim"],
)
def test_rule_leaves_other_tensors_alone(text: str):
    model = ir.from_onnx_text(text)
    assert rules.apply_to_model(model) == 0
    assert any(node.op_type == "ConstantOfShape" for node in model.graph)


@pytest.mark.parametrize("preset", ["gemma4-e2b", "gemma4-e4b"])
def test_webgpu_decoder_has_no_dynamic_shape_ops(preset: str):
    export_plan = plan(
        load_preset(preset), ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4)
    )
    model = build_decoder(export_plan)
    apply_rewrites(model, export_plan.caps)
    ops = [node.op_type for node in model.graph]
    for op in ("Shape", "ConstantOfShape", "Slice", "Squeeze"):
        assert ops.count(op) == 0, op


@pytest.mark.parametrize(("ep", "preset"), [("cpu", "gemma4-tiny"), ("cuda", "gemma4-e2b")])
def test_other_eps_slice_the_empty_kv_from_the_query(ep: str, preset: str):
    """Without the rewrite (any batch) the KV-shared layers' empty key and value are no rows
    of the query, one Slice on the device: no Shape -> Concat -> ConstantOfShape, whose
    Concat the CUDA EP put on the host (E2B's decoder on the H200: 2 Concat nodes on the
    CPU EP). What is left on the host is GroupQueryAttention's total_sequence_length. (CUDA's
    norms skip by zeros: a ConstantOfShape of a Shape, no Concat.)"""
    options = ExportOptions(ep=ep, weight_bits=4, embedding_bits=4, modalities=("text",))
    export_plan = plan(load_preset(preset), options)
    model = build_decoder(export_plan)
    assert apply_rewrites(model, export_plan.caps) == {}
    ops = [node.op_type for node in model.graph]
    assert "Concat" not in ops
    zeros = [node for node in model.graph if node.op_type == "ConstantOfShape"]
    # CUDA: the hidden rows' and each head shape's of the 256-wide GQA layers (q, k and v
    # of an owner, q alone of a sharer); the 512-wide layers norm their heads in fp32 for
    # their explicit attention (caps.gqa_max_head_dim)
    assert len(zeros) == (3 if ep == "cuda" else 0)
    assert all(node.inputs[0].producer().op_type == "Shape" for node in zeros)
    shared = [
        node
        for node in model.graph
        if node.op_type == "GroupQueryAttention"
        and node.inputs[1] is not None
        and node.inputs[1].producer() is not None
        and node.inputs[1].producer().op_type == "Slice"
    ]
    assert shared, "no KV-shared layer takes the sliced empty key"
    for node in shared:
        assert node.inputs[1] is node.inputs[2]  # key and value: the same empty tensor
        assert node.inputs[1].producer().inputs[0] is not None


def save(model: ir.Model, folder: Path) -> Path:
    folder.mkdir()
    ir.save(model, folder / "model.onnx", external_data="model.onnx.data")
    return folder


def test_every_form_of_the_empty_kv_gives_identical_outputs_on_cpu(tmp_path: Path):
    """A GQA graph with KV-shared layers, its empty keys built three ways: dynamically
    (Shape -> ConstantOfShape, as for an EP whose capture needs a static graph, before the
    rule family), after the rules (a constant), and sliced from the query (the other EPs):
    bit-identical logits over a prefill and 16 decode steps (batch 1)."""
    cpu_plan = plan(load_preset("gemma4-tiny"), ExportOptions(ep="cpu"))
    static_caps = replace(cpu_plan.caps, capture_needs_static_graph=True)
    export_plan = replace(cpu_plan, caps=static_caps)
    plain = build_decoder(export_plan, TensorFactory(export_plan, RandomSource(3)))
    rewritten = build_decoder(export_plan, TensorFactory(export_plan, RandomSource(3)))
    sliced = build_decoder(cpu_plan, TensorFactory(cpu_plan, RandomSource(3)))
    assert any(node.op_type == "ConstantOfShape" for node in plain.graph)
    assert rules.apply_to_model(rewritten) == 2  # one empty K/V per KV width (16*2, 32*2)
    assert not any(node.op_type == "ConstantOfShape" for node in rewritten.graph)
    assert not any(node.op_type == "ConstantOfShape" for node in sliced.graph)
    prompt = [3, 9, 27, 81, 243, 17, 51, 153, 459, 353]
    runs = [
        ort_greedy(save(model, tmp_path / name), prompt, 16)
        for name, model in (("plain", plain), ("rewritten", rewritten), ("sliced", sliced))
    ]
    tokens, logits = runs[0]
    for other_tokens, other_logits in runs[1:]:
        assert other_tokens == tokens
        for x, y in zip(logits, other_logits, strict=True):
            np.testing.assert_array_equal(x, y)
