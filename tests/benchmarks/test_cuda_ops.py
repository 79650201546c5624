"""cuda_ops.py's split-K form is the same product as one MatMulNBits (on the CPU EP), its
attention forms the same step (P @ V in fp16 within its rounding), and every form it times
builds a graph that runs: a form that computed something else, or did not run, would
mislead the comparison made on the GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

import cuda_ops as ops  # noqa: E402


def test_split_k_rows_compute_one_matmulnbits():
    assert ops.check_splitk() < 2e-3  # fp16 partial sums; a wrong block order gives ~1


@pytest.mark.parametrize("form", ops.PAIR_FORMS)
def test_pair_forms_run(form: str):
    import onnxruntime as ort

    model = ops._model(ops.pair(form, 2048), 1, [1, 1, ops.HIDDEN], ops.F16, seed=1)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 1, ops.HIDDEN)).astype(np.float16)
    y = session.run(None, {"x": x})[0]
    assert y.shape == (1, 1, ops.HIDDEN) and np.isfinite(y).all()


@pytest.mark.parametrize("form", ["fp16t", "fp16g"])
def test_transposed_fp16_forms_compute_the_plain_matmul(form: str):
    """FusedMatMul(transB) and Gemm(transB) over W^T give MatMul over W (same draws)."""
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, 1, ops.HIDDEN)).astype(np.float16)

    def run(name: str) -> np.ndarray:
        model = ops._model(ops.pair(name, 2048), 1, [1, 1, ops.HIDDEN], ops.F16, seed=1)
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0].astype(np.float32)

    plain = run("fp16")
    np.testing.assert_allclose(run(form), plain, rtol=0, atol=2e-2 * np.abs(plain).max())


@pytest.mark.parametrize("model", sorted(ops.ATTENTION))
def test_attention_forms_compute_the_same_step(model: str):
    """The full layers' explicit decode step with K transposed in memory (MatMul) and with
    K as stored (FusedMatMul transB=1): the same scores, softmax and P @ V (same draws); P @ V
    in fp16, batched or per KV head, within fp16's rounding."""
    import onnxruntime as ort

    kv, group = ops.ATTENTION[model]
    x = np.random.default_rng(0).standard_normal((1, kv, group, 512)).astype(np.float32)

    def run(form: str) -> np.ndarray:
        graph = ops._model(ops.attention(form, kv, group, 96), 2, list(x.shape), 1, seed=2)
        session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    plain = run("kt")
    assert plain.shape == x.shape and np.isfinite(plain).all()
    np.testing.assert_allclose(run("transb"), plain, rtol=0, atol=1e-5 * np.abs(plain).max())
    half = run("pv16")  # P and V rounded to fp16: the same step within their rounding
    np.testing.assert_allclose(half, plain, rtol=0, atol=3e-3 * np.abs(plain).max())
    if kv > 1:  # per KV head: the same products (the CPU's fp16 GEMM sums in its own order)
        split = run("pv16x")
        np.testing.assert_allclose(split, half, rtol=0, atol=1e-3 * np.abs(half).max())
