"""``python -m engine``: the engine's command line (one module per subcommand)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from engine.commands import COMMAND_MODULES
from engine.errors import CancelledError, EngineError
from engine.presets import DEFAULT_PRESET


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
    """Run the CLI; returns 0 on success, 2 for errors the user can fix, 130 on cancel."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["info", "--preset", DEFAULT_PRESET]
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
        return code
    except CancelledError as exc:
        print(f"cancelled: {exc}", file=sys.stderr)
        return 130
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
