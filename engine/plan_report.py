"""A readable text report of an :class:`ExportPlan` (the CLI's ``plan``)."""

from __future__ import annotations

from engine.errors import render_message
from engine.plan_model import ExportPlan, WeightPlan
from engine.units import format_bytes


def _storage(w: WeightPlan) -> str:
    if w.storage in ("float", "float_t"):
        return w.dtype
    return f"int{w.bits} b{w.block_size}" + (" sym" if w.symmetric else "")


def render_plan(plan: ExportPlan, top: int = 12) -> str:
    """Sessions, limits, the largest tensors, splits and warnings, as aligned text."""
    opts = plan.options
    limit = opts.max_buffer_size
    lines = [
        f"{plan.spec.name} -> {plan.caps.display_name} ({opts.dtype}); "
        f"weights {'int' + str(opts.weight_bits) if opts.weight_bits else 'float'}, "
        f"embeddings {'int' + str(opts.embedding_bits) if opts.embedding_bits else 'float'}",
        f"buffer limit: {format_bytes(limit) if limit else 'none'}"
        + (
            f"; storage binding limit: {format_bytes(plan.caps.max_storage_binding_size)}"
            if plan.caps.max_storage_binding_size
            else ""
        ),
        f"context length: {plan.context_length:,}",
        "",
    ]
    for session in plan.sessions:
        lines.append(
            f"session {session.name} ({session.filename}): {format_bytes(session.nbytes)} "
            f"({session.nbytes:,} B), {sum(1 for _ in session.tensors())} initializers"
        )
        weights = sorted(session.weights, key=lambda w: w.unsplit_nbytes, reverse=True)[:top]
        name_width = max(len(w.name) for w in weights)
        lines.append(
            f"  {'tensor':<{name_width}}  {'shape':<16} {'storage':<12} {'bytes':>12}  split"
        )
        for w in weights:
            shape = "x".join(map(str, w.weight.shape))
            size = "shared" if w.shares else format_bytes(w.nbytes)
            split = ""
            if w.is_split:
                each = max(p.largest_buffer for p in w.pieces)
                split = f"{len(w.pieces)} pieces, largest buffer {format_bytes(each)}"
            elif w.exceeds:
                split = "over the limit: " + ", ".join(w.exceeds)
            if w.k_slices > 1:
                slices = f"K in {w.k_slices} slices (split-K MatMul)"
                split = f"{split}; {slices}" if split else slices
            if w.shares:
                split = (split + "; " if split else "") + f"uses {w.shares}"
            lines.append(
                f"  {w.name:<{name_width}}  {shape:<16} {_storage(w):<12} {size:>12}  {split}"
            )
        lines.append("")
    lines.append(f"total: {format_bytes(plan.nbytes)} ({plan.nbytes:,} B)")
    for warning in plan.warnings:
        lines.append(f"warning: {render_message(warning)}")
    return "\n".join(lines)
