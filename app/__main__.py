"""``python -m app`` / ``export-studio``: start the studio, or ``--self-test`` it offscreen."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.source import ModelSource

_STARTED = time.perf_counter()
HEAVY = ("torch", "transformers", "onnxruntime")
"""Never needed to show the window."""
DEFERRED = ("pyqtgraph", "numpy")
"""Needed by the charts, which are made after the first frame."""


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
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--preset", metavar="NAME", help="open with this built-in preset chosen")
    model.add_argument("--model", metavar="DIR", help="open with this checkpoint folder chosen")
    parser.add_argument(
        "--output",
        metavar="DIR",
        help="package folder (without a display: where the headless equivalent writes)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="without a display: let the headless equivalent replace --output",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the app; returns the process exit code."""
    # Large exports run in a spawned child (app.jobs); a frozen bundle must route the
    # child's start-up back to multiprocessing instead of opening another window.
    multiprocessing.freeze_support()
    args = build_parser().parse_args(argv)
    from app.source import ModelSource

    source = None
    if args.preset or args.model:
        source = (
            ModelSource("preset", args.preset)
            if args.preset
            else ModelSource("folder", str(Path(args.model).expanduser().absolute()))
        )
    if not args.self_test:
        from app.platform_check import display_problem, xcb_problem

        no_display = display_problem()
        if no_display:  # what the window would export: the saved session, as it restores it
            from app.headless import run_headless

            return run_headless(no_display, source, args.output, args.overwrite, args.settings)
        missing = xcb_problem()
        if missing:
            print(f"export-studio: {missing}", file=sys.stderr)
            return 3
    from app.qt_compat import binding_problem

    problem = binding_problem()
    if problem:
        print(f"export-studio: {problem}", file=sys.stderr)
        return 2
    if args.self_test:
        from app.selftest import run_self_test

        return run_self_test()
    return run_app(args.settings, args.exit_when_shown, source, args.output)


def run_app(
    settings_file: str | None = None,
    exit_when_shown: bool = False,
    source: ModelSource | None = None,
    output: str | None = None,
) -> int:
    """Create the QApplication and the main window (with ``source`` and ``output`` chosen
    when given), and run the event loop."""
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app import APP_NAME, ORG_NAME

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(ORG_NAME)
    from app.settings import AppSettings
    from app.theme import IndicatorStyle

    style = IndicatorStyle(QApplication.style().name())  # the desktop's, with clear check boxes
    QApplication.setStyle(style)
    from app.windows.main_window import MainWindow

    qsettings = QSettings(settings_file, QSettings.Format.IniFormat) if settings_file else None
    window = MainWindow(AppSettings(qsettings), source=source)
    if output:
        window.state.set_output(output)
    window.show()
    # Ctrl+C / SIGTERM close the window properly (cancel work, save settings). Python runs
    # signal handlers only between bytecodes, so a timer wakes the interpreter up.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: window.close())
    wake = QTimer()
    wake.timeout.connect(lambda: None)
    wake.start(250)
    if exit_when_shown:
        times: dict[str, float] = {}
        geometry: dict[str, list[int]] = {}
        heavy_at_show: list[str] = []

        def shown() -> None:
            times["shown_s"] = time.perf_counter() - _STARTED
            area = window.screen().availableGeometry()
            frame = window.frameGeometry()
            geometry["window"] = [frame.x(), frame.y(), frame.width(), frame.height()]
            geometry["screen"] = [area.x(), area.y(), area.width(), area.height()]
            heavy_at_show.extend(m for m in HEAVY + DEFERRED if m in sys.modules)

        def drawn(outcome: str = "drawn") -> None:
            if "preview_drawn_s" in times:
                return
            times["preview_drawn_s"] = time.perf_counter() - _STARTED
            print(
                json.dumps(
                    {
                        **times,
                        **geometry,
                        "heavy_modules": [m for m in heavy_at_show if m in HEAVY],
                        "deferred_modules_at_show": [m for m in heavy_at_show if m in DEFERRED],
                        "platform": QApplication.platformName(),
                        "preview": outcome,
                    }
                ),
                flush=True,
            )
            window.close()
            app.quit()

        window.firstPainted.connect(shown)
        window.preview.drawn.connect(drawn)

        # Never wait forever: a preview that fails (bad saved options) still ends the run.
        def failed(data: object) -> None:
            if data is None:
                drawn("failed")

        window.state.previewChanged.connect(failed)
        QTimer.singleShot(120_000, lambda: drawn("timed out"))
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main())
