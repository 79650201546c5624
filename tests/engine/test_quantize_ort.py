"""The block quantizer against ONNX Runtime: its quantizer's bytes and its kernels' results."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

from engine.quantize import QuantizedBlocks, dequantize, quantize
from engine.quantize.reference import (
    IR_VERSION,
    gather_block_quantized_model,
    matmul_nbits_model,
    ort_quantize,
    run_model,
)


@pytest.fixture(autouse=True)
def _quiet_ort_quantizer():
    logging.disable(logging.INFO)  # MatMulNBitsQuantizer logs every node it visits
    yield
    logging.disable(logging.NOTSET)


def _awkward_weight(rows: int, cols: int, bs: int, dtype: type, seed: int) -> np.ndarray:
    """Random rows plus the blocks where rounding details show: ties, zeros, one sign."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)) * rng.choice([1e-3, 1.0, 30.0], size=(rows, 1))
    w[0] = np.abs(w[0])  # all positive: symmetric scale is negative
    w[1] = -np.abs(w[1])  # all negative
    w[2] = 0.0  # all-zero blocks
    w[3, :bs] = w[3, 0]  # a constant block
    w[4] = rng.integers(-16, 16, cols) / 4  # exact halves: roundf ties
    w[5] = np.where(rng.random(cols) < 0.5, 0.0, -0.0)  # signed zeros
    w[6, :bs] = [rng.choice([-1.0, 1.0]) * 2.0] * bs  # max magnitude on both sides
    w[6, 1::2] *= -1
    return w.astype(dtype)


def _assert_same_bytes(ours: QuantizedBlocks, ref: QuantizedBlocks) -> None:
    for name in ("qweight", "scales", "zero_points"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert a.shape == b.shape, name
        assert a.dtype == b.dtype, name
        mismatch = np.flatnonzero(a.view(np.uint8) != b.view(np.uint8))
        assert mismatch.size == 0, f"{name}: {mismatch.size} bytes differ, first at {mismatch[:5]}"


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rtn_bytes_equal_onnxruntime_matmulnbits_quantizer(dtype, bits, symmetric, block_size):
    for seed, blocks_per_row in [(0, 3), (1, 2)]:  # odd and even block counts
        w = _awkward_weight(12, block_size * blocks_per_row, block_size, dtype, seed)
        ref = ort_quantize(w, bits=bits, block_size=block_size, symmetric=symmetric)
        ours = quantize(w, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=dtype)
        _assert_same_bytes(ours, ref)


@pytest.mark.parametrize("bits", [4, 8])
def test_rtn_bytes_equal_the_quantizer_on_a_larger_heavy_tailed_matrix(bits):
    w = (np.random.default_rng(3).standard_t(2, (256, 1024)) * 0.05).astype(np.float16)
    ref = ort_quantize(w, bits=bits, block_size=32, symmetric=False)
    _assert_same_bytes(quantize(w, bits=bits, block_size=32, scale_dtype=np.float16), ref)


_CASES = [
    (bits, symmetric, dtype, method)
    for bits in (4, 8)
    for symmetric in (False, True)
    for dtype in (np.float32, np.float16)
    for method in ("rtn", "search")
]


@pytest.mark.parametrize(("bits", "symmetric", "dtype", "method"), _CASES)
def test_gather_block_quantized_returns_exactly_the_dequantized_rows(
    bits, symmetric, dtype, method
):
    vocab, hidden, bs = 48, 96, 32  # 3 blocks a row: an odd count of packed zero points
    table = _awkward_weight(vocab, hidden, bs, np.float32, seed=5)
    blocks = quantize(
        table, bits=bits, block_size=bs, symmetric=symmetric, scale_dtype=dtype, method=method
    )
    ids = np.array([0, 4, 47, 4, 2, 5, 31], np.int64)
    model = gather_block_quantized_model(blocks, bits=bits, block_size=bs, num_ids=ids.size)
    assert model.ir_version == IR_VERSION
    got = run_model(model, {"ids": ids})
    want = dequantize(blocks, bits=bits, block_size=bs)[ids].astype(dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("bits", "symmetric", "dtype", "method"), _CASES)
def test_matmul_nbits_matches_x_times_dequantized_weight(bits, symmetric, dtype, method):
    n, k, bs = 40, 128, 32
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    blocks = quantize(
        w, bits=bits, block_size=bs, symmetric=symmetric, scale_dtype=dtype, method=method
    )
    x = rng.standard_normal((3, k)).astype(dtype)
    model = matmul_nbits_model(blocks, k=k, n=n, bits=bits, block_size=bs, batch=3)
    got = run_model(model, {"x": x}).astype(np.float64)
    deq = dequantize(blocks, bits=bits, block_size=bs).astype(np.float64)
    want = x.astype(np.float64) @ deq.T
    # float32: accumulation order only; float16: the output's own rounding (2**-11).
    tol = 2e-6 if dtype == np.float32 else 1e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    # Zero points off by a sixteenth of the code range would be far outside that tolerance.
    step = blocks.scales.astype(np.float64).repeat(bs, 1) * 2 ** (bits - 4)
    shifted = x.astype(np.float64) @ (deq + step).T
    assert np.abs(got - shifted).max() > 20 * tol * np.abs(want).max()


def test_one_op_models_are_saved_with_ir_10_and_opset_21(tmp_path):
    blocks = quantize(np.ones((4, 32), np.float32), bits=4, block_size=32)
    model = matmul_nbits_model(blocks, k=32, n=4, bits=4, block_size=32, batch=1)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    loaded = onnx.load(path)
    assert loaded.ir_version == 10
    assert {(o.domain, o.version) for o in loaded.opset_import} == {
        ("", 21),
        ("com.microsoft", 1),
    }


# ------------------------------------------------- widths that are not whole blocks


@pytest.mark.parametrize(("k", "block_size"), [(8, 32), (56, 32), (40, 16), (33, 16), (300, 256)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rtn_pads_k_like_the_onnxruntime_quantizer_byte_for_byte(
    dtype, bits, symmetric, k, block_size
):
    w = _awkward_weight(12, k, min(block_size, k), dtype, seed=k)
    ref = ort_quantize(w, bits=bits, block_size=block_size, symmetric=symmetric)
    ours = quantize(w, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=dtype)
    assert ours.qweight.shape == (12, -(-k // block_size) * block_size * bits // 8)
    _assert_same_bytes(ours, ref)


@pytest.mark.parametrize(("k", "block_size"), [(8, 32), (56, 32), (33, 16)])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("method", ["rtn", "search"])
def test_matmul_nbits_runs_a_padded_k_as_its_dequantized_weight(bits, method, k, block_size):
    n = 24
    rng = np.random.default_rng(k)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    blocks = quantize(w, bits=bits, block_size=block_size, method=method)
    x = rng.standard_normal((3, k)).astype(np.float32)
    model = matmul_nbits_model(blocks, k=k, n=n, bits=bits, block_size=block_size, batch=3)
    got = run_model(model, {"x": x}).astype(np.float64)
    deq = dequantize(blocks, bits=bits, block_size=block_size, cols=k).astype(np.float64)
    want = x.astype(np.float64) @ deq.T
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    # The padding holds code 0 (as ONNX Runtime's quantizer leaves it), which dequantizes to
    # -zero_point * scale, not 0: the kernel must be ignoring it for the product to match.
    padded = dequantize(blocks, bits=bits, block_size=block_size)
    assert padded.shape[1] > k and padded[:, k:].any()


@pytest.mark.parametrize(("d", "block_size"), [(8, 32), (56, 32), (40, 16), (34, 32)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_block_quantized_takes_a_partial_last_block(dtype, bits, symmetric, d, block_size):
    vocab = 20
    table = _awkward_weight(vocab, d, min(block_size, d), np.float32, seed=d)
    blocks = quantize(
        table, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=dtype
    )
    gather = QuantizedBlocks(blocks.gather_data(d, bits), blocks.scales, blocks.zero_points)
    assert gather.qweight.shape == (vocab, d * bits // 8)
    ids = np.array([0, 3, 19, 3, 7], np.int64)
    model = gather_block_quantized_model(gather, bits=bits, block_size=block_size, num_ids=ids.size)
    got = run_model(model, {"ids": ids})
    want = dequantize(gather, bits=bits, block_size=block_size)[ids].astype(dtype)
    assert want.shape == (ids.size, d)
    np.testing.assert_array_equal(got, want)
    # The same codes as the padded (MatMulNBits) layout, padding cut off.
    full = dequantize(blocks, bits=bits, block_size=block_size, cols=d)
    np.testing.assert_array_equal(dequantize(gather, bits=bits, block_size=block_size), full)
