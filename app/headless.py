"""The studio's headless equivalent, for a machine that cannot show its window.

``export-studio`` on a server says in one line that there is no display and runs what the
window would export, through the engine's CLI (the same line "Copy CLI command" gives): the
last session's model, options and output folder, read from the settings as the window
restores them, with ``--preset`` / ``--model`` and ``--output`` in their place when given.
Of Qt only QtCore is imported (QSettings, and the state's signals): nothing that needs a
display.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.source import ModelSource

if TYPE_CHECKING:
    from app.state import StudioState


def restored_state(
    settings_file: str | None, source: ModelSource | None, output: str | None
) -> tuple[StudioState, str]:
    """The state the window would start with (the last session's choices from
    ``settings_file``, else the user's settings; ``source`` and ``output`` replace the
    saved ones), and what of the saved session could not be restored ("" when nothing)."""
    from PySide6.QtCore import QSettings

    from app.settings import AppSettings
    from app.state import StudioState

    settings = AppSettings(
        QSettings(settings_file, QSettings.Format.IniFormat) if settings_file else None
    )
    state = StudioState()
    settings.restore_state(state)  # as MainWindow does
    lost = ""
    last = settings.last_source()
    if source is not None:
        state.set_source(source)
    elif last is not None and not last.is_preset and not Path(last.value).is_dir():
        gone = f"the last model folder {last.value} no longer exists"
        lost = f"{gone}: exporting {state.source.display}"
    if output:
        state.set_output(output)
    return state, lost


def equivalent_argv(state: StudioState, overwrite: bool) -> list[str]:
    """The ``python -m engine`` arguments that export what the window would, from ``state``."""
    from engine.cli_line import build_line

    line = build_line(
        state.output,
        options=state.export_options(),
        overwrite=overwrite,
        **state.source.export_args(),
    )
    return list(line.argv)


def run_headless(
    reason: str,
    source: ModelSource | None,
    output: str | None,
    overwrite: bool,
    settings_file: str | None = None,
) -> int:
    """Say why there is no window (one line, and one more when the saved model is gone),
    then run the headless equivalent."""
    from engine.cli import main as engine_main
    from engine.cli_line import CliLine

    state, lost = restored_state(settings_file, source, output)
    if lost:
        print(f"export-studio: {lost}", file=sys.stderr, flush=True)
    argv = equivalent_argv(state, overwrite)
    print(
        f"export-studio: {reason}: running the headless equivalent: {CliLine(tuple(argv)).text}",
        file=sys.stderr,
        flush=True,
    )
    return engine_main(argv)
