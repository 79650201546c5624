"""Benchmark history: every run kept, as the engine's own ``BenchResult`` records.

Saved as a JSON list in the app's data folder after every change. Each entry is a run's
``BenchResult.to_json()`` plus when it ran; reading turns it back into a ``BenchResult``.
Entries that do not read back (a damaged file, an older format) are skipped, the rest kept.
Importing the engine's runtime records costs numpy, so the file is read on first use.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.runtime.bench_record import BenchResult

HISTORY_FILE = "bench_history.json"


@dataclass(frozen=True)
class BenchRun:
    """One benchmark run: the engine's record and when it finished."""

    result: BenchResult
    timestamp: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "result": self.result.to_json()}


def result_from_json(data: dict[str, Any]) -> BenchResult:
    """A ``BenchResult`` from its ``to_json()`` (tuples restored; derived keys dropped).

    Raises:
        TypeError, ValueError: ``data`` is not such a record.
    """
    from engine.runtime.bench_record import BenchResult

    known = {f.name: f for f in fields(BenchResult)}
    values = {k: v for k, v in data.items() if k in known}
    for name in ("decode_tokens_per_second_runs", "tokens", "notes", "media"):
        if name in values:
            values[name] = tuple(values[name])
    return BenchResult(**values)


class BenchHistory:
    """Runs in the order they happened; saved after every change."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / HISTORY_FILE
        self._runs: list[BenchRun] | None = None

    @property
    def runs(self) -> list[BenchRun]:
        if self._runs is None:
            self._runs = self._load()
        return self._runs

    def _load(self) -> list[BenchRun]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        runs = []
        for item in data if isinstance(data, list) else []:
            try:
                runs.append(BenchRun(result_from_json(item["result"]), float(item["timestamp"])))
            except (TypeError, ValueError, KeyError, AttributeError):
                continue  # a damaged or older entry is skipped, the rest is kept
        return runs

    def add(self, result: BenchResult) -> BenchRun:
        run = BenchRun(result)
        self.runs.append(run)
        self.save()
        return run

    def clear(self) -> None:
        self._runs = []
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps([r.to_json() for r in self.runs], indent=1), encoding="utf-8")
        os.replace(tmp, self.path)
