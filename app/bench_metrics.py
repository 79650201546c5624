"""The numbers of a benchmark record the Benchmark tab shows, how to read and print them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.runtime.bench_record import BenchResult


@dataclass(frozen=True)
class Metric:
    """One number of a ``BenchResult``, how to read it and how to print it."""

    key: str
    title: str
    unit: str
    read: Callable[[BenchResult], float]
    better: str
    """"higher" or "lower"."""

    def format(self, value: float) -> str:
        digits = 0 if value >= 100 else 1 if value >= 10 else 2
        return f"{value:,.{digits}f}"


METRICS = (
    Metric("decode", "Decode", "tokens/s", lambda r: r.decode_tokens_per_second, "higher"),
    Metric("prefill", "Prefill", "tokens/s", lambda r: r.prefill_tokens_per_second, "higher"),
    Metric(
        "ttft", "Time to first token", "ms", lambda r: r.time_to_first_token_seconds * 1e3, "lower"
    ),
    Metric("load", "Load time", "s", lambda r: r.load_seconds, "lower"),
    Metric("rss", "Peak RSS", "MiB", lambda r: r.peak_rss_bytes / 2**20, "lower"),
)
