"""``python -m app --self-test``: the packaged app checks itself, offscreen.

It opens the real main window (offscreen unless a platform is set), exports the tiny
preset through the same controller and worker path a click uses, into a temp folder,
twice: in a worker thread and in a spawned process (how large models export, and what a
frozen bundle must support), and checks that each package loads and runs in onnxruntime.
Exit code 0 means all of that worked; anything else prints what failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMEOUT_S = 300


def run_self_test(timeout_s: float = TIMEOUT_S) -> int:
    """Run the self-test; returns the exit code (prints a JSON line either way)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    started = time.perf_counter()
    try:
        report = _run(timeout_s)
    except Exception as exc:  # the self-test reports every failure, then exits nonzero
        print(json.dumps({"self_test": "failed", "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    report["seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(report))
    return 0 if report["self_test"] == "ok" else 1


def _quiet_offscreen_warnings() -> None:
    """Drop the offscreen plugin's "propagateSizeHints" notice; keep every other message."""
    from PySide6.QtCore import QtMsgType, qInstallMessageHandler

    def handler(kind: QtMsgType, context: object, message: str) -> None:
        if "propagateSizeHints" not in message:
            print(message, file=sys.stderr)

    qInstallMessageHandler(handler)


def _run(timeout_s: float) -> dict[str, Any]:
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.load_check import check_package_loads
    from app.settings import AppSettings
    from app.state import ModelSource
    from app.windows.main_window import MainWindow

    _quiet_offscreen_warnings()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    with tempfile.TemporaryDirectory(prefix="export-studio-selftest-") as tmp:
        settings = AppSettings(
            QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        )
        window = MainWindow(settings)
        window.show()
        window.state.set_source(ModelSource("preset", "gemma4-tiny"))
        window.state.update_options(ep="cpu")
        report: dict[str, Any] = {"self_test": "ok", "platform": QApplication.platformName()}
        # Both ways an export runs: a worker thread, and a spawned process (large models).
        for isolation in ("thread", "process"):
            window.exporter.isolation = isolation
            result = _export(window, Path(tmp) / f"tiny-{isolation}", timeout_s)
            check = check_package_loads(result.output)
            report[isolation] = {
                "package_bytes": result.total_bytes,
                "files": sorted(result.files),
                "load_check": check.summary,
            }
        window.close()
        app.processEvents()
        return report


def _export(window: Any, output: Path, timeout_s: float) -> Any:
    """Export through the window's controller and wait for it on an event loop."""
    from PySide6.QtCore import QEventLoop, QTimer

    window.state.set_output(str(output))
    outcome: dict[str, Any] = {}
    loop = QEventLoop()
    exporter = window.exporter
    slots = [
        (exporter.succeeded, lambda r: outcome.update(result=r)),
        (exporter.failed, lambda m: outcome.update(error=m)),
        (exporter.cancelled, lambda: outcome.update(error="cancelled")),
        (exporter.finished, loop.quit),
    ]
    for signal, slot in slots:
        signal.connect(slot)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    if exporter.start() is None:
        raise RuntimeError(f"the export did not start: {window.state.error[1]}")
    loop.exec()
    for signal, slot in slots:  # only ours: the window's own slots stay connected
        signal.disconnect(slot)
    if "result" not in outcome:
        exporter.cancel()
        raise RuntimeError(outcome.get("error", f"no result within {timeout_s:.0f} s"))
    return outcome["result"]
