"""Graph-capture readiness per session: the adapter between the preview and the engine.

Two steps. :func:`capture_readiness` derives readiness from the plan and the EP's flags in
microseconds, so the preview shows something at once. :func:`audit_readiness` then builds
the graph without weights and runs the engine's capture audit (``engine.audit``), deciding
exactly as an export would (``decide_capture``); it takes ~0.2 s for E4B, so the preview
runs it in a second worker and replaces the first answer when it arrives. If the engine
has no audit (an older build), the plan-derived answer stays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from app.findings import Reasons, readable_reasons

if TYPE_CHECKING:
    from engine.plan import ExportPlan

Status = Literal["ready", "likely", "blocked", "off", "unsupported"]

STATUS_TEXT: dict[Status, str] = {
    "ready": "ready (audited)",
    "likely": "likely ready",
    "blocked": "blocked",
    "off": "off",
    "unsupported": "not supported",
}


@dataclass(frozen=True)
class SessionReadiness:
    """Whether one session's graph can be captured, and why (not)."""

    session: str
    status: Status
    reasons: tuple[str, ...]
    source: Literal["plan", "audit"] = "plan"
    details: tuple[str, ...] = ()
    """The reasons with the names of the nodes they are about (a tooltip); empty: the
    reasons say it all."""

    @property
    def text(self) -> str:
        return STATUS_TEXT[self.status]

    @property
    def tooltip(self) -> str:
        return "\n".join(self.details or self.reasons) + f"\n(source: {self.source})"


def decoder_first(rows: Iterable[SessionReadiness]) -> tuple[SessionReadiness, ...]:
    """The decoder first (it runs once per generated token: the session capture is for),
    the others in the plan's order."""
    return tuple(sorted(rows, key=lambda r: r.session != "decoder"))


def capture_readiness(plan: ExportPlan) -> tuple[SessionReadiness, ...]:
    """Readiness of every session as far as the plan and the EP's flags tell (fast)."""
    from engine.models import plan_sessions

    out = []
    for session in plan_sessions(plan):
        if plan.caps.graph_capture and session.never_captured:
            reason = f"never captured: {session.never_captured}"
            out.append(SessionReadiness(session.name, "off", (reason,)))
        else:
            out.append(_from_plan(plan, session.name))
    return decoder_first(out)


def audit_readiness(plan: ExportPlan) -> tuple[SessionReadiness, ...]:
    """Readiness from the engine's audit of the built graph, decided as an export would.

    Raises:
        ImportError: This engine has no capture audit.
    """
    from engine.audit import audit_model, decide_capture
    from engine.errors import OptionsError
    from engine.models import build_session, plan_sessions
    from engine.rewrites import apply_rewrites

    caps, mode = plan.caps, plan.options.graph_capture
    out = []
    for session in plan_sessions(plan):
        model = build_session(plan, session.name)
        apply_rewrites(model, caps)
        audit = audit_model(model, caps, session.name)
        if not caps.graph_capture:
            status: Status = "unsupported"
            reasons = [f"{caps.display_name} has no graph capture"]
        else:
            try:
                on, reasons = decide_capture(
                    audit, plan.uses_gqa, mode, never=session.never_captured
                )
            except OptionsError:  # "on" that cannot be honoured: the export will refuse
                on, reasons = False, audit.reasons() or ["the audit refuses capture"]
            status = (
                "ready" if on else "off" if mode == "off" or session.never_captured else "blocked"
            )
            if on:
                count = sum(audit.op_counts.values())
                reasons = [f"audit passed: {count} nodes, none breaks capture"]
            elif mode == "off" and not reasons:
                reasons = ["set to off; the audit finds nothing that breaks capture"]
        shown: Reasons = readable_reasons(reasons, audit)
        out.append(
            SessionReadiness(session.name, status, shown.lines, "audit", details=shown.details)
        )
    return decoder_first(out)


def _from_plan(plan: ExportPlan, session: str) -> SessionReadiness:
    caps, options = plan.caps, plan.options
    if not caps.graph_capture:
        return SessionReadiness(session, "unsupported", (f"{caps.display_name} has no capture",))
    if options.graph_capture == "off":
        return SessionReadiness(session, "off", ("graph capture is set to off",))
    reasons: list[str] = []
    if not plan.uses_gqa:
        reasons.append(
            "capture needs past/present KV sharing one buffer, which needs "
            "GroupQueryAttention; this plan uses the standard attention path"
        )
    notes = ["batch 1, KV preallocated at max length"]
    for weight in plan.session(session).weights:
        if weight.shares:
            continue
        exceeds = weight.pieces_exceed if weight.is_split else weight.exceeds
        if "max_buffer_size" in exceeds:
            reasons.append(f"{weight.name} exceeds the buffer limit even after splitting")
        elif "max_storage_binding_size" in exceeds:
            notes.append(
                f"{weight.name} exceeds the spec-default storage binding size: only "
                "adapters that grant more can bind it"
            )
    if reasons:
        return SessionReadiness(session, "blocked", tuple(reasons))
    if caps.capture_needs_static_graph:
        notes.append(
            f"{caps.display_name} also needs every node on the device and static shapes: "
            "the engine's audit checks that on the built graph"
        )
    return SessionReadiness(session, "likely", tuple(notes))
