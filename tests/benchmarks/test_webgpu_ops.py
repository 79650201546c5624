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
