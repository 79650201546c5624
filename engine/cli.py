"""``python -m engine``: the engine's command line (one module per subcommand)."""

from __future__ import annotations

import argparse
import importlib
import os
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
        description=(
            "Export Hugging Face LLMs (Gemma 4 and 3, Llama, Mistral, Qwen 2 and 3, Phi-3, "
            "SmolLM3) to ONNX Runtime GenAI packages tuned for one execution provider."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns 0 on success, 2 for errors the user can fix, 128 + the signal
    on a cancel (130 for Ctrl-C; SIGTERM and SIGHUP cancel as Ctrl-C does)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:  # usage, and where to start, rather than a command nobody asked for
        parser.print_help()
        print(
            f"\nTo start: python -m engine plan --preset {DEFAULT_PRESET} --ep webgpu, then "
            f"python -m engine build --preset {DEFAULT_PRESET} --random-weights out/tiny"
        )
        return 0
    args = parser.parse_args(argv)
    from engine.runtime.plugins import drop_adapter_notices

    drop_adapter_notices()  # a command's stderr is the user's to read
    with InterruptOnSignals() as signals:
        args.cancel = signals.cancel  # long commands pass it on: work stops at its next check
        try:
            code: int = args.handler(args)
            sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
            return code
        except (CancelledError, KeyboardInterrupt) as exc:
            reason = str(exc) if isinstance(exc, CancelledError) else "interrupted"
            print(f"cancelled: {reason}", file=sys.stderr)
            return 128 + (signals.signum or signal.SIGINT)
        except EngineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            # The reader went away (`... | head`): stop quietly, as a shell tool does.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 128 + getattr(signal, "SIGPIPE", 13)
        except OSError as exc:
            # A file system refusal no check foresaw (a folder this user may not enter, a
            # disk gone): one line that names the file, not a traceback.
            where = f": '{exc.filename}'" if exc.filename else ""
            print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
            return 2
