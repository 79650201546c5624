"""The JSON report of a one-call device benchmark: rewritten after every stage, so a crash
or a timeout keeps what was measured, with the time left in the call's budget."""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any


class Report:
    """``data["stages"]`` by name, saved to ``path`` whenever a stage is recorded."""

    def __init__(self, path: Path, budget_s: float, benchmark: str, indent: int = 1) -> None:
        self.path = path
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.indent = indent
        self.data: dict[str, Any] = {
            "benchmark": benchmark,
            "command": " ".join(["python3", *sys.argv]),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "stages": {},
        }
        self.save()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def stage(self, name: str, value: Any) -> Any:
        self.data["stages"][name] = value
        self.save()
        return value

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=self.indent, default=str))
        tmp.replace(self.path)
