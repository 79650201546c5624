"""``plan``: preview sizes and buffer splits without weights."""

from __future__ import annotations

import argparse

from engine.commands._args import add_build_options, add_model_args, options_from_args, print_json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="preview sizes and buffer splits, no weights needed")
    add_model_args(parser)
    add_build_options(parser)
    parser.add_argument("--top", type=int, default=12, help="largest tensors to list")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.pipeline import load_model_spec
    from engine.plan import plan
    from engine.plan_report import render_plan

    result = plan(load_model_spec(args.model, args.preset), options_from_args(args))
    if args.json:
        print_json(result.to_json())
    else:
        print(render_plan(result, top=args.top))
    return 0
