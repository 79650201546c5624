"""``audit``: graph-capture readiness of a package, or of a preset's graph before export."""

from __future__ import annotations

import argparse

from engine.commands._args import (
    add_build_options,
    flag,
    options_from_args,
    print_json,
    refuse_unused_quantization,
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "audit", help="which nodes would break graph capture on an EP, and where nodes run"
    )
    parser.add_argument("package", nargs="?", metavar="PACKAGE", help="an exported package folder")
    parser.add_argument(
        "--preset", metavar="NAME", help="audit a preset's graph (no weights needed)"
    )
    parser.add_argument("--model", metavar="DIR", help="audit a checkpoint's graph (no export)")
    add_build_options(
        parser, ep_default=None, ep_said="default: a package's own EP; cpu for --preset / --model"
    )
    parser.add_argument(
        "--no-placement",
        action="store_true",
        help="skip measuring node placement on the EP (when it is installed)",
    )
    parser.add_argument(
        "--runtime-python",
        metavar="PYTHON",
        help="interpreter of another environment to measure node placement in (e.g. "
        "onnxruntime-webgpu 1.27's .venv-webgpu/bin/python); default: this one",
    )
    parser.add_argument("--json", action="store_true", help="print the audit as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """0: every session that can be captured is ready; 1: one is not; 2 (an error): the
    audit could not be made, placement included when it was asked for."""
    from engine.audit import (
        SessionAudit,
        audit_model,
        audit_package,
        decide_capture,
        never_captured_sessions,
    )
    from engine.caps import get_caps
    from engine.errors import OptionsError, option

    audits: list[SessionAudit]
    never: dict[str, str] = {}  # session -> why it is never captured
    blocked: dict[str, list[str]] = {}  # session -> why an export would not capture it
    if args.package:
        if args.preset or args.model:
            raise OptionsError(
                f"give a package folder, or {option('preset')} / {option('model')}, not both"
            )
        from engine.runtime.package import open_package

        _refuse_build_flags(args)
        # A package is audited for the EP it was built for unless --ep names another.
        package = open_package(args.package)
        caps = get_caps(args.ep or package.ep)
        audits = audit_package(
            args.package, caps, measure=not args.no_placement, python=args.runtime_python
        )
        never = never_captured_sessions(package.manifest, [a.session for a in audits])
        blocked = {
            a.session: a.reasons() for a in audits if a.capture_supported and a.session not in never
        }
    else:
        from engine.models import build_session, plan_sessions
        from engine.pipeline import load_model_spec
        from engine.plan import plan
        from engine.rewrites import apply_rewrites

        args.ep = args.ep or "cpu"
        options = options_from_args(args)
        refuse_unused_quantization(options)
        export_plan = plan(load_model_spec(args.model, args.preset), options)
        audits = []
        for session in plan_sessions(export_plan):  # every session an export writes
            model = build_session(export_plan, session.name)
            apply_rewrites(model, export_plan.caps)
            audit = audit_model(model, export_plan.caps, session.name)
            audits.append(audit)
            if session.never_captured:
                never[session.name] = session.never_captured
            elif audit.capture_supported:
                # As an export decides it (standard attention, for one, is never captured).
                _, reasons = decide_capture(audit, export_plan.uses_gqa, "auto")
                blocked[session.name] = reasons
    # The decoder first: the session capture is for.
    audits.sort(key=lambda a: a.session != "decoder")
    code = 1 if any(blocked.values()) else 0
    if args.json:
        print_json(
            [
                {
                    **a.to_json(),
                    "capture_ready": a.session in blocked and not blocked[a.session],
                    "never_captured": never.get(a.session),
                }
                for a in audits
            ]
        )
        return code
    for audit in audits:
        if audit.session in never:
            state = f"never captured: {never[audit.session]}"
        elif not audit.capture_supported:
            state = f"graph capture not supported on {audit.ep}"
        else:
            state = "graph capture " + ("not ready" if blocked[audit.session] else "ready")
        print(f"{audit.session} on {audit.ep}: {state}")
        for reason in blocked.get(audit.session, ()):
            print(f"  - {reason}")
        if audit.placement is not None:
            nodes = ", ".join(f"{p}: {n}" for p, n in audit.placement.provider_nodes.items())
            print(f"  placement: {nodes}")
        elif audit.placement_note:
            print(f"  placement: {audit.placement_note}")
        top = sorted(audit.op_counts.items(), key=lambda kv: -kv[1])[:8]
        print("  ops: " + ", ".join(f"{op} {n}" for op, n in top))
    return code


def _refuse_build_flags(args: argparse.Namespace) -> None:
    """A package is audited as it was built: build flags beside it would change nothing, so
    they are refused rather than ignored (``--ep`` names the EP to audit it for)."""
    from dataclasses import fields

    from engine.errors import OptionsError, option
    from engine.options import ExportOptions, changed_fields

    names = [f.name for f in fields(ExportOptions) if f.name != "ep"]
    flags = [flag(name) for name in changed_fields(options_from_args(args), names)]
    if flags:
        these = "it" if len(flags) == 1 else "them"
        raise OptionsError(
            f"{', '.join(flags)} describe{'s' if len(flags) == 1 else ''} an export, but a "
            f"package is audited as it was built: leave {these} out, or audit "
            f"{option('preset')} / {option('model')} with {these}"
        )
