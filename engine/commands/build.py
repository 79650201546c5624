"""``build``: export a package."""

from __future__ import annotations

import argparse
import sys

from engine.commands._args import (
    add_build_options,
    add_model_args,
    options_from_args,
    print_json,
    progress_bar,
    refuse_unused_quantization,
)
from engine.errors import CancelledError, render_message
from engine.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("build", help="export a package")
    add_model_args(parser)
    add_build_options(parser)
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="seeded random weights (architecture-only packages; needed for presets)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-weights")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("output", metavar="OUT", help="package folder to create")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.pipeline import export

    options = options_from_args(args, random_weights=args.random_weights)
    refuse_unused_quantization(options)
    with progress_bar(args.quiet) as progress:
        try:
            result = export(
                args.output,
                model_dir=args.model,
                preset=args.preset,
                options=options,
                overwrite=args.overwrite,
                progress=progress,
                cancel=getattr(args, "cancel", None),
            )
        except KeyboardInterrupt:
            raise CancelledError("interrupted; nothing was written") from None
    notes = [render_message(note) for note in result.notes]
    for note in notes:
        if note.startswith("WARNING"):
            print(note, file=sys.stderr)  # loud even with --json or --quiet
    if args.json:
        print_json(
            {
                "output": str(result.output),
                "files": result.files,
                "seconds": result.seconds,
                "graph_capture": result.graph_capture,
                "total_bytes": result.total_bytes,
                "notes": notes,
            }
        )
        return 0
    print(f"wrote {result.output} ({format_bytes(result.total_bytes)}) in {result.seconds:.1f} s")
    for name, size in result.files.items():
        print(f"  {name:<28} {format_bytes(size):>12}")
    print(
        f"  graph capture: {'on' if result.graph_capture else 'off'}; "
        f"past/present share buffer: {'on' if result.share_buffer else 'off'}"
    )
    for note in notes:
        print(f"  note: {note}")
    return 0
