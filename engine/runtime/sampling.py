"""Choosing the next token from logits: greedy, or seeded temperature / top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import OptionsError


@dataclass(frozen=True)
class Sampler:
    """How the next token is chosen. ``temperature == 0`` is greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    """Keep the k most likely tokens (0 = all)."""
    top_p: float = 1.0
    """Keep the smallest set whose probability reaches top_p (1.0 = all)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise OptionsError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise OptionsError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise OptionsError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rng(self) -> np.random.Generator:
        """A fresh generator: the same seed gives the same tokens on every run."""
        return np.random.default_rng(self.seed)

    def pick(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """The next token from one row of logits ([vocab])."""
        if self.greedy:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / self.temperature
        order = np.argsort(-scaled, kind="stable")
        if self.top_k:
            order = order[: self.top_k]
        kept = scaled[order]
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        if self.top_p < 1.0:
            cutoff = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            order, probs = order[:cutoff], probs[:cutoff] / probs[:cutoff].sum()
        return int(order[rng.choice(len(order), p=probs)])


GREEDY = Sampler()
