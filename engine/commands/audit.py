"""``audit``: graph-capture readiness of a package, or of a preset's graph before export."""

from __future__ import annotations

import argparse

from engine.commands._args import add_build_options, options_from_args, print_json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "audit", help="which nodes would break graph capture on an EP, and where nodes run"
    )
    parser.add_argument("package", nargs="?", metavar="PACKAGE", help="an exported package folder")
    parser.add_argument(
        "--preset", metavar="NAME", help="audit a preset's graph (no weights needed)"
    )
    parser.add_argument("--model", metavar="DIR", help="audit a checkpoint's graph (no export)")
    add_build_options(parser)
    parser.add_argument(
        "--no-placement",
        action="store_true",
        help="skip measuring node placement on the EP (when it is installed)",
    )
    parser.add_argument(
        "--runtime-python",
        metavar="PYTHON",
        help="interpreter of the environment that has the EP (e.g. .venv-webgpu/bin/python), "
        "used to measure node placement",
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.audit import SessionAudit, audit_model, audit_package
    from engine.caps import get_caps
    from engine.errors import OptionsError

    audits: list[SessionAudit]
    if args.package:
        if args.preset or args.model:
            raise OptionsError("give a package folder, or --preset / --model, not both")
        from engine.runtime.package import open_package

        # --ep defaults to cpu; a package is audited for the EP it was built for.
        caps = get_caps(args.ep if args.ep != "cpu" else open_package(args.package).ep)
        audits = audit_package(
            args.package, caps, measure=not args.no_placement, python=args.runtime_python
        )
    else:
        from engine.models import build_decoder
        from engine.pipeline import load_model_spec
        from engine.plan import plan
        from engine.rewrites import apply_rewrites

        export_plan = plan(load_model_spec(args.model, args.preset), options_from_args(args))
        model = build_decoder(export_plan)
        apply_rewrites(model, export_plan.caps)
        audits = [audit_model(model, export_plan.caps)]
    if args.json:
        print_json([a.to_json() for a in audits])
        return 0
    for audit in audits:
        state = "READY" if audit.capture_ready else "NOT READY"
        print(f"{audit.session} on {audit.ep}: graph capture {state}")
        for reason in audit.reasons():
            print(f"  - {reason}")
        if audit.placement is not None:
            nodes = ", ".join(f"{p}: {n}" for p, n in audit.placement.provider_nodes.items())
            print(f"  placement: {nodes}")
        elif audit.placement_note:
            print(f"  placement: {audit.placement_note}")
        top = sorted(audit.op_counts.items(), key=lambda kv: -kv[1])[:8]
        print("  ops: " + ", ".join(f"{op} {n}" for op, n in top))
    return 0 if all(a.capture_ready or not a.capture_supported for a in audits) else 1
