"""What one generation produced, and how two generations compare.

Shared by our runner and the onnxruntime-genai runner so benchmarks and checks read both
the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Generation:
    """Tokens and timings of one prompt -> new tokens run.

    Step ``i`` produced ``tokens[i]``: step 0 is the prefill, later steps feed one token.
    """

    prompt_length: int
    tokens: tuple[int, ...]
    argmax: tuple[int, ...] = ()
    """The model's top-1 at each step (differs from ``tokens`` when sampling or forcing);
    empty when the runtime does not expose logits."""
    logits: tuple[np.ndarray, ...] = field(default=(), repr=False)
    """float32 [vocab] logits per step, when the caller asked to keep them."""
    prefill_seconds: float = 0.0
    """The prefill run, up to the logits being on the host."""
    first_token_seconds: float = 0.0
    """Time to first token: prefill plus choosing the token."""
    step_seconds: tuple[float, ...] = ()
    """Each decode step: feed one token, run, fetch logits, choose."""
    stopped_at_eos: bool = False

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_length / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Decode tokens per second over the steps after the first token."""
        total = self.decode_seconds
        return len(self.step_seconds) / total if total > 0 else 0.0

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(self.step_seconds) if self.step_seconds else 0.0


@dataclass(frozen=True)
class Agreement:
    """Two generations of the same prompt side by side (greedy tokens and logits)."""

    steps: int
    same_tokens: bool
    first_difference: int | None
    """Index of the first differing token, None when all agree."""
    max_abs_logit_diff: float | None
    """Over the steps both kept logits for (up to the first difference); None without."""

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "same_tokens": self.same_tokens,
            "first_difference": self.first_difference,
            "max_abs_logit_diff": self.max_abs_logit_diff,
        }


def compare(a: Generation, b: Generation) -> Agreement:
    """Compare two generations token by token, and logits where both kept them."""
    steps = min(a.new_tokens, b.new_tokens)
    first = next((i for i in range(steps) if a.tokens[i] != b.tokens[i]), None)
    same = first is None and a.new_tokens == b.new_tokens
    diff: float | None = None
    upto = steps if first is None else first + 1
    pairs = list(zip(a.logits[:upto], b.logits[:upto], strict=False))
    if pairs:
        diff = max(float(np.max(np.abs(x - y))) for x, y in pairs)
    return Agreement(steps=steps, same_tokens=same, first_difference=first, max_abs_logit_diff=diff)
