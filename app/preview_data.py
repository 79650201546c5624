"""What the preview shows, computed from an :class:`engine.plan.ExportPlan` (no Qt).

Kept separate from the widgets so it runs in a worker thread and in tests without an
event loop, and so its cost can be measured (``benchmarks/app_preview.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from app.readiness import SessionReadiness, capture_readiness
from app.wording import render

if TYPE_CHECKING:
    from app.precision import PrecisionMix
    from engine.options import ExportOptions
    from engine.plan import ExportPlan
    from engine.sensitivity import Tradeoff
    from engine.spec import ModelSpec

TOP_TENSORS = 12

ROLE_LABELS = {
    "embedding": "token embedding",
    "ple_table": "per-layer embeddings",
    "lm_head": "LM head",
    "linear": "linear layers",
    "norm": "norms",
    "scalar": "scalars",
    "rope_cache": "RoPE caches",
    "router": "MoE routers",
    "experts": "MoE experts",
    "scale": "scales",
    "bias": "biases",
    "clip": "clip bounds",
    "table": "position tables",
    "conv": "convolutions",
}
"""Every weight role (``engine.logical.Role``) in words, for the size chart's legend."""


@dataclass(frozen=True)
class SessionSize:
    """One session's bytes, by weight role."""

    name: str
    filename: str
    total: int
    by_role: dict[str, int]


@dataclass(frozen=True)
class TensorBar:
    """One of the largest weights: its biggest single buffer before and after splitting."""

    name: str
    role: str
    unsplit: int
    largest: int
    pieces: int
    over_limit: bool
    over_binding: bool = False
    session: str = ""
    """The session it belongs to (said on the chart when a package has several)."""


@dataclass(frozen=True)
class SplitRow:
    """A weight the plan splits (or would need to): what, into how many, bytes each."""

    name: str
    storage: str
    unsplit_bytes: int
    pieces: int
    piece_bytes: int
    axis: int | None
    note: str
    still_over: bool
    session: str = ""


@dataclass(frozen=True)
class PreviewData:
    """Everything the preview panel draws for one plan."""

    title: str
    total_bytes: int
    context_length: int
    attention: str
    buffer_limit: int | None
    binding_limit: int | None
    sessions: tuple[SessionSize, ...]
    largest: tuple[TensorBar, ...]
    splits: tuple[SplitRow, ...]
    readiness: tuple[SessionReadiness, ...]
    warnings: tuple[str, ...]
    spec_summary: dict[str, Any] = field(default_factory=dict)
    compute_ms: float = 0.0
    plan: Any = field(default=None, repr=False, compare=False)
    """The :class:`ExportPlan` itself (the audit step builds its graph)."""
    precision: PrecisionMix | None = None
    """Mixed precision by measured sensitivity, when the options ask for it."""


def _storage(w: Any) -> str:
    if w.storage in ("float", "float_t"):
        return str(w.dtype)
    return f"int{w.bits} b{w.block_size}"


ATTENTION_WORDS = {
    "gqa": "GroupQueryAttention",
    "standard": "standard ONNX ops",
    "static": "explicit, over static KV buffers (no GroupQueryAttention)",
    "mixed": "GroupQueryAttention; the wider full layers explicit, over static KV buffers",
}
"""The attention lowering a plan's graph uses, in words (see :mod:`engine.graph.attention`)."""


def attention_lowering(plan: ExportPlan) -> str:
    """What the built graph's attention is: the plan's ``gqa`` path is lowered without
    GroupQueryAttention, over static shared KV buffers, on EPs whose GQA cannot be
    trusted under graph capture (WebGPU), so "gqa" alone would say the wrong thing; on
    CUDA the layers wider than its GQA serves (Gemma 4's 512-wide full layers) are."""
    from engine.graph.attention import static_kinds, uses_static_buffers

    if uses_static_buffers(plan.spec, plan.options):
        return "static"
    if static_kinds(plan.spec, plan.options):
        return "mixed"
    return plan.attention


def preview_from_plan(plan: ExportPlan, compute_ms: float = 0.0) -> PreviewData:
    """Summarise a plan for the charts and tables."""
    from engine.models import model_summary  # the model builders: not at start-up

    limit = plan.options.max_buffer_size
    sessions = []
    bars = []
    splits = []
    for session in plan.sessions:
        by_role: dict[str, int] = {}
        for w in session.weights:
            if w.shares:
                continue
            piece_bytes = [(p.nbytes, p.largest_buffer) for p in w.pieces]
            nbytes = sum(n for n, _ in piece_bytes)
            label = ROLE_LABELS.get(w.weight.role, w.weight.role)
            by_role[label] = by_role.get(label, 0) + nbytes
            largest = max(b for _, b in piece_bytes)
            unsplit = sum(b for _, b in piece_bytes) if w.is_split else largest
            exceeds = w.pieces_exceed if w.is_split else w.exceeds
            over = "max_buffer_size" in exceeds
            binding = "max_storage_binding_size" in exceeds
            bars.append(
                TensorBar(
                    w.name,
                    w.weight.role,
                    unsplit,
                    largest,
                    len(w.pieces),
                    over,
                    binding,
                    session.name,
                )
            )
            if w.is_split or "max_buffer_size" in w.exceeds:
                row = SplitRow(
                    w.name,
                    _storage(w),
                    nbytes,
                    len(w.pieces),
                    largest,
                    w.split_axis,
                    render(w.note),
                    over,
                    session.name,
                )
                splits.append(row)
        total = sum(by_role.values())
        sessions.append(SessionSize(session.name, session.filename, total, by_role))
    bars.sort(key=lambda b: b.unsplit, reverse=True)
    opts = plan.options
    bits = f"int{opts.weight_bits}" if opts.weight_bits else "float"
    emb = f"int{opts.embedding_bits}" if opts.embedding_bits else "float"
    return PreviewData(
        title=f"{plan.spec.name} → {plan.caps.display_name} ({opts.dtype}, weights {bits}, "
        f"embeddings {emb})",
        total_bytes=sum(s.total for s in sessions),
        context_length=plan.context_length,
        attention=ATTENTION_WORDS[attention_lowering(plan)],
        buffer_limit=limit,
        binding_limit=plan.caps.max_storage_binding_size,
        sessions=tuple(sessions),
        largest=tuple(bars[:TOP_TENSORS]),
        splits=tuple(splits),
        readiness=capture_readiness(plan),
        warnings=tuple(render(w) for w in plan.warnings),
        spec_summary=model_summary(plan.spec),
        compute_ms=compute_ms,
        plan=plan,
    )


def compute_preview(
    spec: ModelSpec, options: ExportOptions, measured: Tradeoff | None = None
) -> PreviewData:
    """Plan and summarise; the worker's job. A size budget or target KLD is planned with
    the INT8 weights the export would pick from ``measured`` (this session's measurement
    of these options), if there is one. Raises the engine's ``OptionsError``."""
    from engine.plan import plan
    from engine.sensitivity import wanted

    started = time.perf_counter()
    export_plan = plan(spec, options)
    precision = None
    if wanted(options):
        from app.precision import mixed_plan

        export_plan, precision = mixed_plan(spec, export_plan, measured)
    data = preview_from_plan(export_plan)
    return replace(data, precision=precision, compute_ms=(time.perf_counter() - started) * 1000)
