"""How long the UI thread stalls while the studio exports, in a worker thread and in a child
process, against an idle control of the same length measured in the same run.

A 10 ms heartbeat timer on the UI thread records every gap (``tests/app/heartbeat.py``):
``worst_wall_ms`` is what a user would feel on this machine now; ``worst_app_ms`` counts only
the app's own work that held the UI up (the UI thread's CPU time plus the largest CPU time of
another of its threads in the gap; not the time the OS gave to other programs), which is what
the tests hold under 100 ms. The control is the heartbeat with no export running.
Model: a ~90 M-parameter Gemma 4 config (fp16, random weights, ~180 MB). Prints one JSON
object:

    python benchmarks/app_responsiveness.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if not os.environ.get("DISPLAY"):
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _measure(app: Any, heartbeat: Any, until: Any, timeout_s: float = 600) -> dict[str, float]:
    started = time.perf_counter()
    heartbeat.start()
    while not until() and time.perf_counter() - started < timeout_s:
        app.processEvents()
        time.sleep(0.001)
    worst_app = heartbeat.stop()
    walls = sorted(gap.wall for gap in heartbeat.gaps)
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "ticks": len(walls),
        "worst_wall_ms": round(heartbeat.worst_wall, 1),
        "p99_wall_ms": round(walls[int(0.99 * (len(walls) - 1))], 1) if walls else 0.0,
        "worst_app_ms": round(worst_app, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.settings import AppSettings
    from app.source import ModelSource
    from app.windows.main_window import MainWindow
    from tests.app.heartbeat import Heartbeat, small_checkpoint_config

    app = QApplication.instance() or QApplication(sys.argv[:1])
    results: dict[str, list[dict[str, float]]] = {"thread": [], "process": [], "control": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        window = MainWindow(
            AppSettings(QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat))
        )
        window.show()
        _measure(app, Heartbeat(), lambda: window.warmed_up, 60)
        model = small_checkpoint_config(folder / "small")
        window.state.set_source(ModelSource("folder", str(model)))
        window.state.update_options(random_weights=True, dtype="fp16")
        _measure(app, Heartbeat(), lambda: not window.previewer.busy, 60)
        for repeat in range(args.repeats):
            for isolation in ("thread", "process"):
                window.exporter.isolation = isolation
                window.state.set_output(str(folder / f"pkg-{isolation}-{repeat}"))
                done: list[bool] = []
                window.exporter.finished.connect(lambda done=done: done.append(True))
                assert window.exporter.start() is not None, window.state.error
                results[isolation].append(_measure(app, Heartbeat(), lambda d=done: bool(d)))
                if window.exporter.result is None:
                    raise RuntimeError(f"the {isolation} export failed: {window.state.error}")
            seconds = results["thread"][-1]["seconds"]
            deadline = time.perf_counter() + seconds
            results["control"].append(
                _measure(app, Heartbeat(), lambda d=deadline: time.perf_counter() > d)
            )
        window.close()

    def summary(runs: list[dict[str, float]]) -> dict[str, float]:
        return {key: statistics.median(r[key] for r in runs) for key in runs[0]}

    print(
        json.dumps(
            {
                "benchmark": "app_responsiveness",
                "repeats": args.repeats,
                "load_average_1min": round(os.getloadavg()[0], 2),
                "export_in_thread": summary(results["thread"]),
                "export_in_process": summary(results["process"]),
                "idle_control": summary(results["control"]),
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
