"""Cold start of the desktop app to its first painted window, against a bare Qt window.

Each run is a fresh interpreter: ``python -m app --exit-when-shown`` (offscreen unless a
display is set, on throwaway settings) prints one JSON line once its first preview is
drawn, with the moments, from the start of its main module, when the window was first
painted (``shown_s``) and when the preview with its charts was drawn (``preview_drawn_s``).
A bare PySide6 ``QMainWindow`` started the same way is the floor on this machine, and with
``--compare DIR`` another checkout (e.g. main) runs too; all are interleaved, so load on a
shared machine hits each alike. Wall times move with that load; the CPU time of each
process (user + system, until it exits) barely does, so it is reported beside them.
Also reported: which heavy modules were loaded at show (torch, transformers and
onnxruntime must never be; pyqtgraph and numpy come after the first frame). Prints one
JSON object:

    python benchmarks/app_startup.py [--runs 5] [--compare /work/main]
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
GOAL_S = 1.0
"""Issue 14: under a second from launch to a shown window on an idle machine."""

BARE_QT = """
import json, sys, time
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication(sys.argv[:1])
w = QMainWindow(); w.resize(1440, 900); w.show()
QTimer.singleShot(0, lambda: (print(json.dumps({"shown": True}), flush=True), app.quit()))
app.exec()
"""


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Spawn ``command``; seconds to its first stdout line (a JSON object, returned with
    ``line_s`` and ``cpu_s`` added: the child's user + system time until it exited)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if not line:
        raise RuntimeError(f"{command} printed nothing (exit {proc.returncode})")
    report = json.loads(line)
    report.update(line_s=elapsed, cpu_s=usage.ru_utime + usage.ru_stime)
    return report


def _app(root: Path, settings: str, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "app", "--exit-when-shown", "--settings", settings]
    report = _run(command, root, {**env, "PYTHONPATH": str(root)})
    # Checkouts older than the first-paint report printed at show: the line is the show.
    report.setdefault("preview_drawn_s", report["shown_s"])
    # From spawn: the interpreter's own start (before the main module) plus in-process.
    report["spawn_s"] = report["line_s"] - report["preview_drawn_s"]
    return report


def _summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in reports), 3)

    spawn = statistics.median(r["spawn_s"] for r in reports)
    shown = [r["shown_s"] + spawn for r in reports]
    return {
        "to_shown_window_s": {
            "median": round(statistics.median(shown), 3),
            "min": round(min(shown), 3),
            "max": round(max(shown), 3),
        },
        "to_drawn_preview_s": median("line_s"),
        "process_cpu_s": median("cpu_s"),
        "heavy_modules_at_show": sorted({m for r in reports for m in r["heavy_modules"]}),
        "deferred_modules_at_show": sorted(
            {m for r in reports for m in r.get("deferred_modules_at_show", [])}
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", type=Path, help="another checkout to run side by side")
    args = parser.parse_args()
    env = dict(os.environ)
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        env["QT_QPA_PLATFORM"] = "offscreen"
    roots = {"this": ROOT} | ({"compare": args.compare.resolve()} if args.compare else {})
    reports: dict[str, list[dict[str, Any]]] = {name: [] for name in roots}
    bare: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = str(Path(tmp) / "settings.ini")
        for root in roots.values():
            _app(root, settings, env)  # warm the OS file cache once; not counted
        for _ in range(args.runs):
            for name, root in roots.items():
                reports[name].append(_app(root, settings, env))
            bare.append(_run([sys.executable, "-c", BARE_QT], ROOT, env))
    this = _summary(reports["this"])
    result: dict[str, Any] = {
        "benchmark": "app_startup",
        "runs": args.runs,
        "platform": env.get("QT_QPA_PLATFORM", "default"),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "this": this,
        "bare_qt_window": {
            "line_s": round(statistics.median(b["line_s"] for b in bare), 3),
            "process_cpu_s": round(statistics.median(b["cpu_s"] for b in bare), 3),
        },
        "goal_s": GOAL_S,
        "meets_goal": this["to_shown_window_s"]["median"] < GOAL_S
        and not this["heavy_modules_at_show"],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    if args.compare:
        result["compare"] = {"root": str(args.compare), **_summary(reports["compare"])}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
