"""The block quantizer on its own: API checks, packing, layout moves, error bounds, search."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine.errors import OptionsError, WeightsError
from engine.plan import quantized_shapes
from engine.quantize import (
    QuantizedBlocks,
    check_quantizable,
    dequantize,
    layout,
    quantize,
)
from engine.quantize.packing import pack, packed_width, unpack
from engine.quantize.search import search_blocks


def _rng(seed: int = 1234) -> np.random.Generator:
    return np.random.default_rng(seed)


def _codes(blocks: QuantizedBlocks, bits: int, block_size: int) -> tuple[np.ndarray, ...]:
    rows, width = blocks.qweight.shape
    cols = width * 8 // bits
    nb = cols // block_size
    q = unpack(blocks.qweight, bits, cols).reshape(rows, nb, block_size).astype(np.float64)
    zp = unpack(blocks.zero_points, bits, nb).astype(np.float64)
    return q, zp, blocks.scales.astype(np.float64)


def _block_sse(w: np.ndarray, blocks: QuantizedBlocks, bits: int, bs: int) -> np.ndarray:
    diff = dequantize(blocks, bits=bits, block_size=bs).astype(np.float64) - w
    return (diff.reshape(w.shape[0], -1, bs) ** 2).sum(axis=-1)


# ---------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("shape", "bits", "block_size", "needle"),
    [
        ((8, 64), 3, 32, "use 4 or 8 bits"),
        ((8, 64), 2, 32, "use 4 or 8 bits"),
        ((8, 96), 4, 48, "power of two from 16 to 256"),
        ((8, 1024), 4, 512, "power of two from 16 to 256"),
        ((8, 64), 4, 8, "power of two from 16 to 256"),
        ((8, 0), 8, 16, "no columns"),
        ((), 4, 32, "scalar"),
    ],
)
def test_check_quantizable_rejects_with_a_helpful_message(shape, bits, block_size, needle):
    with pytest.raises(OptionsError, match=r"^layer\.w") as info:
        check_quantizable("layer.w", shape, bits, block_size)
    assert needle in str(info.value)


def test_a_four_bit_table_needs_an_even_width_but_a_matmul_weight_does_not():
    with pytest.raises(OptionsError, match="odd number of columns") as info:
        check_quantizable("layer.w", (8, 33), 4, 16, "gbq")
    assert "--embedding-bits 8" in str(info.value)
    assert "--keep-float layer.w" in str(info.value)
    check_quantizable("layer.w", (8, 33), 4, 16, "matmulnbits")  # padded to 48
    check_quantizable("layer.w", (8, 33), 8, 16, "gbq")  # a partial last block


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bits", [4, 8])
def test_check_quantizable_accepts_fitting_shapes(bits, block_size):
    check_quantizable("w", (3, 512), bits, block_size)
    check_quantizable("w", (2, 3, block_size), bits, block_size)


def test_quantize_rejects_bad_input():
    with pytest.raises(OptionsError, match="2-D"):
        quantize(np.zeros(64, np.float32), bits=4, block_size=32)
    with pytest.raises(OptionsError, match="float weights"):
        quantize(np.zeros((2, 64), np.int32), bits=4, block_size=32)
    with pytest.raises(OptionsError, match="unknown quantization method 'gptq'"):
        quantize(np.zeros((2, 64), np.float32), bits=4, block_size=32, method="gptq")
    with pytest.raises(OptionsError, match="scales must be"):
        quantize(np.zeros((2, 64), np.float32), bits=4, block_size=32, scale_dtype=np.int8)
    with pytest.raises(OptionsError, match="block size 48"):
        quantize(np.zeros((2, 96), np.float32), bits=4, block_size=48)


@pytest.mark.parametrize("method", ["rtn", "search"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_non_finite_weights_are_refused(dtype, bad, method):
    w = _rng().standard_normal((4, 64)).astype(dtype)
    w[2, 17] = bad
    with pytest.raises(WeightsError, match=r"^layers\.0\.q_proj holds NaN or infinite values"):
        quantize(w, bits=4, block_size=32, method=method, name="layers.0.q_proj")


# ---------------------------------------------------------------------------- format


@pytest.mark.parametrize("storage", ["gbq", "matmulnbits"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize(("bits", "cols", "bs"), [(4, 96, 32), (4, 64, 32), (8, 96, 16)])
def test_shapes_match_the_plan(bits, cols, bs, symmetric, storage):
    blocks = quantize(
        _rng().standard_normal((5, cols)).astype(np.float16),
        bits=bits,
        block_size=bs,
        symmetric=symmetric,
        scale_dtype=np.float16,
    )
    want = quantized_shapes(5, cols, bits, bs, storage)
    assert blocks.qweight.reshape(want["qweight"]).shape == want["qweight"]
    assert blocks.scales.shape == want["scales"]
    assert blocks.zero_points.shape == want["zero_points"]
    assert blocks.qweight.dtype == blocks.zero_points.dtype == np.uint8
    assert blocks.scales.dtype == np.float16
    assert blocks.nbytes == sum(np.prod(s) * (2 if k == "scales" else 1) for k, s in want.items())


def test_four_bit_packing_puts_even_elements_in_the_low_nibble():
    assert pack(np.array([[1, 2, 15, 0]], np.uint8), 4).tolist() == [[0x21, 0x0F]]
    assert pack(np.array([[3, 4, 5]], np.uint8), 4, pad=8).tolist() == [[0x43, 0x85]]
    assert pack(np.array([[7, 200]], np.uint8), 8).tolist() == [[7, 200]]


@given(
    bits=st.sampled_from([4, 8]),
    rows=st.integers(1, 4),
    count=st.integers(1, 40),
    seed=st.integers(0, 2**31),
)
def test_pack_unpack_round_trip(bits, rows, count, seed):
    codes = np.random.default_rng(seed).integers(0, 2**bits, (rows, count)).astype(np.uint8)
    packed = pack(codes, bits, pad=8)
    assert packed.shape == (rows, packed_width(count, bits))
    np.testing.assert_array_equal(unpack(packed, bits, count), codes)
    if bits == 4 and count % 2:
        np.testing.assert_array_equal(packed[:, -1] >> 4, 8)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("bs", [16, 32, 256])
def test_pack_codes_from_block_major_layout_equals_row_packing(bits, group, bs):
    m = 9
    values = _rng().integers(0, 2**bits, (m, bs)) + _rng().uniform(0, 0.999, (m, bs))
    values = values.astype(np.float32)  # the packer truncates: integer parts are the codes
    grouped = values.reshape(m, bs // group, group).transpose(1, 0, 2).reshape(bs // group, -1)
    got = layout.pack_codes(np.ascontiguousarray(grouped), group, bits)
    np.testing.assert_array_equal(got, pack(values.astype(np.uint8), bits))


def test_half_to_float32_is_exact_for_every_finite_float16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = layout.half_to_float32(bits)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.all(np.abs(got[~finite]) >= 65536)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_other_weight_dtypes_quantize_like_their_float32_values(dtype):
    w = _rng().standard_normal((6, 128)).astype(dtype)
    for bits in (4, 8):
        got = quantize(w, bits=bits, block_size=32)
        want = quantize(w.astype(np.float32), bits=bits, block_size=32)
        for a, b in zip(
            (got.qweight, got.scales, got.zero_points),
            (want.qweight, want.scales, want.zero_points),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", ["rtn", "search"])
def test_chunks_and_threads_do_not_change_the_bytes(monkeypatch, method):
    w = _rng().standard_normal((37, 256)).astype(np.float32)
    whole = quantize(w, bits=4, block_size=32, method=method)
    monkeypatch.setattr(layout, "CHUNK_ELEMENTS", 3 * 256)  # 13 chunks, the last short
    for threads in (1, 4):
        monkeypatch.setattr(layout, "MAX_THREADS", threads)
        parts = quantize(w, bits=4, block_size=32, method=method)
        np.testing.assert_array_equal(parts.qweight, whole.qweight)
        np.testing.assert_array_equal(parts.scales, whole.scales)
        np.testing.assert_array_equal(parts.zero_points, whole.zero_points)


def test_dequantize_is_codes_minus_zero_point_times_scale():
    blocks = QuantizedBlocks(
        qweight=np.array([[0x21, 0xF0]], np.uint8),  # codes 1, 2, 0, 15
        scales=np.array([[0.5, 2.0]], np.float32),
        zero_points=np.array([[0x83]], np.uint8),  # zero points 3, 8
    )
    deq = dequantize(blocks, bits=4, block_size=2)
    np.testing.assert_array_equal(deq, [[-1.0, -0.5, -16.0, 14.0]])


def test_symmetric_zero_points_are_the_implicit_middle():
    w = _rng().standard_normal((3, 96)).astype(np.float32)
    assert np.all(quantize(w, bits=4, block_size=32, symmetric=True).zero_points == 0x88)
    assert np.all(quantize(w, bits=8, block_size=32, symmetric=True).zero_points == 128)
    search = quantize(w, bits=4, block_size=32, symmetric=True, method="search")
    assert np.all(search.zero_points == 0x88)


# ---------------------------------------------------------------------------- bounds

_weights = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 3), st.sampled_from([16, 32, 48, 64])),
    elements=st.floats(-1e4, 1e4, width=32, allow_nan=False),
)


@settings(max_examples=60, deadline=None)
@given(w=_weights, bits=st.sampled_from([4, 8]), symmetric=st.booleans())
def test_rtn_error_is_at_most_half_a_step_inside_the_clip_range(w, bits, symmetric):
    bs = 16
    blocks = quantize(w, bits=bits, block_size=bs, symmetric=symmetric)
    q, zp, s = _codes(blocks, bits, bs)
    wb = w.reshape(q.shape).astype(np.float64)
    deq = dequantize(blocks, bits=bits, block_size=bs).reshape(q.shape)
    err = np.abs(wb - deq)
    step = np.abs(s)[..., None]
    eps = 1e-5 * step + 1e-6 * np.abs(wb) + 1e-30
    kmax = 2**bits - 1
    ends = np.stack([(0 - zp) * s, (kmax - zp) * s])[..., None]
    inside = (wb >= ends.min(axis=0)) & (wb <= ends.max(axis=0))
    assert np.all(err[inside] <= step.repeat(bs, -1)[inside] / 2 + eps[inside])
    assert np.all(q <= kmax)
    if symmetric:
        # One end of the symmetric range is one step short: values beyond it clip.
        assert np.all(err <= step + eps)
    else:
        # The rounded zero point shifts the range by at most half a step, so even the
        # extremes of the block are within half a step of a code.
        assert np.all(err <= step / 2 + eps)


@settings(max_examples=40, deadline=None)
@given(w=_weights, bits=st.sampled_from([4, 8]), symmetric=st.booleans())
def test_search_is_never_worse_than_rtn_on_any_block(w, bits, symmetric):
    bs = 16
    rtn = quantize(w, bits=bits, block_size=bs, symmetric=symmetric)
    best = quantize(w, bits=bits, block_size=bs, symmetric=symmetric, method="search")
    w64 = w.astype(np.float64)
    rtn_sse = _block_sse(w64, rtn, bits, bs)
    assert np.all(_block_sse(w64, best, bits, bs) <= rtn_sse * (1 + 1e-4) + 1e-30)


# ---------------------------------------------------------------------------- search


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dist", ["normal", "student_t"])
def test_search_has_lower_mse_than_rtn(dist, bits, symmetric):
    shape = (64, 1024)
    # Student-t with 3 degrees of freedom: heavy tails, occasional large outliers.
    w = _rng().standard_normal(shape) if dist == "normal" else _rng().standard_t(3, shape)
    w = (w * 0.02).astype(np.float32)
    mse = {}
    for method in ("rtn", "search"):
        blocks = quantize(w, bits=bits, block_size=32, symmetric=symmetric, method=method)
        mse[method] = float(np.mean((dequantize(blocks, bits=bits, block_size=32) - w) ** 2))
    assert mse["search"] < 0.985 * mse["rtn"], mse


def test_search_with_only_the_full_range_and_no_refinement_is_rtn():
    w = _rng().standard_normal((8, 128)).astype(np.float16)
    dtype = np.dtype(np.float16)

    def kernel(chunk, lo, hi):
        return search_blocks(
            chunk,
            lo,
            hi,
            bits=4,
            symmetric=False,
            scale_dtype=dtype,
            shrinks=(1.0,),
            refine_steps=0,
        )

    got = layout.quantize_rows(w, 4, 32, dtype, kernel)
    want = quantize(w, bits=4, block_size=32, scale_dtype=np.float16)
    np.testing.assert_array_equal(got.qweight, want.qweight)
    np.testing.assert_array_equal(got.scales, want.scales)
    np.testing.assert_array_equal(got.zero_points, want.zero_points)


def test_scales_that_overflow_their_dtype_are_refused():
    w = np.full((2, 32), 1e6, np.float32)
    w[:, 0] = -1e6
    with pytest.raises(WeightsError, match="float16 scales"):
        quantize(w, bits=4, block_size=32, scale_dtype=np.float16)


def test_tiny_blocks_quantize_to_zero_rather_than_garbage():
    w = np.zeros((1, 32), np.float32)
    w[0, 3] = 1e-44  # scale 1e-45: its reciprocal overflows float32
    blocks = quantize(w, bits=4, block_size=32)
    assert np.all(dequantize(blocks, bits=4, block_size=32) == 0)


def test_importing_the_quantizer_loads_no_runtime_or_torch():
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, engine.quantize as q;"
        " q.quantize(np.ones((2, 32), np.float32), bits=4, block_size=32, method='search');"
        " print(sorted(m for m in ('onnxruntime', 'onnx', 'torch', 'PySide6') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
