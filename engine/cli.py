"""``python -m engine``: the engine's command line (one module per subcommand)."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from engine.commands import COMMAND_MODULES
from engine.errors import CancelledError, EngineError
from engine.presets import DEFAULT_PRESET
from engine.progress import InterruptOnSignals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine",
        description="Export Gemma 4 to ONNX Runtime GenAI packages tuned for one EP.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns 0 on success, 2 for errors the user can fix, 128 + the signal
    on a cancel (130 for Ctrl-C; SIGTERM and SIGHUP cancel as Ctrl-C does)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["info", "--preset", DEFAULT_PRESET]
    args = build_parser().parse_args(argv)
    with InterruptOnSignals() as signals:
        try:
            code: int = args.handler(args)
            return code
        except (CancelledError, KeyboardInterrupt) as exc:
            reason = str(exc) if isinstance(exc, CancelledError) else "interrupted"
            print(f"cancelled: {reason}", file=sys.stderr)
            return 128 + (signals.signum or signal.SIGINT)
        except EngineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
