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
from engine.quantize.layout import quantize_rows

__all__ = ["encode", "quantize_rtn", "reciprocal", "round_half_away", "rtn_params"]

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
        return scale_f.astype(scale_dtype), np.full(lo.shape, mid, dtype=np.uint8)
    lo = np.minimum(lo, np.float32(0))
    hi = np.maximum(hi, np.float32(0))
    # "+ 0" turns the -0 that (-0) - (+0) gives on an all-zero block into MLAS' +0.
    scale_f = (hi - lo) / kmax + np.float32(0)
    safe = np.where(scale_f != 0, scale_f, np.float32(1))
    zp_fp = np.where(scale_f != 0, -(lo / safe), np.float32(0))
    zp = round_half_away(np.clip(zp_fp, np.float32(0), kmax)).astype(np.uint8)
    return scale_f.astype(scale_dtype), zp


def reciprocal(scales: np.ndarray) -> np.ndarray:
    """float32 ``1 / scale`` of stored scales, 0 where the scale is 0 (as MLAS)."""
    s = scales.astype(np.float32)
    out = np.zeros_like(s)
    np.divide(np.float32(1), s, out=out, where=s != 0)
    return out


def encode(
    x: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray,
    bits: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Codes of block-major ``x`` ``[bs, m]`` for block scales and zero points ``[m]``.

    Args:
        x: float32 blocks, one per column.
        scales: Block scales (any float dtype; used as stored).
        zero_points: Block zero points (uint8, or float32 holding integers).
        bits: 4 or 8.
        out: float32 ``[bs, m]`` to write the codes to (may be ``x``).

    Returns:
        float32 codes ``clamp(roundf(x * (1 / scale) + zero_point), 0, 2**bits - 1)``, with
        MLAS' float32 arithmetic (multiply by the reciprocal, then add the zero point).
    """
    t = np.multiply(x, reciprocal(scales), out=out)
    t += zero_points.astype(np.float32)
    t += _HALF_DOWN
    # Clamp to [0, kmax + 0.5) first, so that floor, then clamp is just floor.
    np.clip(t, np.float32(0), np.float32(2**bits - 0.5), out=t)
    return np.floor(t, out=t)


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
        x: np.ndarray, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scales, zp = rtn_params(lo, hi, bits, symmetric, scale_dtype, x[0])
        return encode(x, scales, zp, bits, out=x), scales, zp

    return quantize_rows(weight, bits, block_size, scale_dtype, kernel, name)
