"""A UI-thread heartbeat that tells the app's own stalls from the machine's (Qt), and the
checkpoint config used to measure them. Shared by tests/app and benchmarks/app_*.py."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

from PySide6.QtCore import QTimer

from engine.presets import preset_config


class Gap(NamedTuple):
    """One gap between two heartbeat ticks, in ms."""

    wall: float
    own: float
    """CPU time the UI thread itself used."""
    others: float
    """The largest CPU time any one other thread of the process used."""
    waited: float
    """Time the UI thread was runnable but waited in the OS run queue for a core."""

    @property
    def held(self) -> float:
        """How long the app itself held the UI thread up in this gap (see :class:`Heartbeat`)."""
        return max(0.0, min(self.wall - self.waited, self.own + self.others))

    def __str__(self) -> str:
        return (
            f"a {self.wall:.0f} ms gap: UI thread {self.own:.0f} ms CPU, another thread "
            f"{self.others:.0f} ms CPU, {self.waited:.0f} ms waiting for a core"
        )


class Heartbeat:
    """A 10 ms UI-thread timer that records every gap between its ticks (:class:`Gap`).

    The app holds its UI thread up in two ways: the UI thread computes, or another thread
    holds the GIL while the UI thread waits for it. A gap counts as held up by the app for
    the UI thread's own CPU time plus the largest CPU time any one other thread of the
    process used in it (one thread holds the GIL at a time; the sum over threads would also
    count work that ran beside the UI on another core), and never for more than the gap less
    the time the UI thread waited in the run queue. CPU time is what the app's code costs
    wherever the OS schedules it: a thread preempted by other programs (a CPU hog, a busy CI
    machine) uses none, so their load shows in the wall gaps (kept as the control) and not
    here. CI saw 105 ms when every thread of the process was summed.
    """

    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.gaps: list[Gap] = []
        self._ui = threading.get_native_id()
        self._last: tuple[float, float, dict[int, tuple[float, float]]] = (0.0, 0.0, {})

    def _now(self) -> tuple[float, float, dict[int, tuple[float, float]]]:
        return time.perf_counter() * 1e3, time.thread_time() * 1e3, _threads()

    def start(self) -> None:
        self._last = self._now()
        self.timer.start()

    def _tick(self) -> None:
        now = self._now()
        (wall0, own0, threads0), (wall1, own1, threads1) = self._last, now
        others = max(
            (
                cpu - threads0.get(tid, (0.0, 0.0))[0]  # a thread new in this gap: all of it
                for tid, (cpu, _) in threads1.items()
                if tid != self._ui
            ),
            default=0.0,
        )
        before, after = threads0.get(self._ui), threads1.get(self._ui)
        waited = after[1] - before[1] if before and after else 0.0
        self.gaps.append(Gap(wall1 - wall0, own1 - own0, others, waited))
        self._last = now

    def stop(self) -> float:
        """The longest time the UI thread was held up by the app, in ms."""
        self.timer.stop()
        return max((gap.held for gap in self.gaps), default=0.0)

    @property
    def worst_wall(self) -> float:
        return max((gap.wall for gap in self.gaps), default=0.0)

    def worst(self) -> Gap | None:
        """The gap that held the UI up longest (for messages)."""
        return max(self.gaps, key=lambda gap: gap.held, default=None)


def _threads() -> dict[int, tuple[float, float]]:
    """Each thread of this process: (CPU ms, run-queue wait ms), from Linux schedstat; CPU
    from the coarser /proc stat (clock ticks) and no wait where schedstat is missing."""
    out = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            fields = Path(entry.path, "schedstat").read_text().split()
            out[int(entry.name)] = (int(fields[0]) / 1e6, int(fields[1]) / 1e6)
        except (OSError, IndexError, ValueError):
            try:  # fields after the command name: utime and stime are the 12th and 13th
                stat = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
                out[int(entry.name)] = ((int(stat[11]) + int(stat[12])) * _TICK_MS, 0.0)
            except (OSError, IndexError, ValueError):
                continue  # the thread ended meanwhile
    return out


_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


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
