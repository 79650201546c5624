"""``info``: summarize a model's architecture."""

from __future__ import annotations

import argparse

from engine.commands._args import add_model_args, print_json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("info", help="summarize a model's architecture")
    add_model_args(parser)
    parser.add_argument("--json", action="store_true", help="print the model's facts as JSON")
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
        text = f"{value:,}" if key == "parameters" else shown(value)
        print(f"{key.replace('_', ' '):<{width}}  {text}")
    return 0


def shown(value: object) -> str:
    """A summary value in words: ``sliding 256, full 512``, not a Python repr."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {shown(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(shown(v) for v in value) or "none"
    return str(value)
