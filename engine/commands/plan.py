"""``plan``: preview sizes and buffer splits without weights."""

from __future__ import annotations

import argparse
from dataclasses import replace

from engine.commands._args import (
    add_build_options,
    add_model_args,
    count,
    options_from_args,
    print_json,
    refuse_unused_quantization,
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="preview sizes and buffer splits, no weights needed")
    add_model_args(parser)
    add_build_options(parser)
    parser.add_argument(
        "--top",
        type=count,
        default=12,
        help="largest tensors to list per session (default 12; more than there are lists all)",
    )
    parser.add_argument(
        "--tradeoff",
        action="store_true",
        help="measure each 4-bit weight on the checkpoint's float model (on --calibration FILE, "
        "else a built-in sample) and list the choices between all-INT4 and float with their "
        "bytes and predicted mean KLD (a --size-budget for each); needs --model and 4 weight "
        "or embedding bits",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.errors import OptionsError, option, render_message
    from engine.pipeline import load_model_spec
    from engine.plan import plan
    from engine.plan_report import render_plan
    from engine.preflight import (
        check_buffer_limit,
        check_keep_float,
        plan_notes,
    )

    if args.top < 1:  # checked before the model is read: nothing else depends on it
        raise OptionsError(
            f"{option('top')} must be 1 or more (the largest tensors to list), got {args.top}"
        )
    from engine import sensitivity

    spec = load_model_spec(args.model, args.preset)
    options = options_from_args(args)
    if not args.tradeoff:  # --tradeoff quantizes on its own, with these flags
        refuse_unused_quantization(options)
    text = None  # --tradeoff measures on --calibration whatever the quantizer
    if args.tradeoff and not options.calibrated:
        text, options = options.calibration, replace(options, calibration=None)
    result = plan(spec, options)
    tradeoff = None
    if args.tradeoff:
        if sensitivity.wanted(result.options):
            raise OptionsError(
                f"{option('tradeoff')} lists what each size budget would cost; drop "
                f"{option('size_budget')} / {option('target_kld')}, then plan or build with "
                "the budget of the line you choose"
            )
        tradeoff = sensitivity.tradeoff(
            args.model, result, lambda changed: plan(spec, changed), calibration=text
        )
    chosen = None
    if sensitivity.wanted(result.options):  # measures: the plan shows the choice per tensor
        result, chosen = sensitivity.apply(args.model, spec, result)
    check_keep_float(result)
    notes = [render_message(note) for note in plan_notes(result)]
    if chosen is not None:
        notes.insert(0, chosen)
    try:
        check_buffer_limit(result)
    except OptionsError as refusal:
        notes.append(f"build refuses this plan: {refusal}")
    if args.json:
        extra = {} if tradeoff is None else {"tradeoff": tradeoff.to_json()}
        print_json({**result.to_json(), "notes": notes, **extra})
    else:
        print(render_plan(result, top=args.top))
        for note in notes:
            print(f"note: {note}")
        if tradeoff is not None:
            print(
                "\nsize against quality (mean KLD from the float32 model on the calibration "
                "text, predicted from each weight's measured cost):"
            )
            for line in tradeoff.lines():
                print(f"  {line}")
    return 0
