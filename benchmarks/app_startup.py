"""Cold start of the desktop app to its first shown window, against a bare Qt window.

Each run is a fresh interpreter: ``python -m app --exit-when-shown`` (offscreen unless a
display is set, on throwaway settings) prints a JSON line once the main window is shown;
the time from spawning the process to reading that line is the cold start. A bare
PySide6 ``QMainWindow`` started the same way is measured in the same run, interleaved, as
the floor on this machine. Also reported: which heavy modules were loaded at that point
(torch, transformers and onnxruntime must not be). Prints one JSON object:

    python benchmarks/app_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.5

BARE_QT = """
import json, sys, time
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication(sys.argv[:1])
w = QMainWindow(); w.resize(1440, 900); w.show()
QTimer.singleShot(0, lambda: (print(json.dumps({"shown": True}), flush=True), app.quit()))
app.exec()
"""


def _time_to_line(command: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Seconds from spawning ``command`` to its first stdout line (a JSON object)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    proc.wait(timeout=120)
    if not line:
        raise RuntimeError(f"{command} printed nothing (exit {proc.returncode})")
    return elapsed, json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ)
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        env["QT_QPA_PLATFORM"] = "offscreen"
    app_s: list[float] = []
    bare_s: list[float] = []
    inside_s: list[float] = []
    heavy: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        settings = str(Path(tmp) / "settings.ini")
        app_cmd = [sys.executable, "-m", "app", "--exit-when-shown", "--settings", settings]
        _time_to_line(app_cmd, env)  # warm the OS file cache once; not counted
        for _ in range(args.runs):
            seconds, report = _time_to_line(app_cmd, env)
            app_s.append(seconds)
            inside_s.append(report["shown_s"])
            heavy.update(report["heavy_modules"])
            bare_s.append(_time_to_line([sys.executable, "-c", BARE_QT], env)[0])
    median = statistics.median(app_s)
    print(
        json.dumps(
            {
                "benchmark": "app_startup",
                "runs": args.runs,
                "platform": env.get("QT_QPA_PLATFORM", "default"),
                "cold_start_to_shown_window_s": {
                    "median": round(median, 3),
                    "min": round(min(app_s), 3),
                    "max": round(max(app_s), 3),
                },
                "bare_qt_window_s": {"median": round(statistics.median(bare_s), 3)},
                "app_over_bare_s": round(median - statistics.median(bare_s), 3),
                "shown_after_main_module_import_s": round(statistics.median(inside_s), 3),
                "heavy_modules_loaded_at_show": sorted(heavy),
                "goal_s": GOAL_S,
                "meets_goal": median < GOAL_S and not heavy,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
