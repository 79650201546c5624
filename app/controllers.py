"""Controllers: turn state changes and button presses into workers, and results into state.

:class:`PreviewController` re-plans as options change (throttled: the first change runs at
once, bursts coalesce into one more run, stale results are dropped). :class:`ExportController`
runs the export job and keeps the last result. Both start workers and never block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, QTimer, Signal

from app.jobs import (
    ExportRequest,
    PreviewOutcome,
    PreviewRequest,
    audit_job,
    constraints_job,
    preview_job,
    run_export,
)
from app.state import ModelSource, StudioState, source_problem
from app.wording import error_text
from app.workers import Worker
from engine.child import run_in_child
from engine.errors import CancelledError
from engine.package import occupied, resolve_output
from engine.progress import CancelToken, Progress


class PreviewController(QObject):
    """Keeps ``state.preview`` in step with the source and options, off the UI thread."""

    computed = Signal(float)
    """Milliseconds the last plan + summary took in the worker."""
    audited = Signal()
    """The preview's readiness now comes from the engine's audit of the built graph."""

    def __init__(self, state: StudioState, interval_ms: int = 60) -> None:
        super().__init__(state)
        self._state = state
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._on_quiet)
        self._pending = False
        self._generation = 0
        self._worker: Worker | None = None
        self._specs: dict[ModelSource, Any] = {}
        self._fits: dict[tuple[Any, ...], Any] = {}
        self._audits = 0
        self.runs = 0
        state.sourceChanged.connect(self.request)
        state.optionsChanged.connect(self.request)
        state.tradeoffsChanged.connect(self._measured)

    def request(self, *_: Any) -> None:
        """Ask for a new preview (throttled)."""
        if self._timer.isActive() or self._worker is not None:
            self._pending = True
            return
        self._start()
        self._timer.start()

    def _measured(self) -> None:
        """A measurement arrived: a size budget's preview can now show its mix."""
        from engine.sensitivity import wanted

        if wanted(self._state.options):
            self.request()

    def _on_quiet(self) -> None:
        if self._pending and self._worker is None:
            self._pending = False
            self._start()
            self._timer.start()

    def _start(self) -> None:
        self._generation += 1
        state = self._state
        request = PreviewRequest(
            self._generation,
            state.source,
            state.options,
            self._specs,
            self._fits,
            state.tradeoff_for(state.source, state.options),
        )
        worker = Worker(partial(preview_job, request), "preview")
        # Bound methods of this QObject: Qt drops the connection if the window goes first.
        worker.signals.returned.connect(self._returned)
        worker.signals.errored.connect(self._crashed)
        worker.signals.finished.connect(self._finished)
        self._worker = worker.start()
        self.runs += 1

    def _returned(self, outcome: PreviewOutcome) -> None:
        if outcome.generation != self._generation:
            return  # a newer request is on its way
        state = self._state
        if outcome.spec_error is not None:
            message = error_text(outcome.spec_error)
            state.set_source_problem(message)
            state.set_preview(None, message)
            state.report_error("preview", f"The model cannot be read: {message}")
            return
        state.set_source_problem(source_problem(state.source))
        options = state.options
        if outcome.constraints is None:
            if not self._pending:  # a newer request finds its own
                self._start_constraints(outcome.generation)
        else:
            state.set_model_constraints(outcome.constraints)
        if state.options != options:
            return  # moved onto allowed values: that preview is on its way
        if outcome.plan_error is not None:
            self._crashed(outcome.plan_error)
            return
        data = outcome.preview
        assert data is not None  # neither step failed
        state.clear_error("preview")
        state.set_preview(data)
        self.computed.emit(data.compute_ms)
        if not self._pending:  # a newer request will audit its own plan
            self._start_audit(outcome.generation, data)

    def _start_constraints(self, generation: int) -> None:
        """Find what the model rules out (towers, block sizes) after the preview is shown;
        the choices it rules out are disabled (and the options moved) when it arrives."""
        request = PreviewRequest(
            generation, self._state.source, self._state.options, self._specs, self._fits
        )
        worker = Worker(partial(_tagged_constraints, request), "constraints")
        worker.signals.returned.connect(self._constrained)
        self._audits += 1
        worker.signals.finished.connect(self._audit_finished)
        worker.start()

    def _constrained(self, tagged: tuple[int, Any]) -> None:
        generation, constraints = tagged
        if generation == self._generation and not isinstance(constraints, BaseException):
            self._state.set_model_constraints(constraints)

    def _start_audit(self, generation: int, data: Any) -> None:
        """Second step: audit the built graph and replace the plan-derived readiness."""
        worker = Worker(partial(_tagged_audit, generation, data.plan), "audit")
        worker.signals.returned.connect(self._audited)
        self._audits += 1
        worker.signals.finished.connect(self._audit_finished)
        worker.start()

    def _audited(self, tagged: tuple[int, Any]) -> None:
        generation, readiness = tagged
        preview = self._state.preview
        if generation != self._generation or preview is None or readiness is None:
            return
        if isinstance(readiness, BaseException):
            note = f"the capture audit failed: {error_text(readiness)}"
            readiness = tuple(replace(r, reasons=(*r.reasons, note)) for r in preview.readiness)
        # The audit covers the sessions it built; the others keep the plan's answer.
        audited = {r.session: r for r in readiness}
        merged = tuple(audited.pop(r.session, r) for r in preview.readiness)
        self._state.set_preview(replace(preview, readiness=merged + tuple(audited.values())))
        self.audited.emit()

    def _audit_finished(self) -> None:
        self._audits -= 1

    def _crashed(self, exc: BaseException) -> None:
        message = error_text(exc)
        self._state.set_preview(None, message)
        self._state.report_error("preview", f"The plan cannot be made: {message}")

    def _finished(self) -> None:
        self._worker = None
        if self._pending and not self._timer.isActive():
            self._on_quiet()

    def forget_spec(self, source: ModelSource) -> None:
        """Re-read a folder's config.json on the next preview."""
        self._specs.pop(source, None)
        self._fits.clear()

    @property
    def busy(self) -> bool:
        """A plan or an audit is still on its way."""
        return self._worker is not None or self._pending or self._audits > 0


def _tagged_constraints(
    request: PreviewRequest, progress: Progress, cancel: CancelToken
) -> tuple[int, Any]:
    try:
        generation, constraints = constraints_job(request, progress, cancel)
        return generation, constraints
    except Exception as exc:
        return request.generation, exc


def _tagged_audit(
    generation: int, plan: Any, progress: Progress, cancel: CancelToken
) -> tuple[int, Any]:
    """The audit job, its result (or failure) tagged with the preview's generation."""
    try:
        return generation, audit_job(plan, progress, cancel)
    except Exception as exc:
        return generation, exc


PROCESS_THRESHOLD = 512 * 1024**2
"""Planned package size from which an export runs in its own process: numpy operations on
tensors this large hold the GIL long enough to stall the UI thread."""


class ExportController(QObject):
    """Starts and cancels exports; reports stages, the log, the result and errors."""

    started = Signal(object)
    """The :class:`Worker` (tests hook into its signals)."""
    progress = Signal(float, str)
    logged = Signal(str)
    succeeded = Signal(object)
    cancelled = Signal()
    failed = Signal(str)
    finished = Signal()

    def __init__(self, state: StudioState) -> None:
        super().__init__(state)
        self._state = state
        self.confirm_replace: Callable[[Path], bool] = lambda folder: True
        """Asked before an export that will replace an existing folder (the window sets a
        dialog; tests answer directly)."""
        self.progress_interval_s = 0.04
        """Least time between two progress updates reaching the UI."""
        self.isolation: Literal["auto", "thread", "process"] = "auto"
        """Where exports run: ``auto`` uses a child process from PROCESS_THRESHOLD bytes."""
        self.worker: Worker | None = None
        self.result: Any = None
        self._started_at = 0.0
        self._last_stage = ""

    @property
    def running(self) -> bool:
        return self.worker is not None

    def request(self) -> ExportRequest | None:
        """The request for the current state, or None (with the reason shown) if it cannot
        run; replacing an existing folder needs :attr:`confirm_replace`'s yes."""
        blocker = self._state.export_blocker()
        if blocker:
            self._state.report_error("export", f"Cannot export: {blocker}.")
            return None
        output = Path(self._state.output).expanduser()
        if occupied(resolve_output(output)) and not self.confirm_replace(output):
            self.logged.emit(f"not exported: {output} was kept")
            return None
        model_args = tuple(self._state.source.export_args().items())
        return ExportRequest(
            model_args, self._state.export_options(), output, self._state.overwrite
        )

    def uses_process(self) -> bool:
        """Whether the next export runs in a child process (see :mod:`app.jobs`)."""
        if self.isolation != "auto":
            return self.isolation == "process"
        preview = self._state.preview
        # Size unknown (no preview yet, or it failed): the child process is the safe choice.
        return preview is None or preview.total_bytes >= PROCESS_THRESHOLD

    def start(self) -> Worker | None:
        """Start an export of the current state; None when one runs or the state is incomplete."""
        if self.worker is not None:
            return None
        request = self.request()
        if request is None:
            return None
        self._state.clear_error("export")
        self.result = None
        self._started_at = time.perf_counter()
        self._last_stage = ""
        in_process = self.uses_process()

        def job(progress: Progress, cancel: CancelToken) -> Any:
            if in_process:
                return run_in_child(run_export, request, progress, cancel)
            return run_export(request, progress, cancel)

        worker = Worker(job, "export", self.progress_interval_s)
        worker.signals.progress.connect(self._on_progress)
        worker.signals.returned.connect(self._on_returned)
        worker.signals.errored.connect(self._on_errored)
        worker.signals.finished.connect(self._on_finished)
        self.worker = worker
        where = "a separate process" if in_process else "a worker thread"
        self.logged.emit(f"export {self._state.source.display} -> {request.output} ({where})")
        self.started.emit(worker)
        worker.start()
        return worker

    def cancel(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            self.logged.emit("cancelling…")

    def _on_progress(self, fraction: float, message: str) -> None:
        self.progress.emit(fraction, message)
        stage = message.split(" ")[0] if message.startswith("writing") else message
        if stage != self._last_stage:
            self._last_stage = stage
            elapsed = time.perf_counter() - self._started_at
            self.logged.emit(f"[{elapsed:6.2f} s] {message}")

    def _on_returned(self, result: Any) -> None:
        self.result = result
        self.logged.emit(f"done in {result.seconds:.2f} s: {result.output}")
        self._state.set_package(str(result.output))
        self.succeeded.emit(result)

    def _on_errored(self, exc: BaseException) -> None:
        if isinstance(exc, CancelledError):
            self.logged.emit("cancelled: nothing was written")
            self.cancelled.emit()
            return
        message = error_text(exc)
        self.logged.emit(f"failed: {message}")
        self._state.report_error("export", f"Export failed: {message}")
        self.failed.emit(message)

    def _on_finished(self) -> None:
        self.worker = None
        self.finished.emit()
