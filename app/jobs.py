"""Long jobs as plain functions (no Qt), and a runner that isolates one in a child process.

A job takes ``progress(fraction, message)`` and a :class:`CancelToken` and returns a
result (Orange3-style): tests call it directly, a :class:`app.workers.Worker` runs it on a
pool thread. Threads share the GIL, and numpy holds it for whole-tensor operations: at
full size (E2B, E4B) generating or copying one table takes 100-200 ms, long enough to
freeze the UI. Exports and trade-offs therefore run in a spawned interpreter
(:func:`engine.child.run_in_child`), which relays their progress, result, errors and cancel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.choices import Constraints
from engine.options import ExportOptions
from engine.progress import CancelToken, Progress

if TYPE_CHECKING:
    from app.preview_data import PreviewData
    from app.source import ModelSource
    from engine.sensitivity import Tradeoff


@dataclass(frozen=True)
class ExportRequest:
    """Everything one export needs, frozen when the user presses Export."""

    model_args: tuple[tuple[str, str], ...]
    """``(("preset", name),)`` or ``(("model_dir", path),)`` for :func:`engine.pipeline.export`."""
    options: ExportOptions
    output: Path
    overwrite: bool


@dataclass(frozen=True)
class PreviewRequest:
    """One preview: the source and options of one generation, with the caches it may fill
    (the worker owns them while it runs; one preview runs at a time)."""

    generation: int
    source: ModelSource
    options: ExportOptions
    specs: dict[ModelSource, Any] = field(default_factory=dict, compare=False)
    fits: dict[tuple[Any, ...], Constraints] = field(default_factory=dict, compare=False)
    measured: Tradeoff | None = field(default=None, compare=False)
    """The session's :class:`engine.sensitivity.Tradeoff` of these options, or None: a
    size budget's mix is shown from it."""


@dataclass(frozen=True)
class PreviewOutcome:
    """What a preview job found: the preview, or which step failed and why."""

    generation: int
    preview: PreviewData | None = None
    constraints: Constraints | None = None
    """Option values the model rules out (towers, block sizes); None: not known yet."""
    spec_error: BaseException | None = None
    """The model itself could not be read (a folder that is not a checkpoint)."""
    plan_error: BaseException | None = None
    """The model was read, but these options cannot be planned."""


def load_spec_for(source: ModelSource) -> Any:
    """The :class:`engine.spec.ModelSpec` of a source (reads config.json; fast)."""
    if source.is_preset:
        from engine.presets import load_preset

        return load_preset(source.value)
    from engine.models import load_spec

    return load_spec(source.value)


def preview_job(request: PreviewRequest, progress: Progress, cancel: CancelToken) -> PreviewOutcome:
    """Read the model (cached), plan and summarise. When the plan fails, also find what the
    model rules out (cached), so the options can move onto allowed values; otherwise that
    is left to :func:`constraints_job`, after the preview is shown. Failures are part of
    the outcome, tagged with their generation like previews."""
    from app.choices import constraints_key, model_constraints
    from app.preview_data import compute_preview

    source, options, generation = request.source, request.options, request.generation
    try:
        spec = request.specs.get(source)
        if spec is None:
            spec = request.specs[source] = load_spec_for(source)
    except Exception as exc:
        return PreviewOutcome(generation, spec_error=exc)
    key = constraints_key(source, options)
    try:
        preview = compute_preview(spec, options, request.measured)
        return PreviewOutcome(generation, preview, request.fits.get(key))
    except Exception as exc:
        fits = request.fits.get(key)
        if fits is None:
            fits = request.fits[key] = model_constraints(spec, options)
        return PreviewOutcome(generation, constraints=fits, plan_error=exc)


def constraints_job(request: PreviewRequest, progress: Progress, cancel: CancelToken) -> Any:
    """What the model rules out for these options (cached in ``request.fits``)."""
    from app.choices import constraints_key, model_constraints

    key = constraints_key(request.source, request.options)
    fits = request.fits.get(key)
    if fits is None:
        spec = request.specs.get(request.source) or load_spec_for(request.source)
        fits = request.fits[key] = model_constraints(spec, request.options)
    return request.generation, fits


def audit_job(plan: Any, progress: Progress, cancel: CancelToken) -> Any:
    """The readiness of the plan's decoder from the engine's audit of its built graph;
    None when this engine has no audit."""
    from app.readiness import audit_readiness

    try:
        return audit_readiness(plan)
    except ImportError:
        return None


@dataclass(frozen=True)
class TradeoffRequest:
    """Size against quality for a checkpoint and the options now chosen."""

    model_dir: Path
    options: ExportOptions


def tradeoff_job(request: TradeoffRequest, progress: Progress, cancel: CancelToken) -> Any:
    """:func:`engine.sensitivity.tradeoff` of the options' all-INT4 plan (their size
    budget set aside): a measurement of every 4-bit weight, then the choices from it."""
    from dataclasses import replace

    from engine.models import load_spec
    from engine.plan import plan
    from engine.sensitivity import tradeoff

    spec = load_spec(request.model_dir)
    options = replace(request.options, size_budget=None, target_kld=None)
    return tradeoff(
        request.model_dir, plan(spec, options), lambda o: plan(spec, o), progress, cancel
    )


def run_export(request: ExportRequest, progress: Progress, cancel: CancelToken) -> Any:
    """The export job: :func:`engine.pipeline.export` for one request."""
    from engine.pipeline import export

    return export(
        request.output,
        **dict(request.model_args),
        options=request.options,
        overwrite=request.overwrite,
        progress=progress,
        cancel=cancel,
    )
