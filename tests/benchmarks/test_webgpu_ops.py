"""The attention blocks webgpu_ops.py times against each other compute the same thing (on
the CPU EP): a faster variant that computed something else would mislead."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

import webgpu_ops as ops  # noqa: E402

VARIANTS = ["gemm_pv", "matmul_t", "gemm_splitpv4", "gemm_bcastpv4", "gemm_chunkpv4", "gemm_headpv"]


@pytest.mark.parametrize("length", [64, 96])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_variants_compute_what_one_matmul_does(variant: str, length: int):
    import onnxruntime as ort

    q = np.random.default_rng(0).standard_normal((1, 1, 8, 16)).astype(np.float32)

    def run(name: str) -> np.ndarray:
        model = ops._model(ops.attention(name, 8, length, 16), 2, [1, 1, 8, 16], ops.F32, seed=3)
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": q})[0]

    np.testing.assert_allclose(run(variant), run("gemm"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 4097])
@pytest.mark.parametrize("variant", ["cumsum", "conv16", "conv64", "conv256"])
def test_position_variants_count_every_slot(variant: str, length: int):
    """0..L-1 whatever the buffer holds (NaN, inf), also across a tower level's edge."""
    import onnxruntime as ort

    row = np.random.default_rng(1).standard_normal((1, length)).astype(np.float32)
    row[0, :: max(1, length // 3)] = np.nan
    row[0, -1] = np.inf
    model = ops._model(ops.positions(variant), 1, [1, length], ops.F32, seed=0)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": row})[0][0], np.arange(length))
