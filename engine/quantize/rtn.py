"""Round-to-nearest block quantization, byte for byte as ONNX Runtime's MLAS does it.

ONNX Runtime's ``MatMulNBitsQuantizer`` (default algorithm) calls MLAS'
``BlockwiseQuantizer::quantizeAndTranspose`` (``onnxruntime/core/mlas/lib/q4_dq.cpp``). Per
block, in float32:

* asymmetric: ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)``,
  ``scale = (hi - lo) / (2**bits - 1)``, ``zero_point = roundf(-lo / scale)`` clamped to the
  code range (from the float32 scale, before it is stored in the scale dtype);
* symmetric: ``m`` = the max or the min, whichever has the larger magnitude (the min on a
  tie), ``scale = -m / 2**(bits - 1)``, zero point ``2**(bits - 1)``; the scale is negative
  when the largest magnitude is positive, which puts that value on code 0 and uses the
  whole code range;
* codes: ``clamp(roundf(x * (1 / s) + zero_point), 0, 2**bits - 1)`` where ``s`` is the
  scale as stored (rounded to float16 for float16 scales) and ``1 / 0`` is taken as 0.

``roundf`` rounds halves away from zero and numpy's ``rint`` to even, so codes are taken as
``floor(t + 0.49999997)``, which equals ``roundf(t)`` for every float32 ``0 <= t < 2**23``
(negative ``t`` clamp to 0 either way).
"""

from __future__ import annotations

import numpy as np

from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.layout import Chunk, as_float32, quantize_rows

__all__ = [
    "encode",
    "encode_chunk",
    "quantize_rtn",
    "reciprocal",
    "round_half_away",
    "rtn_params",
    "store_scales",
]

# The largest float32 below 0.5: adding it and flooring rounds halves away from zero.
_HALF_DOWN = np.float32(np.nextafter(np.float32(0.5), np.float32(0)))


def round_half_away(t: np.ndarray) -> np.ndarray:
    """``roundf`` of non-negative float32 values below 2**23 (negative ones go to <= 0)."""
    return np.floor(t + _HALF_DOWN)


def rtn_params(
    lo: np.ndarray,
    hi: np.ndarray,
    bits: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    first: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """MLAS' scale and zero point of blocks with range ``[lo, hi]``.

    Args:
        lo: float32 block minima.
        hi: float32 block maxima.
        bits: 4 or 8.
        symmetric: Symmetric quantization (zero point ``2**(bits - 1)``).
        scale_dtype: dtype the scales are stored in.
        first: float32 first value of each block; only used to give an all-zero block of a
            symmetric quantization the sign of zero MLAS gives its scale.

    Returns:
        ``(scales, zero_points)``: scales in ``scale_dtype`` and uint8 zero points, shaped
        like ``lo``.
    """
    kmax = np.float32(2**bits - 1)
    mid = 2 ** (bits - 1)
    if symmetric:
        m = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        if first is not None:
            # MLAS keeps the first of equal values, so an all-zero block's m carries the
            # sign of its first element; numpy's min/max may return either zero.
            m = np.where(m == 0, first, m)
        scale_f = -m / np.float32(mid)
        return store_scales(scale_f, scale_dtype), np.full(lo.shape, mid, dtype=np.uint8)
    lo = np.minimum(lo, np.float32(0))
    hi = np.maximum(hi, np.float32(0))
    # MLAS gives an all-zero block the scale +0. numpy does not say which of two equal
    # zeros min / max return, and (-0) - (+0) is -0; "+ 0" turns that into +0.
    scale_f = (hi - lo) / kmax + np.float32(0)
    safe = np.where(scale_f != 0, scale_f, np.float32(1))
    zp_fp = np.where(scale_f != 0, -(lo / safe), np.float32(0))
    zp = round_half_away(np.clip(zp_fp, np.float32(0), kmax)).astype(np.uint8)
    return store_scales(scale_f, scale_dtype), zp


def store_scales(scales: np.ndarray, scale_dtype: np.dtype) -> np.ndarray:
    """float32 scales rounded to the scale dtype; too large ones become inf (and are
    refused by the driver)."""
    with np.errstate(over="ignore"):
        return scales.astype(scale_dtype)


def reciprocal(scales: np.ndarray) -> np.ndarray:
    """float32 ``1 / scale`` of stored scales, 0 where the scale is 0 (as MLAS).

    Also 0 where ``1 / scale`` overflows (scales below about 3e-39, where MLAS' arithmetic
    turns into NaNs): such a block's values are all below 1e-37 and quantize to exactly 0.
    """
    s = as_float32(scales)
    out = np.zeros_like(s)
    with np.errstate(over="ignore"):
        np.divide(np.float32(1), s, out=out, where=s != 0)
    out[np.isinf(out)] = 0
    return out


def encode(
    x: np.ndarray,
    inv_scales: np.ndarray,
    zero_points: np.ndarray,
    bits: int,
    out: np.ndarray | None = None,
    floor: bool = True,
) -> np.ndarray:
    """Codes of values ``x`` ``[rows, n]`` for per-column reciprocal scales and zero points.

    Args:
        x: float32 values; column ``j`` is encoded with ``inv_scales[j]``, ``zero_points[j]``.
        inv_scales: float32 ``[n]``: :func:`reciprocal` of the scales as stored.
        zero_points: float32 ``[n]`` holding integers.
        bits: 4 or 8.
        out: float32 array shaped like ``x`` for the codes (may be ``x``).
        floor: False skips the last pass and returns values in ``[q, q + 1)`` for the codes
            ``q``, for a consumer that truncates anyway (the packer's cast to uint8).

    Returns:
        float32 codes ``clamp(roundf(x * inv_scale + zero_point), 0, 2**bits - 1)``, with
        MLAS' float32 arithmetic (multiply by the reciprocal, then add the zero point).
    """
    t = np.multiply(x, inv_scales, out=out)
    t += zero_points
    t += _HALF_DOWN
    # Clamp to [0, kmax + 0.5) first, so that floor, then clamp is just floor.
    np.clip(t, np.float32(0), np.float32(2**bits - 0.5), out=t)
    return np.floor(t, out=t) if floor else t


def encode_chunk(
    chunk: Chunk,
    scales: np.ndarray,
    zero_points: np.ndarray,
    bits: int,
    out: np.ndarray | None = None,
    floor: bool = True,
) -> np.ndarray:
    """Codes of a chunk's blocks for block scales (as stored) and zero points ``[m]``.

    Returns:
        float32 codes laid out like ``chunk.x`` (see :func:`encode`).
    """
    inv = chunk.spread(reciprocal(scales))
    zp = chunk.spread(zero_points.astype(np.float32))
    return encode(chunk.x, inv, zp, bits, out=out, floor=floor)


def quantize_rtn(
    weight: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    name: str = "weight",
) -> QuantizedBlocks:
    """Round-to-nearest block quantization of a 2-D weight along its last axis.

    Args:
        weight: Float array ``[rows, cols]``.
        bits: 4 or 8.
        block_size: Values per block; divides ``cols``.
        symmetric: Symmetric quantization.
        scale_dtype: dtype of the scales.
        name: The weight's name, for error messages.

    Returns:
        The packed blocks: for a float32 or float16 weight with scales of the same dtype,
        the bytes ONNX Runtime's ``MatMulNBitsQuantizer`` produces for ``weight.T`` as B.
    """

    def kernel(
        chunk: Chunk, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scales, zp = rtn_params(lo, hi, bits, symmetric, scale_dtype, chunk.first())
        codes = encode_chunk(chunk, scales, zp, bits, out=chunk.x, floor=False)
        return codes, scales, zp

    return quantize_rows(weight, bits, block_size, scale_dtype, kernel, name)
