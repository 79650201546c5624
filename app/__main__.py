"""``python -m app`` / ``export-studio``: start the studio, or ``--self-test`` it offscreen."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import sys
import time
from collections.abc import Sequence

_STARTED = time.perf_counter()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="export-studio", description=__doc__)
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="offscreen: export the tiny preset through the app's worker path into a temp "
        "folder, check the package loads in onnxruntime, exit 0 (nonzero with a message)",
    )
    parser.add_argument(
        "--settings", metavar="INI", help="use this settings file instead of the user's"
    )
    parser.add_argument(
        "--exit-when-shown",
        action="store_true",
        help="print start-up timing as JSON once the window is shown, then quit (benchmarks)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the app; returns the process exit code."""
    # Large exports run in a spawned child (app.jobs); a frozen bundle must route the
    # child's start-up back to multiprocessing instead of opening another window.
    multiprocessing.freeze_support()
    args = build_parser().parse_args(argv)
    from app.qt_compat import binding_problem

    problem = binding_problem()
    if problem:
        print(f"export-studio: {problem}", file=sys.stderr)
        return 2
    if args.self_test:
        from app.selftest import run_self_test

        return run_self_test()
    return run_app(args.settings, args.exit_when_shown)


def run_app(settings_file: str | None = None, exit_when_shown: bool = False) -> int:
    """Create the QApplication and the main window, and run the event loop."""
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app import APP_NAME, ORG_NAME

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(ORG_NAME)
    from app.settings import AppSettings
    from app.windows.main_window import MainWindow

    qsettings = QSettings(settings_file, QSettings.Format.IniFormat) if settings_file else None
    window = MainWindow(AppSettings(qsettings))
    window.show()
    # Ctrl+C / SIGTERM close the window properly (cancel work, save settings). Python runs
    # signal handlers only between bytecodes, so a timer wakes the interpreter up.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: window.close())
    wake = QTimer()
    wake.timeout.connect(lambda: None)
    wake.start(250)
    if exit_when_shown:

        def report() -> None:
            heavy = [m for m in ("torch", "transformers", "onnxruntime") if m in sys.modules]
            print(
                json.dumps(
                    {
                        "shown_s": time.perf_counter() - _STARTED,
                        "heavy_modules": heavy,
                        "platform": QApplication.platformName(),
                    }
                ),
                flush=True,
            )
            window.close()
            app.quit()

        QTimer.singleShot(0, report)
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main())
