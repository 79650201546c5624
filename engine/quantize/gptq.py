"""GPTQ: block quantization with error feedback from the layer's input statistics.

For a linear ``y = W x`` with calibration inputs ``X`` (``H = X^T X`` summed over tokens),
the columns of ``W`` are quantized one at a time; each column's rounding error is spread
over the columns not yet quantized, weighted by ``H^-1``, so that ``W X`` changes as little
as the codes allow (Frantar et al., 2022). In natural order each block of ``block_size``
columns takes its scale and zero point from the weights as updated when the block is
reached; in act order (what calibration uses: the inputs with the largest ``H`` diagonal
first) every block's are fixed up front from the original weights ("static groups"). Both
are MLAS' round-to-nearest parameters, so the result is ordinary MatMulNBits bytes: codes,
scales and zero points, dequantized as ``(q - zero_point) * scale`` like RTN's, no
``g_idx``. On the CPU trained reference (benchmarks/trained_reference.py, INT4 block 32,
weights and tied table) act order's mean KLD is 0.0024 against natural order's 0.0033 and
round to nearest's 0.0058. Once the codes are chosen each block's scale is refit to the
same objective (:func:`refit_scales`), which round to nearest's scales no longer minimise.

A token table that a tied LM head reads is calibrated as that head (its rows are the
head's outputs), with its own squared error added to the objective (the lookup reads the
same bytes): :data:`TABLE_LOOKUP`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engine.errors import OptionsError
from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.layout import as_float32
from engine.quantize.packing import pack
from engine.quantize.rtn import encode, reciprocal, rtn_params, store_scales

DAMPING = 0.01
"""The least added to H's diagonal, as a fraction of its mean: keeps H^-1 well
conditioned."""

DAMPING_RATIO = 1.0
"""Where the calibration text has few tokens per input column, the damping is this times
columns / tokens (at most :data:`MAX_DAMPING`): ``H`` is then measured on fewer tokens
than it has degrees of freedom to fit, and GPTQ fits the calibration text's own noise,
which damping pulls back toward round to nearest's codes (:func:`damping`)."""

MAX_DAMPING = 0.1
"""The most damping :func:`damping` gives."""


def damping(cols: int, tokens: int | None) -> float:
    """The damping of an input of ``cols`` columns measured on ``tokens`` calibration
    tokens (None: :data:`DAMPING`). On the trained references (benchmarks/
    trained_reference.py, INT4 block 32) a fixed damping that suits one size hurts the
    other: at the H200 size (512 / 1,536 columns, 16,384 tokens) GPTQ's mean KLD is 0.00387
    at 0.01 and 0.00352 at 0.05, at the CPU size (128 / 384 columns) 0.00202 at 0.01 and
    0.00211 at 0.05; with 4,096 tokens the CPU size prefers 0.05 too (0.00212 against
    0.00216) and columns / tokens there gives 0.00209; at the H200 size it gives 0.00363
    (0.48x round to nearest's; benchmarks/results/trained_reference-2026-12-03-h200-500-
    steps-gptq-damping.json). On a second model (--seed 1) it does not help: 0.00324
    against 0.00320 at 0.01 (the same JSON); it stays for the model sizes where few tokens
    per column make ``H`` noisy."""
    if not tokens:
        return DAMPING
    return min(MAX_DAMPING, max(DAMPING, DAMPING_RATIO * cols / tokens))


REFIT_STEPS = 1
"""Passes of the scale refit after the codes are chosen (:func:`refit_scales`; 0: none).
On the trained reference one pass lowers GPTQ's mean KLD from 0.00394 to 0.00387 at the
H200's size (awq-gptq 0.00389 to 0.00382; two passes 0.00386 / 0.00380) and from 0.00244
to 0.00238 at the CPU one, for about a quarter more export time then
(benchmarks/results/trained_reference-2026-12-03-h200-500-steps-gptq-scale-refit.json).
Each block's gradient from the other blocks is now one product with ``H``'s rows where a
whole gradient was kept up to date: the same scales, bit for bit, and 1.5x faster (2,048
rows of a 1,536-wide input: 0.41 -> 0.27 s on 2 cores; an 8-layer E2B-width GPTQ export
503 -> 472 s, the same bytes)."""

TABLE_LOOKUP = 0.1
"""The weight, as a fraction of H's mean diagonal, of a tied token table's own squared
error in its objective: the head's ``H`` measures only the logits, but the lookup reads
the same codes, and there every column counts alike. On the trained reference GPTQ's
mean KLD falls from 0.0024 to 0.0021 at the CPU size (0.03-0.1 alike, 0.3 and more
worse) and from 0.0040 to 0.0039 at the H200's (benchmarks/results/trained_reference-
2026-12-03-h200-500-steps-table-lookup-int8-b128.json); 0 is the head's objective alone."""


@dataclass(frozen=True)
class Feedback:
    """What GPTQ needs of one input's statistics, computed once for every linear (and every
    row chunk) that reads that input: the upper Cholesky factor of ``H^-1`` (the GPTQ
    paper's reformulation) and the inputs that were always zero.

    ``order``: the columns in the order they are quantized, None for their own order. Act
    order (the largest ``H`` diagonal first) quantizes the inputs that matter most while the
    most columns are left to take their error; ``factor`` is then ``H``'s in that order."""

    factor: np.ndarray
    dead: np.ndarray
    order: np.ndarray | None = None
    hessian: np.ndarray | None = None
    """``H`` as damped, in the columns' own order (float32): the scale refit's objective."""
    source: str = ""
    """The input it was measured on (for the export's summary)."""
    damping: float = DAMPING
    """What was added to ``H``'s diagonal, as a fraction of its mean (:func:`damping`; a
    table's lookup term apart)."""
    tokens: int | None = None
    """The calibration tokens ``H`` was summed over (None: not said)."""

    @classmethod
    def from_hessian(
        cls,
        hessian: np.ndarray,
        *,
        act_order: bool = False,
        lookup: float = 0.0,
        tokens: int | None = None,
        overwrite: bool = False,
    ) -> Feedback:
        """``hessian``: ``[cols, cols]`` sum of ``x x^T`` over the calibration inputs (any
        positive scale), ``tokens`` of them (:func:`damping`). ``lookup``: the weight of
        the weights' own squared error beside the output error, as a fraction of ``H``'s
        mean diagonal (:data:`TABLE_LOOKUP` for a table that is also looked up). Inputs
        wider than :data:`WIDE_INPUT` are factorised in float32 and get no scale refit.
        ``overwrite``: ``hessian`` may be changed and its memory reused (the caller keeps
        no other reference: a wide input's factorisation then holds two ``[K, K]``
        arrays at most, its own and the sum's)."""
        cols = hessian.shape[0]
        wide = cols > WIDE_INPUT
        dtype = np.float32 if wide else np.float64
        h: np.ndarray = (
            hessian if overwrite and hessian.dtype == dtype else np.array(hessian, dtype=dtype)
        )
        del hessian
        dead = np.diag(h) <= 0  # inputs that were always 0: nothing to preserve there
        h[dead, dead] = 1.0
        damped = damping(cols, tokens)
        h[np.diag_indices(cols)] += (damped + lookup) * float(np.mean(np.diag(h)))
        kept = h.astype(np.float32) if REFIT_STEPS and not wide else None
        order = np.argsort(-np.diag(h), kind="stable") if act_order else None
        backwards = (np.arange(cols) if order is None else order)[::-1]
        reversed_h = h[np.ix_(backwards, backwards)]  # J P H P J, contiguous
        del h
        factor = _upper_factor_of_inverse(reversed_h)
        return cls(factor, dead, order, kept, damping=damped, tokens=tokens)

    def stripped(self) -> Feedback:
        """This record without its arrays: what the export's summary reads (damping,
        tokens, source) and nothing that holds memory."""
        empty = np.zeros((0, 0), dtype=np.float32)
        return replace(self, factor=empty, dead=np.zeros(0, bool), order=None, hessian=None)


WIDE_INPUT = 4096
"""Inputs wider than this (Gemma 4 E2B's 6,144 and 12,288-wide MLP outputs) keep their
factor in float32, as GPTQ's reference implementation does, and no ``H`` for the scale
refit: in float64 a 12,288-wide input's statistics, factor and ``H`` take 3 GB."""


def _upper_factor_of_inverse(reversed_h: np.ndarray) -> np.ndarray:
    """The upper triangular ``U`` with ``U^T U = H^-1``, given ``J H J`` (``J`` the
    reversal; overwritten, and returned as ``U``): with ``chol(J H J) = L``,
    ``H^-1 = J L^-T L^-1 J``, so ``U = J L^-1 J`` (upper triangular). One Cholesky
    factorisation and one triangular inverse, both in place."""
    _cholesky_in_place(reversed_h)
    _invert_lower(reversed_h)
    _reverse_in_place(reversed_h)
    return reversed_h


_CHOLESKY_BLOCK = 512
"""Columns factorised at a time (left-looking: the rest are matrix products)."""


def _cholesky_in_place(a: np.ndarray) -> None:
    """``a`` (symmetric positive definite) becomes its lower Cholesky factor, zeros above
    the diagonal; block by block, so no second ``[K, K]`` array (``np.linalg.cholesky``
    copies its input, a 12,288-wide one's 600 MB)."""
    n = a.shape[0]
    for j in range(0, n, _CHOLESKY_BLOCK):
        e = min(j + _CHOLESKY_BLOCK, n)
        if j:
            a[j:e, j:e] -= a[j:e, :j] @ a[j:e, :j].T
        a[j:e, j:e] = np.linalg.cholesky(a[j:e, j:e])
        a[j:e, e:] = 0.0
        if e < n:
            if j:
                a[e:, j:e] -= a[e:, :j] @ a[j:e, :j].T
            a[e:, j:e] = a[e:, j:e] @ np.linalg.inv(a[j:e, j:e]).T


def _reverse_in_place(a: np.ndarray) -> None:
    """``a`` becomes ``a[::-1, ::-1]`` a row pair at a time."""
    n = a.shape[0]
    for i in range(n // 2):
        row = a[i, ::-1].copy()
        a[i] = a[n - 1 - i, ::-1]
        a[n - 1 - i] = row
    if n % 2:
        a[n // 2] = a[n // 2, ::-1].copy()


_INVERT_BLOCK = 256
"""Triangular inverses this small are one LAPACK inverse."""


def _invert_lower(lower: np.ndarray) -> None:
    """Invert a lower triangular matrix in place, by halves: ``[[A, 0], [B, C]]^-1`` is
    ``[[A^-1, 0], [-C^-1 B A^-1, C^-1]]`` (matrix products, so at BLAS speed)."""
    n = lower.shape[0]
    if n <= _INVERT_BLOCK:
        lower[...] = np.tril(np.linalg.inv(lower))
        return
    k = n // 2
    _invert_lower(lower[:k, :k])
    _invert_lower(lower[k:, k:])
    lower[k:, :k] = -(lower[k:, k:] @ lower[k:, :k]) @ lower[:k, :k]


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
    cols = weight.shape[1]
    factor = feedback.factor
    if factor.shape != (cols, cols):
        raise OptionsError(f"{name}: calibration statistics are {factor.shape}, need {cols}^2")
    # float64, or float32 with a wide input's float32 factor (GPTQ's reference precision)
    w = np.array(weight, dtype=np.promote_types(factor.dtype, np.float32))
    w[:, feedback.dead] = 0.0
    if feedback.order is not None:
        codes, scales, zero_points = _act_order(
            w, feedback, bits, block_size, symmetric, scale_dtype
        )
    else:
        codes, scales, zero_points = _natural(w, feedback, bits, block_size, symmetric, scale_dtype)
    if feedback.hessian is not None and REFIT_STEPS:
        scales = refit_scales(w, codes, scales, zero_points, feedback.hessian, block_size)
    return QuantizedBlocks(pack(codes, bits), scales, pack(zero_points, bits, pad=8))


def _natural(
    w: np.ndarray,
    feedback: Feedback,
    bits: int,
    block_size: int,
    symmetric: bool,
    scale_dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ in the columns' own order, each block's parameters from the weights as fed
    back when it is reached: ``(codes, scales, zero points)``."""
    rows, cols = w.shape
    factor = feedback.factor
    blocks = cols // block_size
    wt = np.ascontiguousarray(w.T)  # one input column per row: every access below contiguous
    codes = np.empty((cols, rows), dtype=np.uint8)
    scales = np.empty((rows, blocks), dtype=scale_dtype)
    zero_points = np.empty((rows, blocks), dtype=np.uint8)
    for b in range(blocks):
        first, last = b * block_size, (b + 1) * block_size
        block = wt[first:last].astype(np.float32)
        scale, zp = rtn_params(
            block.min(axis=0), block.max(axis=0), bits, symmetric, scale_dtype, block[0]
        )
        scales[:, b], zero_points[:, b] = scale, zp
        inv, zf, sf = reciprocal(scale), zp.astype(np.float32), as_float32(scale)
        errors = np.empty((block_size, rows), dtype=wt.dtype)
        for i in range(first, last):
            codes[i], errors[i - first] = _column(wt, i, first, errors, factor, inv, zf, sf, bits)
        wt[last:] -= factor[first:last, last:].T @ errors
    return codes.T, scales, zero_points


def _column(
    wt: np.ndarray,
    i: int,
    first: int,
    errors: np.ndarray,
    factor: np.ndarray,
    inv: np.ndarray,
    zf: np.ndarray,
    sf: np.ndarray,
    bits: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Quantize input column ``i`` (row ``i`` of the transposed weight ``wt``) with its
    block's reciprocal scales, zero points and scales (per output row), after the rounding
    errors of the batch's earlier columns (from ``first``; ``errors``' rows) are fed into
    it: ``(codes, error / factor[i, i])``, the error for the rest of ``wt``.

    The feedback within a batch is taken when a column is reached (one product of its
    factor entries with the earlier errors) rather than spread over the batch's later
    columns as each error is known: the same sums, but each column reads the errors once
    where the rank-1 updates wrote the whole rest of the batch per column: 65,536 rows x
    1,536 columns in act order (no refit) 16-21 s -> 7 s on 2 cores, the same bytes."""
    column = wt[i]
    if i > first:
        column = column - factor[first:i, i] @ errors[: i - first]
    q = encode(column.astype(np.float32), inv, zf, bits)
    error = (column - (q - zf) * sf) / factor[i, i]
    return q.astype(np.uint8), error


_LAZY = 128
"""Columns whose error feedback is applied together to the rest of their span (GPTQ's
lazy batch)."""
_SPAN = 1024
"""Columns whose errors reach the columns after them together: one product per span
instead of one pass over the whole weight per lazy batch: the same products in larger
pieces (682 rows of a 12,288-wide input: 6.7 s -> 3.4 s on this project's 2 cores)."""


def _act_order(
    w: np.ndarray,
    feedback: Feedback,
    bits: int,
    block_size: int,
    symmetric: bool,
    scale_dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ in act order with static groups: every block's scale and zero point come from
    the weights before any feedback (a block's columns are quantized at scattered times),
    then the columns are quantized in ``feedback.order``, each with its block's parameters:
    ``(codes, scales, zero points)``. The bytes keep MatMulNBits' plain layout (no
    ``g_idx``)."""
    assert feedback.order is not None
    rows, cols = w.shape
    blocks = cols // block_size
    grouped = w.astype(np.float32).reshape(rows, blocks, block_size)
    # Round to nearest's ranges: on the trained reference they beat the range search's here
    # (mean KLD 0.0024 vs 0.0026), which fits weights that feedback will still move.
    scales, zero_points = rtn_params(
        grouped.min(axis=2), grouped.max(axis=2), bits, symmetric, scale_dtype, grouped[:, :, 0]
    )
    # per block, each contiguous over the rows
    inv, zf, sf = (
        np.ascontiguousarray(a.T)
        for a in (reciprocal(scales), zero_points.astype(np.float32), as_float32(scales))
    )
    order, factor = feedback.order, feedback.factor
    block_of = order // block_size  # the block of each column, in quantization order
    wt = np.ascontiguousarray(w[:, order].T)  # input columns as rows, in quantization order
    codes = np.empty((cols, rows), dtype=np.uint8)  # in quantization order
    for top in range(0, cols, _SPAN):
        end = min(top + _SPAN, cols)
        span = np.empty((end - top, rows), dtype=w.dtype)  # the span's errors
        for first in range(top, end, _LAZY):
            last = min(first + _LAZY, end)
            errors = span[first - top : last - top]
            for i in range(first, last):
                b = block_of[i]
                codes[i], errors[i - first] = _column(
                    wt, i, first, errors, factor, inv[b], zf[b], sf[b], bits
                )
            wt[last:end] -= factor[first:last, last:end].T @ errors
        wt[end:] -= factor[top:end, end:].T @ span
    out = np.empty((rows, cols), dtype=np.uint8)
    out[:, order] = codes.T
    return out, scales, zero_points


_REFIT_ROWS = 2048
"""Rows refit at once (each row's objective is its own)."""


def refit_scales(
    weight: np.ndarray,
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray,
    hessian: np.ndarray,
    block_size: int,
) -> np.ndarray:
    """Each block's scale refit to GPTQ's own objective with the codes and zero points
    fixed: for a row's error ``e = w - (q - z) * s`` the output error ``e H e^T`` is
    quadratic in one block's ``s`` with the others held, so each block in turn takes its
    least-squares scale (as stored, so fp16 rounding counts) where that lowers the
    objective; :data:`REFIT_STEPS` passes. The codes came from feedback through ``H^-1``
    with round to nearest's scales, which are then no longer the best ones for them.
    (Moving a zero point by a step as well never lowered it on skewed test inputs.)"""
    rows = weight.shape[0]
    h = np.asarray(hessian, dtype=np.float64)
    out = scales.copy()
    for first in range(0, rows, _REFIT_ROWS):
        part = slice(first, min(first + _REFIT_ROWS, rows))
        out[part] = _refit_rows(
            weight[part], codes[part], out[part], zero_points[part], h, block_size
        )
    return out


def _refit_rows(
    w: np.ndarray,
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray,
    h: np.ndarray,
    block_size: int,
) -> np.ndarray:
    """:func:`refit_scales` of a few rows; ``scales`` is updated in place."""
    d = codes.astype(np.float64) - np.repeat(zero_points.astype(np.float64), block_size, axis=1)
    s = as_float32(scales).astype(np.float64)
    e = w - d * np.repeat(s, block_size, axis=1)
    for _ in range(REFIT_STEPS):
        for b in range(scales.shape[1]):
            cols = slice(b * block_size, (b + 1) * block_size)
            p = h[cols, cols]
            db, eb = d[:, cols], e[:, cols]
            # the other blocks' share of each row's gradient of e H e^T / 2 here (H is
            # symmetric: its rows' slice is contiguous); one product per block, where
            # keeping the whole gradient up to date took two passes over e and H
            rest = e @ h[cols].T - eb @ p
            dp = db @ p
            den = np.einsum("ij,ij->i", dp, db)
            num = np.einsum("ij,ij->i", dp, w[:, cols]) + np.einsum("ij,ij->i", db, rest)
            ok = den > 0
            fit = np.where(ok, num / np.where(ok, den, 1.0), s[:, b])
            stored = store_scales(np.where(fit > 0, fit, s[:, b]).astype(np.float32), scales.dtype)
            new_s = as_float32(stored).astype(np.float64)
            new_e = w[:, cols] - db * new_s[:, None]
            better = _objective(new_e, p, rest) < _objective(eb, p, rest)
            if not better.any():
                continue
            delta = np.where(better[:, None], new_e - eb, 0.0)
            e[:, cols] += delta
            s[:, b] = np.where(better, new_s, s[:, b])
            scales[:, b] = np.where(better, stored, scales[:, b])
    return scales


def _objective(e: np.ndarray, p: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Each row's output error as far as one block's error ``e`` changes it."""
    return np.einsum("ij,ij->i", e @ p, e) + 2 * np.einsum("ij,ij->i", e, rest)
