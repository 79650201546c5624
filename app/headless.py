"""The studio's headless equivalent, for a machine that cannot show its window.

``export-studio --preset gemma4-tiny`` on a server says in one line that there is no
display and runs what the window would export with its defaults, through the engine's
CLI (the same line "Copy CLI command" gives). No Qt is imported on this path.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from app.choices import default_output
from app.source import ModelSource
from engine.options import ExportOptions


def equivalent_argv(source: ModelSource, output: str | None, overwrite: bool) -> list[str]:
    """The ``python -m engine`` arguments that export what the window would start with."""
    from engine.cli_line import build_line

    options = ExportOptions()
    if source.is_preset:
        options = replace(options, random_weights=True)
    line = build_line(
        output or default_output(source, options),
        options=options,
        overwrite=overwrite,
        **source.export_args(),
    )
    return list(line.argv)


def run_headless(reason: str, source: ModelSource, output: str | None, overwrite: bool) -> int:
    """Say why there is no window (one line), then run the headless equivalent."""
    from engine.cli import main as engine_main
    from engine.cli_line import CliLine

    argv = equivalent_argv(source, output, overwrite)
    print(
        f"export-studio: {reason}: running the headless equivalent: {CliLine(tuple(argv)).text}",
        file=sys.stderr,
        flush=True,
    )
    return engine_main(argv)
