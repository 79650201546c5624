"""Benchmark history: every run kept as a JSON list in the app's data folder."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from app.runtime_adapter import BenchRecord

HISTORY_FILE = "bench_history.json"


class BenchHistory:
    """Runs in the order they happened; saved after every change."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / HISTORY_FILE
        self.records: list[BenchRecord] = self._load()

    def _load(self) -> list[BenchRecord]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        known = {f.name for f in fields(BenchRecord)}
        records = []
        for item in data if isinstance(data, list) else []:
            try:
                records.append(BenchRecord(**{k: v for k, v in item.items() if k in known}))
            except (TypeError, AttributeError):
                continue  # a damaged entry is skipped, the rest is kept
        return records

    def add(self, record: BenchRecord) -> None:
        self.records.append(record)
        self.save()

    def clear(self) -> None:
        self.records = []
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in self.records], indent=1), encoding="utf-8")
        os.replace(tmp, self.path)
