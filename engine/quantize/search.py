"""Range search: block quantization with a lower reconstruction error than round-to-nearest.

Round-to-nearest spends the code range on each block's extremes, so one outlier coarsens the
grid for all the other values of its block. This method tries, per block:

1. a grid of clipped ranges: the block's ``[lo, hi]`` scaled by ``shrink_lo`` and ``shrink_hi``
   independently (an outlier on one side only clips that side), with the scale and zero
   point MLAS would derive from each range;
2. then a few alternating refinement steps: with the codes fixed, refit the block's affine
   map ``x ~ a * q + b`` by least squares, round ``-b / a`` to an integer zero point, refit the
   scale for it, and re-encode.

Each block keeps whichever candidate has the smallest squared error, measured with the scale
as stored (so float16 rounding counts). The unclipped range is one of the candidates and
every later step is kept only where it helps, so the error is never above round-to-nearest's.
The output format is exactly RTN's; codes come from the same :func:`~engine.quantize.rtn.encode`.
"""

from __future__ import annotations

import numpy as np

from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.layout import Chunk, as_float32, quantize_rows
from engine.quantize.rtn import encode_chunk, round_half_away, rtn_params, store_scales

__all__ = ["DEFAULT_SHRINKS", "quantize_search", "search_blocks"]

DEFAULT_SHRINKS = (1.0, 0.95, 0.9, 0.85, 0.8)
"""Fractions of each side of a block's range that the grid tries (both sides independently)."""

DEFAULT_REFINE_STEPS = 3
"""Least-squares refinement rounds after the grid (gains flatten out after about three)."""


def block_error(chunk: Chunk, scales: np.ndarray, zero_points: np.ndarray, bits: int) -> np.ndarray:
    """Squared reconstruction error ``[m]`` of each block of a chunk."""
    d = encode_chunk(chunk, scales, zero_points, bits)
    d -= chunk.spread(zero_points.astype(np.float32))
    d *= chunk.spread(as_float32(scales))
    d -= chunk.x
    return chunk.fold(np.einsum("ij,ij->j", d, d), np.add)


class _Best:
    """Per-block best (scale, zero point, error) so far."""

    def __init__(self, chunk: Chunk, scales: np.ndarray, zp: np.ndarray, bits: int) -> None:
        self.chunk, self.bits = chunk, bits
        self.scales, self.zp = scales, zp
        self.err = block_error(chunk, scales, zp, bits)

    def offer(self, scales: np.ndarray, zp: np.ndarray) -> None:
        err = block_error(self.chunk, scales, zp, self.bits)
        better = err < self.err
        self.err = np.where(better, err, self.err)
        self.scales = np.where(better, scales, self.scales)
        self.zp = np.where(better, zp, self.zp)


def _refit(
    chunk: Chunk, best: _Best, bits: int, symmetric: bool, scale_dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares scale (and zero point) for the codes of the current best."""
    x = chunk.x
    q = encode_chunk(chunk, best.scales, best.zp, bits)

    def dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return chunk.fold(np.einsum("ij,ij->j", a, b), np.add)

    if symmetric:
        z = best.zp.astype(np.float32)
    else:
        # Fit x ~ a * q + b, then take the integer zero point nearest to -b / a.
        n = np.float32(x.size // chunk.blocks)
        q_mean = chunk.fold(q.sum(axis=0), np.add) / n
        x_mean = chunk.fold(x.sum(axis=0), np.add) / n
        sqq = dot(q, q) - n * q_mean * q_mean
        sqx = dot(q, x) - n * q_mean * x_mean
        ok = (sqq > 0) & (sqx != 0)
        a = np.where(ok, sqx / np.where(ok, sqq, 1), 1)
        b = x_mean - a * q_mean
        kmax = np.float32(2**bits - 1)
        z = np.where(ok, round_half_away(np.clip(-b / a, 0, kmax)), best.zp.astype(np.float32))
    q -= chunk.spread(z)
    dd = dot(q, q)
    dx = dot(q, x)
    fallback = as_float32(best.scales)
    s = np.where(dd > 0, dx / np.where(dd > 0, dd, 1), fallback)
    return store_scales(s, scale_dtype), z.astype(np.uint8)


def search_blocks(
    chunk: Chunk,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    bits: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    shrinks: tuple[float, ...] = DEFAULT_SHRINKS,
    refine_steps: int = DEFAULT_REFINE_STEPS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Search each block's range; a :data:`~engine.quantize.layout.Kernel` for one chunk.

    Args:
        chunk: The chunk's blocks; ``chunk.x`` is overwritten with the codes.
        lo: Block minima ``[m]``.
        hi: Block maxima ``[m]``.
        bits: 4 or 8.
        symmetric: Symmetric quantization (the grid then scales the one range magnitude).
        scale_dtype: dtype the scales are stored in.
        shrinks: Range fractions to try; 1.0 (round-to-nearest) is always tried.
        refine_steps: Least-squares refinement rounds after the grid.

    Returns:
        ``(codes, scales, zero_points)``.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # A candidate that overflows gets an infinite or NaN error and is never kept.
        return _search(chunk, lo, hi, bits, symmetric, scale_dtype, shrinks, refine_steps)


def _search(
    chunk: Chunk,
    lo: np.ndarray,
    hi: np.ndarray,
    bits: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    shrinks: tuple[float, ...],
    refine_steps: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rtn = rtn_params(lo, hi, bits, symmetric, scale_dtype, chunk.first())
    best = _Best(chunk, *rtn, bits)
    if symmetric:
        for f in shrinks:
            if f != 1.0:
                best.offer(*rtn_params(lo * f, hi * f, bits, True, scale_dtype))
    else:
        for f_lo in shrinks:
            for f_hi in shrinks:
                if f_lo != 1.0 or f_hi != 1.0:
                    best.offer(*rtn_params(lo * f_lo, hi * f_hi, bits, False, scale_dtype))
    for _ in range(refine_steps):
        best.offer(*_refit(chunk, best, bits, symmetric, scale_dtype))
    codes = encode_chunk(chunk, best.scales, best.zp, bits, out=chunk.x, floor=False)
    return codes, best.scales, best.zp


def quantize_search(
    weight: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    name: str = "weight",
) -> QuantizedBlocks:
    """Block quantization with a per-block range search (lower error than round-to-nearest).

    Args:
        weight: Float array ``[rows, cols]``.
        bits: 4 or 8.
        block_size: Values per block; divides ``cols``.
        symmetric: Symmetric quantization.
        scale_dtype: dtype of the scales.
        name: The weight's name, for error messages.

    Returns:
        The packed blocks, in the same format as round-to-nearest's.
    """

    def kernel(
        chunk: Chunk, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return search_blocks(chunk, lo, hi, bits=bits, symmetric=symmetric, scale_dtype=scale_dtype)

    return quantize_rows(weight, bits, block_size, scale_dtype, kernel, name)
