"""Logical weights: the tensors a model family needs, before dtype, quantization or splits.

The planner turns each :class:`LogicalWeight` into physical initializers; the weight
sources read or generate the data for them by ``source`` name. A fused weight (Q/K/V as
one projection, gate/up as one, per-head norm scales as one table) has ``parts``: it is
their concatenation along axis 0, and the sources read it part by part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from engine.spec import RopeSpec

Role = Literal[
    "linear",
    "router",
    "experts",
    "embedding",
    "ple_table",
    "lm_head",
    "norm",
    "scale",
    "scalar",
    "rope_cache",
    "bias",
    "clip",
    "table",
    "conv",
]


@dataclass(frozen=True)
class RopeTable:
    """What a computed RoPE cache holds: the cos or sin of ``position * inv_freq`` for one
    rotary embedding at one head size, row ``p`` for position ``p`` (float32, as
    transformers computes the angles). A computed weight carries it as its source, so the
    writer makes the rows from it, never from the weight's name."""

    rope: RopeSpec
    head_dim: int
    part: Literal["cos", "sin"]
    long_from: int | None = None
    """longrope over a cache that outgrows the original length: rows from ``long_from``
    on hold the positions 0, 1, ... again with ``long_factor``'s frequencies (the graph
    offsets its row ids by ``long_from`` once the sequence is long). None: one set."""

    def rows(self, start: int, stop: int, cols: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)``, computed alone with the same float32 arithmetic as
        :meth:`RopeSpec.cos_sin`; ``cols``: only the leading frequency pairs (a cache that
        keeps just the rotated ones)."""
        if self.long_from is not None and start < self.long_from < stop:
            return np.concatenate(
                [self.rows(start, self.long_from, cols), self.rows(self.long_from, stop, cols)]
            )
        long = self.long_from is not None and start >= self.long_from
        first = start - self.long_from if long and self.long_from is not None else start
        inv = self.rope.inv_freq(self.head_dim, long=long).astype(np.float32)[:cols]
        positions = np.arange(first, first + stop - start, dtype=np.float32)
        angles = positions[:, None] * inv[None, :]
        table = (np.cos(angles) if self.part == "cos" else np.sin(angles)).astype(np.float32)
        return self.rope.scaled(table, self.head_dim)


@dataclass(frozen=True)
class RowOrder:
    """Rows of a checkpoint tensor taken in another order along axis 0: in each block of
    ``period`` rows below ``limit``, row ``j`` is the checkpoint's row ``order[j]`` of that
    block; rows from ``limit`` on are as stored. Partial RoPE heads use it to move their
    channels into the graphs' rotate_half layout (:meth:`RopeSpec.channel_order`)."""

    period: int
    limit: int
    order: tuple[int, ...]

    def source_rows(self, first: int, last: int) -> np.ndarray:
        """The checkpoint's rows, in order, that rows ``[first, last)`` are made of."""
        rows = np.arange(first, last)
        inside = rows < self.limit
        block, within = np.divmod(rows[inside], self.period)
        rows[inside] = block * self.period + np.asarray(self.order)[within]
        return rows


@dataclass(frozen=True)
class LogicalWeight:
    """One tensor of the model as the checkpoint (or a computation) provides it."""

    name: str
    """Name relative to the text decoder, e.g. ``layers.0.self_attn.q_proj.weight``."""
    shape: tuple[int, ...]
    """Shape in the checkpoint's layout (linear weights are [out, in])."""
    role: Role
    computed: RopeTable | None = None
    """How the engine computes this tensor (a RoPE cache) instead of reading it."""
    scale: float | None = None
    """A constant the graph multiplies the looked-up rows by (scaled embeddings)."""
    source: str | None = None
    """The tensor's key in the checkpoint (None for computed tensors)."""
    fill: float | None = None
    """The constant an architecture-only (random-weights) package holds instead of random
    draws: 1 for layer scalars, -inf / inf for clip bounds. A part with a fill and no
    source holds that constant in every package (the scale-free value norm's ones)."""
    parts: tuple[LogicalWeight, ...] = ()
    """A fused weight's pieces along axis 0, in order; empty for an ordinary weight."""
    repeat: int = 1
    """As a part: how many copies of it are stacked. A part one rank below the fused
    weight (a norm scale [D] in a [heads, D] table) is one row per copy."""
    dtype: str | None = None
    """A float dtype this tensor keeps whatever the package's (fp32 RoPE caches and norm
    scales of an fp32 attention core); None = the package's activation dtype."""
    offset: float = 0.0
    """A constant added, in float32, to the checkpoint's values as they are read: Gemma 3
    stores its norm scales as ``w`` and multiplies by ``1 + w``. Random weights are drawn
    as the scales themselves and take no offset."""
    row_order: RowOrder | None = None
    """The checkpoint's rows in the order the graph wants them (partial RoPE's q/k
    projections); None: as stored. Random weights are drawn in the graph's order."""

    def part_rows(self, fused_rank: int) -> int:
        """Rows this part contributes to a fused weight of rank ``fused_rank``."""
        base = self.shape[0] if len(self.shape) == fused_rank else 1
        return base * self.repeat

    @property
    def sources(self) -> tuple[str, ...]:
        """Every checkpoint key this weight reads (its parts' for a fused weight)."""
        if self.parts:
            return tuple(p.source for p in self.parts if p.source is not None)
        return (self.source,) if self.source is not None else ()
