"""GPTQ: block quantization with error feedback from the layer's input statistics.

For a linear ``y = W x`` with calibration inputs ``X`` (``H = X^T X`` summed over tokens),
the columns of ``W`` are quantized one at a time; each column's rounding error is spread
over the columns not yet quantized, weighted by ``H^-1``, so that ``W X`` changes as little
as the codes allow (Frantar et al., 2022). Each block of ``block_size`` columns takes its
scale and zero point from the weights as updated when the block is reached (MLAS'
round-to-nearest parameters), so the result is ordinary MatMulNBits bytes: codes, scales
and zero points, dequantized as ``(q - zero_point) * scale`` like RTN's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import OptionsError
from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.layout import as_float32
from engine.quantize.packing import pack
from engine.quantize.rtn import encode, reciprocal, rtn_params

DAMPING = 0.01
"""Added to H's diagonal, as a fraction of its mean: keeps H^-1 well conditioned."""


@dataclass(frozen=True)
class Feedback:
    """What GPTQ needs of one input's statistics, computed once for every linear (and every
    row chunk) that reads that input: the upper Cholesky factor of ``H^-1`` (the GPTQ
    paper's reformulation) and the inputs that were always zero."""

    factor: np.ndarray
    dead: np.ndarray

    @classmethod
    def from_hessian(cls, hessian: np.ndarray) -> Feedback:
        """``hessian``: ``[cols, cols]`` sum of ``x x^T`` over the calibration inputs (any
        positive scale)."""
        h = np.array(hessian, dtype=np.float64)
        cols = h.shape[0]
        dead = np.diag(h) <= 0  # inputs that were always 0: nothing to preserve there
        h[dead, dead] = 1.0
        h[np.diag_indices(cols)] += DAMPING * float(np.mean(np.diag(h)))
        inverse = np.linalg.inv(np.linalg.cholesky(h))
        return cls(np.linalg.cholesky(inverse.T @ inverse).T, dead)


def gptq_quantize(
    weight: np.ndarray,
    feedback: Feedback,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    name: str = "weight",
) -> QuantizedBlocks:
    """Quantize ``weight`` ``[rows, cols]`` along ``cols`` with GPTQ.

    Args:
        weight: Float ``[rows, cols]``; ``block_size`` divides ``cols``.
        feedback: :class:`Feedback` of this linear's input.
        bits, block_size, symmetric, scale_dtype: As :func:`engine.quantize.quantize`.
        name: For messages.

    Returns:
        The packed :class:`QuantizedBlocks`.
    """
    rows, cols = weight.shape
    factor = feedback.factor
    if factor.shape != (cols, cols):
        raise OptionsError(f"{name}: calibration statistics are {factor.shape}, need {cols}^2")
    w = np.array(weight, dtype=np.float64)
    w[:, feedback.dead] = 0.0
    blocks = cols // block_size
    codes = np.empty((rows, cols), dtype=np.uint8)
    scales = np.empty((rows, blocks), dtype=scale_dtype)
    zero_points = np.empty((rows, blocks), dtype=np.uint8)
    for b in range(blocks):
        first, last = b * block_size, (b + 1) * block_size
        block = w[:, first:last].astype(np.float32)
        scale, zp = rtn_params(
            block.min(axis=1), block.max(axis=1), bits, symmetric, scale_dtype, block[:, 0]
        )
        scales[:, b], zero_points[:, b] = scale, zp
        inv, zf, sf = reciprocal(scale), zp.astype(np.float32), as_float32(scale)
        errors = np.empty((rows, block_size))
        for i in range(first, last):
            column = w[:, i].astype(np.float32)
            q = encode(column[:, None], inv[:, None], zf[:, None], bits)[:, 0]
            codes[:, i] = q.astype(np.uint8)
            error = (w[:, i] - (q - zf) * sf) / factor[i, i]
            w[:, i + 1 : last] -= np.outer(error, factor[i, i + 1 : last])
            errors[:, i - first] = error
        w[:, last:] -= errors @ factor[first:last, last:]
    return QuantizedBlocks(pack(codes, bits), scales, pack(zero_points, bits, pad=8))
