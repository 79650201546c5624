"""Exported packages against transformers' own Gemma 4 forward, step by step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_gemma import hf_greedy, make_checkpoint
from tests.conftest import TINY_CONFIGS

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
DECODE_STEPS = 20  # prompt 12 + 20 steps = 32 positions, past every sliding window here


@pytest.mark.parametrize("attention", ["gqa", "standard"])
@pytest.mark.parametrize("config", sorted(TINY_CONFIGS))
def test_fp32_package_matches_transformers_every_step(
    tiny_models, tmp_path: Path, config: str, attention: str
):
    model_dir, model = tiny_models.get(config)
    out = tmp_path / "pkg"
    export(
        out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32", attention=attention)
    )

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)

    assert len(logits) == DECODE_STEPS + 1
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


def test_sliding_window_is_exercised(tiny_models):
    """Guard for the test above: the runs are longer than every tiny sliding window."""
    for name in TINY_CONFIGS:
        _, model = tiny_models.get(name)
        assert len(PROMPT) + DECODE_STEPS > model.config.sliding_window


@pytest.mark.parametrize("config", ["all_features", "k_eq_v", "mqa"])
def test_webgpu_lowering_matches_transformers_on_the_cpu_ep(
    tiny_models, tmp_path: Path, config: str
):
    """The WebGPU package (int32 I/O; K/V written into static buffers, attention explicit
    in fp32 over a sliding layer's window or a full layer's buffer with a position mask)
    computes the same model; run here on the CPU EP. ``mqa`` has one KV head on every
    layer: its scores are the Gemm with the rank-2 mask, sliding and full."""
    model_dir, model = tiny_models.get(config)
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=ExportOptions(ep="webgpu", dtype="fp32"))
    assert result.plan.uses_gqa and result.graph_capture

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    # fp32 rounding, amplified by this random model: its median step is within 8e-6. The
    # CPU EP's SkipSimplifiedLayerNormalization (every residual add fused into the next
    # norm) is within 1.0e-6 of a float64 norm where Add + RMSNormalization is within
    # 6.4e-7, which moved all_features' worst step from 8.8e-5 to 1.1e-4.
    assert max(diffs) <= 1.5e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


def test_webgpu_per_layer_tables_in_uneven_pieces_match_transformers(tiny_models, tmp_path: Path):
    """The per-layer table gathered two layers to a piece, the last piece one layer (the
    buffer limit holds two layers' tables), rows concatenated: the same model as
    transformers, run on the CPU EP."""
    model_dir, model = tiny_models.get("mqa")
    one_layer = 320 * 16 * 4  # the mqa table: 320 rows of 16 fp32 values per layer
    options = ExportOptions(ep="webgpu", dtype="fp32", max_buffer_size=2 * one_layer, force=True)
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=options)
    table = result.plan.decoder.weight("embed_tokens_per_layer.weight")
    assert [(p.stop - p.start) // 16 for p in table.pieces] == [2, 2, 1]

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1.5e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


@pytest.mark.parametrize(
    "options",
    [
        ExportOptions(ep="cpu", dtype="fp32"),
        ExportOptions(ep="webgpu", dtype="fp32"),
        ExportOptions(ep="cuda", dtype="fp32"),
    ],
    ids=["cpu", "webgpu", "cuda"],
)
def test_layer_scalars_far_from_one_and_negative_match_transformers(
    tmp_path: Path, options: ExportOptions
):
    """Each Gemma 4 layer's last residual add goes into the next norm (one
    SkipSimplifiedLayerNormalization) with the layer scalar ``s`` folded into that norm's
    epsilon as ``eps / s^2``; a scalar that is not positive keeps the plain Add, Mul and
    norm. Scalars of 0.002 (``eps / s^2`` = 0.25: a fold that forgot ``s``, or applied
    it the wrong way, changes every norm after it), 40, -0.5, 1 and 0.3."""
    import onnx
    import torch

    scalars = [0.002, 40.0, -0.5, 1.0, 0.3, 0.002]
    model_dir = tmp_path / "ckpt"
    model = make_checkpoint(model_dir, seed=3)
    assert model.config.num_hidden_layers == len(scalars)
    assert model.config.rms_norm_eps == pytest.approx(1e-6)
    with torch.no_grad():
        for layer, value in zip(model.model.layers, scalars, strict=True):
            layer.layer_scalar.fill_(value)
    model.save_pretrained(model_dir)
    out = tmp_path / "pkg"
    export(out, model_dir=model_dir, options=options)

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens

    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    zeros = {o for n in graph.node if n.op_type == "ConstantOfShape" for o in n.output}
    norms = [n for n in graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    skips = [n for n in norms if n.input[1] not in zeros]
    # One before each MLP and one per later layer's input norm, less the one after the
    # layer whose scalar is negative (the final norm keeps the last scalar's Mul).
    assert len(skips) == 2 * len(scalars) - 2
    # CUDA: each layer's three post norms (attention, MLP, per-layer input) and its per-head
    # norms (q, k and v, or q alone where the layer shares KV) take a zero skip.
    zero_skips = len(norms) - len(skips)
    assert zero_skips >= 4 * len(scalars) if options.ep == "cuda" else zero_skips == 0
    folded = sorted({round(a.f, 3) for n in skips for a in n.attribute if a.name == "epsilon"})
    assert folded[-1] == pytest.approx(0.25, rel=1e-3)
