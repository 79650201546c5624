"""The Preview's mixed precision: which weights a size budget (or target KLD) puts in INT8,
from a measurement the session already has (no Qt).

The mix is the engine's: :func:`engine.sensitivity.pick` over the measured costs of
“Compare sizes and quality…” (:class:`engine.sensitivity.Tradeoff`), replanned with those
weights in ``keep_int8``, as :func:`engine.sensitivity.apply` does at export. Without a
measurement the Preview shows all-INT4 and says, in one line, how to get the mix now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.wording import CONTROLS, render

if TYPE_CHECKING:
    from engine.options import ExportOptions
    from engine.plan import ExportPlan
    from engine.sensitivity import Tradeoff, WeightCost
    from engine.spec import ModelSpec

MATRIX_ROLES = ("linear", "lm_head", "embedding", "ple_table", "experts")
"""Roles whose precision the options choose (norms, scalars and caches stay float)."""
ORDER = ("INT8", "INT4")
"""The table's order: what the mix moved to INT8 first, then INT4, then float."""


@dataclass(frozen=True)
class TensorPrecision:
    """One decoder weight as the mix stores it."""

    name: str
    precision: str
    """``INT4``, ``INT8`` or ``float (fp16)``."""
    nbytes: int
    kld4: float | None
    """Its measured mean KLD with only it in INT4 (None: not a measured weight)."""


@dataclass(frozen=True)
class PrecisionMix:
    """What the Preview says about mixed precision by measured sensitivity."""

    summary: str
    """One line: the choice and its predicted size and KLD, or how to get one."""
    level: str | None = None
    """The summary's status colour (:mod:`app.theme`): None, or ``warning``."""
    tensors: tuple[TensorPrecision, ...] = ()
    """Every decoder weight's precision under the mix (empty: nothing measured yet)."""


def not_measured(options: ExportOptions) -> PrecisionMix:
    """The one line of a budget (or target) with no measurement in the session."""
    key = "size_budget" if options.size_budget is not None else "target_kld"
    return PrecisionMix(
        f"{CONTROLS[key].name}: the INT4 / INT8 mix is chosen at export from a measurement "
        f"(sizes here are all-INT4); “{CONTROLS['tradeoff'].name}” in Advanced quantization "
        "measures now."
    )


def mixed_plan(
    spec: ModelSpec, export_plan: ExportPlan, tradeoff: Tradeoff | None
) -> tuple[ExportPlan, PrecisionMix]:
    """The plan with the INT8 weights the export would choose for its options' budget or
    target from ``tradeoff`` (measured on this all-INT4 plan), and what to say about it;
    without a measurement (or with one of another plan), the plan as it is."""
    from engine.plan import plan
    from engine.sensitivity import PrecisionChoice, budget_problem

    options = export_plan.options
    base = export_plan.nbytes
    if tradeoff is None or tradeoff.points[0].nbytes != base:
        return export_plan, not_measured(options)
    costs = list(tradeoff.costs)
    choice = PrecisionChoice.from_costs(costs, options, base)
    mixed = plan(spec, choice.applied_to(options))
    note = render(choice.note())
    summary = (
        f"{note[:1].upper()}{note[1:]}. From “{CONTROLS['tradeoff'].name}”; the export "
        "measures again."
    )
    level = None
    problem = budget_problem(options, base)
    if problem:  # what the export refuses
        level = "warning"
        summary = f"The export refuses this: {render(problem)}."
    return mixed, PrecisionMix(summary, level, _tensors(mixed, costs))


def _tensors(mixed: ExportPlan, costs: list[WeightCost]) -> tuple[TensorPrecision, ...]:
    """The decoder's weights whose precision the options choose, in :data:`ORDER` (the
    plan's order within each)."""
    measured = {c.name: c.kld4 for c in costs}
    rows = [
        TensorPrecision(
            wp.name,
            f"INT{wp.bits}" if wp.quantized else f"float ({wp.dtype})",
            wp.nbytes,
            measured.get(wp.name),
        )
        for wp in mixed.decoder.weights
        if not wp.shares and (wp.quantized or wp.weight.role in MATRIX_ROLES)
    ]
    rank = {precision: i for i, precision in enumerate(ORDER)}
    return tuple(sorted(rows, key=lambda r: rank.get(r.precision, len(ORDER))))
