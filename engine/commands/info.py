"""``info``: summarize a model's architecture."""

from __future__ import annotations

import argparse

from engine.commands._args import add_model_args, print_json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("info", help="summarize a model's architecture")
    add_model_args(parser)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.models import model_summary
    from engine.pipeline import load_model_spec

    summary = model_summary(load_model_spec(args.model, args.preset))
    if args.json:
        print_json(summary)
        return 0
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        shown = f"{value:,}" if key == "parameters" else value
        print(f"{key:<{width}}  {shown}")
    return 0
