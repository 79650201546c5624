"""Long jobs as plain functions (no Qt), and a runner that isolates one in a child process.

A job takes ``progress(fraction, message)`` and a :class:`CancelToken` and returns a
result (Orange3-style): tests call it directly, a :class:`app.workers.Worker` runs it on a
pool thread. Threads share the GIL, and numpy holds it for whole-tensor operations: at
full size (E2B, E4B) generating or copying one table takes 100-200 ms, long enough to
freeze the UI. :func:`run_in_process` therefore runs a job in a spawned interpreter and
relays its progress, result, errors and cancel through a queue and an event.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue as queue_module
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.choices import Constraints
from engine.errors import EngineError
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


Job = Callable[[Any, Progress, CancelToken], Any]


def run_in_process(
    job: Job, request: Any, progress: Progress, cancel: CancelToken, poll_s: float = 0.05
) -> Any:
    """Run ``job(request, progress, cancel)`` in a spawned process and wait for it.

    ``job`` must be a module-level function and ``request`` picklable. Cancelling ``cancel``
    cancels the child's token; a child that dies without an answer is an error.
    """
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    # A shared flag, polled by the child. (An Event would be simpler, but setting one
    # blocks forever if the child exited while a thread of it was waiting on it.)
    stop = context.RawValue("b", 0)
    child = context.Process(
        target=_child, args=(job, request, messages, stop), name="export-studio-job", daemon=True
    )
    child.start()
    try:
        while True:
            if cancel.cancelled:
                stop.value = 1
            try:
                kind, payload = messages.get(timeout=poll_s)
            except queue_module.Empty:
                if not child.is_alive() and messages.empty():
                    raise EngineError(
                        f"the job's process ended without an answer (exit code {child.exitcode})"
                    ) from None
                continue
            if kind == "progress":
                progress(*payload)
            elif kind == "errored":
                raise payload
            else:
                return payload
    finally:
        stop.value = 1
        child.join(timeout=60)
        if child.is_alive():
            child.terminate()


def _child(job: Job, request: Any, messages: Any, stop: Any) -> None:
    token = CancelToken()

    def relay_cancel() -> None:
        while not stop.value:
            time.sleep(0.02)
        token.cancel()

    threading.Thread(target=relay_cancel, daemon=True).start()
    last = [0.0]

    def progress(fraction: float, message: str) -> None:
        now = time.monotonic()
        if fraction >= 1.0 or now - last[0] >= 0.02:
            last[0] = now
            messages.put(("progress", (fraction, message)))

    try:
        result = job(request, progress, token)
    except BaseException as exc:  # every failure goes back to the app
        messages.put(("errored", _picklable(exc)))
    else:
        messages.put(("returned", result))


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineError(f"{type(exc).__name__}: {exc}")
    return exc
