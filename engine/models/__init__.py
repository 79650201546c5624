"""Model families, chosen by the checkpoint's ``model_type``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from engine.errors import SpecError
from engine.graph.context import BuildContext
from engine.models.checkpoint_config import load_config, load_spec, spec_from_config
from engine.models.family import Family, Session
from engine.options import ExportOptions
from engine.plan_model import ExportPlan, SessionPlan
from engine.spec import ModelSpec

if TYPE_CHECKING:
    import onnx_ir as ir

    from engine.weights.factory import TensorFactory

__all__ = [
    "Family",
    "Session",
    "build_decoder",
    "build_session",
    "family_for",
    "load_config",
    "load_spec",
    "model_summary",
    "plan_sessions",
    "sessions_for",
    "spec_from_config",
    "supported_model_types",
]


def _families() -> tuple[Family, ...]:
    from engine.models.gemma3 import FAMILY as GEMMA3
    from engine.models.gemma4 import FAMILY as GEMMA4
    from engine.models.llama import FAMILY as LLAMA

    return (GEMMA4, LLAMA, GEMMA3)


def supported_model_types() -> tuple[str, ...]:
    """Every ``model_type`` some family reads, sorted."""
    return tuple(sorted(t for family in _families() for t in family.model_types))


def family_for(model_type: str, origin: str | None = None) -> Family:
    """The family that reads checkpoints of ``model_type`` (``origin``: the config's name,
    for the message)."""
    for family in _families():
        if model_type in family.model_types:
            return family
    where = f"{origin}: " if origin else ""
    raise SpecError(
        f"{where}model type '{model_type}' is not supported "
        f"(supported: {', '.join(supported_model_types())})"
    )


def sessions_for(
    spec: ModelSpec, options: ExportOptions, context_length: int
) -> tuple[Session, ...]:
    """The package's sessions for ``spec`` under resolved ``options``."""
    return family_for(spec.source_model_type).sessions(spec, options, context_length)


def model_summary(spec: ModelSpec) -> dict[str, Any]:
    """The spec's summary plus its parameter count over every tower the checkpoint has."""
    options = ExportOptions().resolve()
    # Checkpoint keys, so a table two sessions read (a tied token embedding) counts once.
    sizes = {
        part.source: math.prod(part.shape)
        for session in sessions_for(spec, options, 1)
        for w in session.weights()
        for part in (w.parts or (w,))
        if part.source is not None
    }
    summary = spec.summary()
    return {"name": summary.pop("name"), "parameters": sum(sizes.values()), **summary}


def plan_sessions(plan: ExportPlan) -> tuple[Session, ...]:
    """The session records the plan was made from, in the plan's order (kept by the plan:
    nothing is made twice)."""
    return tuple(_tree(s) for s in plan.sessions)


def _tree(session: SessionPlan) -> Session:
    tree = session.tree
    if not isinstance(tree, Session):
        raise TypeError(f"the plan's {session.name} session carries no session tree")
    return tree


def build_session(plan: ExportPlan, name: str, factory: TensorFactory | None = None) -> ir.Model:
    """One session's graph from the plan; initializers are lazy (written later through
    ``factory``) or empty placeholders without one (audits, previews)."""
    try:
        planned = plan.session(name)
    except KeyError:
        raise KeyError(f"the plan has no {name} session") from None
    ctx = BuildContext(plan, planned, factory)
    _tree(planned).build(ctx)
    return ctx.model()


def build_decoder(plan: ExportPlan, factory: TensorFactory | None = None) -> ir.Model:
    """The decoder session's graph (see :func:`build_session`)."""
    return build_session(plan, "decoder", factory)
