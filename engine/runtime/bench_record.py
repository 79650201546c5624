"""Benchmark records: what was run and what it measured, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from engine.errors import OptionsError, option
from engine.runtime.generation import Agreement, Generation
from engine.runtime.limits import (
    MAX_REPEATS,
    MAX_TOKENS,
    check_range,
    check_seed,
    check_threads,
)
from engine.runtime.media import MediaPrompt
from engine.runtime.runner import KvMode

RuntimeName = Literal["ort", "genai"]
CaptureMode = Literal["off", "on", "both"]
"""Graph capture in a benchmark: without, with (checked against a run without), or
both side by side."""


@dataclass(frozen=True)
class BenchConfig:
    """What to run; capture is chosen per call."""

    runtime: RuntimeName = "ort"
    ep: str | None = None
    """Short EP name; None = the package's EP."""
    prompt_length: int = 128
    new_tokens: int = 64
    repeats: int = 3
    warmup: int = 1
    kv_mode: KvMode = "auto"
    seed: int = 0
    threads: int | None = None
    media: MediaPrompt | None = None
    """Images / audio for a multimodal package (genai only); the prompt is then its text."""

    def __post_init__(self) -> None:
        if self.runtime not in ("ort", "genai"):
            raise OptionsError(f"runtime must be ort or genai, got '{self.runtime}'")
        if self.media is not None and self.runtime != "genai":
            raise OptionsError(
                f"prompts with images or audio run through onnxruntime-genai; "
                f"use {option('runtime', 'genai')}"
            )
        # Lengths are checked against the package (engine.runtime.limits.check_lengths);
        # here only what needs no package.
        check_range(option("prompt_len"), self.prompt_length, 1, MAX_TOKENS)
        check_range(option("new_tokens"), self.new_tokens, 2, MAX_TOKENS, "a decode rate needs 2")
        check_range(option("repeats"), self.repeats, 1, MAX_REPEATS)
        check_range(option("warmup"), self.warmup, 0, MAX_REPEATS)
        check_seed(self.seed)
        check_threads(self.threads)


@dataclass(frozen=True)
class BenchResult:
    """One benchmark of one package on one runtime, EP and capture setting."""

    package: str
    runtime: RuntimeName
    ep: str
    provider: str
    """The onnxruntime provider that ran the nodes (for genai: the one requested)."""
    graph_capture: bool
    kv_mode: str
    prompt_length: int
    new_tokens: int
    repeats: int
    warmup: int
    load_seconds: float
    time_to_first_token_seconds: float
    """Median over repeats."""
    prefill_tokens_per_second: float
    """Median over repeats."""
    decode_tokens_per_second: float
    """Median over repeats of (new_tokens - 1) / decode time."""
    decode_tokens_per_second_min: float
    decode_tokens_per_second_max: float
    decode_tokens_per_second_runs: tuple[float, ...]
    peak_rss_bytes: int
    peak_rss_scope: Literal["benchmark", "process"]
    """'benchmark' when the peak was reset at the start, else the process's lifetime peak."""
    tokens: tuple[int, ...] = ()
    """Greedy tokens of the first timed run."""
    placement: dict[str, Any] | None = None
    adapter: str | None = None
    """How a plugin EP ran (its version, a GPU or the software adapter); None for a
    built-in EP."""
    notes: tuple[str, ...] = field(default=())
    media: tuple[str, ...] = ()
    """What the prompt carried besides text, one entry per file (``image``, ``audio``);
    ``prompt_length`` is then the processed prompt's, and the time to first token
    includes reading the files and the vision / speech sessions."""

    @property
    def decode_spread(self) -> float:
        """(max - min) / median of decode tok/s over repeats."""
        median = self.decode_tokens_per_second
        if median <= 0:
            return 0.0
        return (self.decode_tokens_per_second_max - self.decode_tokens_per_second_min) / median

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["decode_tokens_per_second_runs"] = list(self.decode_tokens_per_second_runs)
        data["tokens"] = list(self.tokens)
        data["notes"] = list(self.notes)
        data["media"] = list(self.media)
        data["decode_spread"] = self.decode_spread
        return data


@dataclass(frozen=True)
class CaptureComparison:
    """Capture off and on side by side, the capture run checked against the other."""

    off: BenchResult
    on: BenchResult | None
    agreement: Agreement | None
    """Greedy tokens and logits of capture on against capture off."""
    error: str | None = None
    """Why the capture run did not happen, when it did not."""
    cancelled: bool = False
    """The capture run was cancelled (``compare_capture(keep_on_cancel=True)``): ``off`` is
    complete, ``on`` absent."""

    @property
    def speedup(self) -> float | None:
        if self.on is None or not self.off.decode_tokens_per_second:
            return None
        return self.on.decode_tokens_per_second / self.off.decode_tokens_per_second

    @property
    def validated(self) -> bool:
        return self.agreement is not None and self.agreement.same_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "off": self.off.to_json(),
            "on": self.on.to_json() if self.on else None,
            "capture_speedup": self.speedup,
            "capture_validated": self.validated,
            "agreement": self.agreement.to_json() if self.agreement else None,
            "error": self.error,
            "cancelled": self.cancelled,
        }


@dataclass(frozen=True)
class Outcome:
    """One setting of an interleaved benchmark: its record, or why it has none."""

    runtime: RuntimeName
    graph_capture: bool
    result: BenchResult | None = None
    reference: Generation | None = field(default=None, repr=False)
    error: str | None = None
