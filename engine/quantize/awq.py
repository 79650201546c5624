"""AWQ: activation-aware scaling of a linear's input channels before block quantization.

For ``y = W x`` any per-input-channel ``s > 0`` gives ``y = (W diag(s)) (x / s)``. Scaling
up the columns that meet large activations gives their weights finer steps inside each
block, at the expense of the quiet columns, whose rounding matters less to ``y`` (Lin et
al., 2023). The weights stored are ``W diag(s)``, quantized like any others (plain
MatMulNBits bytes); the ``1 / s`` is folded into whatever makes ``x`` (the norm's gain
before q/k/v or gate/up, the up projection's rows before down:
:mod:`engine.activation_scaling`), so the package has no extra op.

The scales are ``s = a ** alpha`` (``a``: each channel's RMS over the calibration tokens,
normalised so that the largest and smallest ``s`` multiply to 1), with ``alpha`` from a grid
on ``[0, 1)``: the one whose round-to-nearest codes change ``W X`` least,
``||E X||^2 = tr(E H E^T)`` for ``E = W - Q(W diag s) diag(1 / s)`` and ``H = X^T X``.
``alpha = 0`` is round to nearest itself (``s = 1``), so the search never does worse than it
on the calibration text. Linears that read one input (q/k/v, gate/up) share one ``s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.quantize.blocks import dequantize

GRID = 20
"""``alpha`` values tried: ``0, 1/GRID, ..., (GRID - 1) / GRID``."""
RMS_FLOOR = 1e-3
"""Channel RMS below this fraction of the largest is treated as this fraction: the scales
then span at most ``1 / RMS_FLOOR``."""
SEARCH_ROWS = 512
"""Output rows (over all the linears of one input) the search scores each ``alpha`` on;
the loss is a sum over rows, so evenly spaced rows estimate it without bias."""


@dataclass(frozen=True)
class InputScales:
    """The search's result for one input: the scales, the ``alpha`` they come from and the
    loss of each ``alpha`` tried (``loss[0]``: round to nearest's)."""

    scales: np.ndarray
    alpha: float
    loss: tuple[float, ...]

    @property
    def gain(self) -> float:
        """Round to nearest's loss over the chosen one's (1: no better)."""
        best = min(self.loss)
        return self.loss[0] / best if best > 0 else 1.0


def search_scales(
    weights: Sequence[np.ndarray],
    hessian: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool,
    grid: int = GRID,
    rows: int = SEARCH_ROWS,
) -> InputScales:
    """The per-input-channel scales for the linears ``weights`` (each ``[out, in]``, one
    input) that read an input with statistics ``hessian`` (``[in, in]``, ``sum x x^T``).

    Round to nearest pads ``in`` to whole blocks as the package does. Returns float32
    scales ``[in]`` (1 for channels that were always zero, where nothing is measured)."""
    from engine.quantize import quantize

    h = np.asarray(hessian, dtype=np.float64)
    cols = h.shape[0]
    w = _sample_rows([np.asarray(x, dtype=np.float32) for x in weights], rows)
    if w.shape[1] != cols:
        raise ValueError(f"weights have {w.shape[1]} inputs, the statistics {cols}")
    rms = np.sqrt(np.maximum(np.diag(h), 0.0))
    live = rms > 0
    if live.any():  # near-dead channels would get extreme scales (and fp16 gains overflow)
        rms[live] = np.maximum(rms[live], RMS_FLOOR * rms.max())
    h32 = h.astype(np.float32)
    losses: list[float] = []
    best: tuple[float, float, np.ndarray] | None = None
    for step in range(grid):
        alpha = step / grid
        s = np.ones(cols, dtype=np.float64)
        if live.any():
            s[live] = rms[live] ** alpha
            s[live] /= np.sqrt(s[live].max() * s[live].min())
        s32 = s.astype(np.float32)
        blocks = quantize(
            w * s32, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=np.float32
        )
        error = w - dequantize(blocks, bits=bits, block_size=block_size, cols=cols) / s32
        loss = float(np.sum((error @ h32) * error))
        losses.append(loss)
        if best is None or loss < best[0]:
            best = (loss, alpha, s32)
    assert best is not None
    return InputScales(best[2], best[1], tuple(losses))


def _sample_rows(weights: list[np.ndarray], rows: int) -> np.ndarray:
    """Evenly spaced rows of the stacked weights, at most ``rows`` of them."""
    stacked = np.concatenate(weights, axis=0) if len(weights) > 1 else weights[0]
    if stacked.shape[0] <= rows:
        return stacked
    picked = np.linspace(0, stacked.shape[0] - 1, rows).round().astype(np.int64)
    return stacked[picked]
