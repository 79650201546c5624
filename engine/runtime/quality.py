"""How much a package loses on real text: its next-token distributions against
transformers' float32 ones on the same checkpoint, position by position.

The text (the user's file, or the built-in sample) is tokenized with the package's own
``tokenizer.json``; transformers runs one forward over it, and the package is
teacher-forced through the same tokens one decode step at a time (the path generation
takes). Reported per text: the mean and largest KL divergence ``KL(reference || package)``
per token, how often the two agree on the most likely token, and each one's perplexity
on the text. These are the numbers to read as "how much worse is INT4"; the random-prompt
logit checks of :func:`engine.runtime.verify.verify` say whether the graph is faithful.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import OptionsError, PackageError, option
from engine.progress import CancelToken, Progress, no_progress
from engine.runtime.package import Package
from resources import resource_path

SAMPLE = "built-in sample"
"""What :attr:`TextQuality.source` says for the text shipped in ``resources/text``."""

DEFAULT_TOKENS = 128
"""Scored positions by default: enough for stable means, a few seconds on small models."""


@dataclass(frozen=True)
class TextQuality:
    """A package's next-token distributions against the reference's on one text."""

    source: str
    """The text file, or :data:`SAMPLE`."""
    tokens: int
    """Scored positions (each predicts the text's next token)."""
    mean_kld: float
    """Mean KL(reference || package) per position, in nats."""
    max_kld: float
    top1_agreement: float
    """Positions whose most likely token is the same in both."""
    reference_perplexity: float
    package_perplexity: float

    @property
    def perplexity_ratio(self) -> float:
        """The package's perplexity over the reference's (1.0: nothing lost)."""
        return self.package_perplexity / self.reference_perplexity

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "perplexity_ratio": self.perplexity_ratio}

    def summary(self) -> str:
        return (
            f"on {self.tokens} tokens of {self.source}: mean KLD {self.mean_kld:.4g} nats "
            f"(max {self.max_kld:.3g}), top-1 agreement {self.top1_agreement:.1%}, perplexity "
            f"{self.package_perplexity:.4g} vs {self.reference_perplexity:.4g} "
            f"({self.perplexity_ratio - 1:+.2%})"
        )


def read_text(path: str | os.PathLike[str] | None) -> tuple[str, str]:
    """``(text, source)``: the file's text, or the built-in sample when ``path`` is None.

    Raises:
        OptionsError: A file that cannot be read as UTF-8 text, or one without any.
    """
    if path is None:
        return resource_path("text", "quality_sample.txt").read_text(encoding="utf-8"), SAMPLE
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OptionsError(
            f"{option('text', 'FILE')}: '{file}' does not exist; give a UTF-8 text file"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionsError(
            f"{option('text', 'FILE')}: '{file}' cannot be read as UTF-8 text ({exc}); give "
            "a plain text file"
        ) from None
    if not text.strip():
        raise OptionsError(f"{option('text', 'FILE')}: '{file}' holds no text")
    return text, str(file)


def text_ids(pkg: Package, text: str, limit: int) -> list[int]:
    """The text as the package's tokenizer encodes it (with the special tokens its
    post-processor adds, a BOS where the model takes one), cut to ``limit`` + 1 ids
    (``limit`` scored positions) and to the package's length.

    Raises:
        PackageError: No or an unreadable tokenizer.json.
        OptionsError: Text too short to score two positions.
    """
    from tokenizers import Tokenizer

    path = pkg.path / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own exception type
        raise PackageError(f"{path} cannot be loaded by tokenizers: {exc}") from None
    ids = [i for i in tokenizer.encode(text).ids if 0 <= i < pkg.vocab_size]
    ids = ids[: min(limit + 1, pkg.max_length)]
    if limit < 2:
        raise OptionsError(
            f"{option('text_tokens', 'N')} is {limit}: score at least 2 positions (or 0 for "
            "no quality run)"
        )
    if len(ids) < 3:
        raise OptionsError(
            f"the text is {len(ids)} token(s) long in this package's tokenizer; give at "
            "least a sentence"
        )
    return ids


def measure(
    reference_logits: np.ndarray, package_logits: np.ndarray, targets: np.ndarray, source: str
) -> TextQuality:
    """The metrics from both sides' logits [N, V] at the same positions and the text's next
    tokens [N], in float64."""
    ref = log_softmax(reference_logits)
    ours = log_softmax(package_logits)
    kld = np.sum(np.exp(ref) * (ref - ours), axis=-1)
    rows = np.arange(len(targets))
    return TextQuality(
        source=source,
        tokens=len(targets),
        mean_kld=float(kld.mean()),
        max_kld=float(kld.max()),
        top1_agreement=float(np.mean(ref.argmax(-1) == ours.argmax(-1))),
        reference_perplexity=math.exp(float(-ref[rows, targets].mean())),
        package_perplexity=math.exp(float(-ours[rows, targets].mean())),
    )


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities along the last axis, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def text_quality(
    runner: Any,
    model: Any,
    ids: list[int],
    source: str,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
    *,
    cached: bool = False,
) -> TextQuality:
    """Score a package (through ``runner``, a :class:`~engine.runtime.runner.Runner`)
    against a loaded transformers ``model`` on ``ids``; ``cached``: transformers one token
    at a time through its cache, as the package runs (longrope past its original length),
    instead of one forward over the text."""
    import torch

    from engine.runtime.session import one_line

    progress(0.0, f"transformers on {len(ids)} tokens of text")
    try:
        with torch.no_grad():
            if not cached:
                reference = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().numpy()
            else:
                out = model(input_ids=torch.tensor([ids[:1]]), use_cache=True)
                rows = [out.logits[0, -1].float().numpy()]
                for token in ids[1:-1]:
                    out = model(input_ids=torch.tensor([[token]]), cache=out.cache, use_cache=True)
                    rows.append(out.logits[0, -1].float().numpy())
                reference = np.stack(rows)
    except Exception as exc:  # torch and transformers raise many types
        raise OptionsError(
            f"transformers failed on {len(ids)} tokens of text: {one_line(exc)}"
        ) from exc
    progress(0.3, "the package on the same tokens")
    run = runner.generate(ids[:1], len(ids) - 1, forced=ids[1:], keep_logits=True, cancel=cancel)
    progress(1.0, "scored")
    return measure(reference, np.stack(run.logits), np.asarray(ids[1:]), source)
