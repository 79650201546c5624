"""Logical weights: the tensors a model family needs, before dtype, quantization or splits.

The planner turns each :class:`LogicalWeight` into physical initializers; the weight
sources read or generate the data for them by ``source`` name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
class LogicalWeight:
    """One tensor of the model as the checkpoint (or a computation) provides it."""

    name: str
    """Name relative to the text decoder, e.g. ``layers.0.self_attn.q_proj.weight``."""
    shape: tuple[int, ...]
    """Shape in the checkpoint's layout (linear weights are [out, in])."""
    role: Role
    computed: bool = False
    """True for tensors the engine computes (RoPE caches) rather than reads."""
    scale: float | None = None
    """A constant the graph multiplies the looked-up rows by (scaled embeddings)."""
    source: str | None = None
    """The tensor's key in the checkpoint (None for computed tensors)."""
    fill: float | None = None
    """The constant an architecture-only (random-weights) package holds instead of random
    draws: 1 for layer scalars, -inf / inf for clip bounds."""
