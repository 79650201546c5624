"""A UI-thread heartbeat that tells the app's own stalls from the machine's (Qt), and the
checkpoint config used to measure them. Shared by tests/app and benchmarks/app_*.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from PySide6.QtCore import QTimer

from engine.presets import preset_config


class Heartbeat:
    """A 10 ms UI-thread timer that records every gap between its ticks.

    A gap counts as the app holding the UI thread up only for the time that is both
    (a) not spent by the UI thread waiting in the OS run queue for a CPU (Linux schedstat),
    and (b) covered by CPU time its own process used. A worker holding the GIL, or the UI
    thread computing, shows in both; a busy machine that leaves the UI thread (or the whole
    process) waiting for a core shows in neither. Wall gaps are kept as the control: CI saw
    114 ms wall gaps that were the machine's, not the export's.
    """

    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.gaps: list[tuple[float, float, float]] = []
        """(wall ms, process CPU ms, run-queue wait ms) per gap."""
        self._stat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
        self._last = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        try:
            waited = int(self._stat.read_text().split()[1]) / 1e6
        except (OSError, IndexError, ValueError):  # no schedstat here: count CPU time only
            waited = 0.0
        return time.perf_counter() * 1e3, time.process_time() * 1e3, waited

    def start(self) -> None:
        self._last = self._now()
        self.timer.start()

    def _tick(self) -> None:
        now = self._now()
        wall, cpu, waited = (a - b for a, b in zip(now, self._last, strict=True))
        self.gaps.append((wall, cpu, waited))
        self._last = now

    def stop(self) -> float:
        """The longest time the UI thread was held up by the app, in ms."""
        self.timer.stop()
        return max((min(wall - waited, cpu) for wall, cpu, waited in self.gaps), default=0.0)

    @property
    def worst_wall(self) -> float:
        return max((wall for wall, _, _ in self.gaps), default=0.0)


def small_checkpoint_config(folder: Path) -> Path:
    """A Gemma 4 config of ~90 M parameters (about 180 MB in fp16): long enough to export
    that a blocked UI thread would show."""
    config = preset_config("gemma4-tiny")
    config.update(
        vocab_size=32768,
        vocab_size_per_layer_input=32768,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=12,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2,
        hidden_size_per_layer_input=64,
    )
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
