"""Exported packages against transformers' own Gemma 4 forward, step by step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_gemma import hf_greedy
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
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens
