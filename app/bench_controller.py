"""The Benchmark tab's controller: what a package can run on here, the runs, the history.

It starts the jobs of :mod:`app.package_jobs` in workers and turns their results into
signals and history entries; the panel only lays out and wires.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.history import BenchHistory
from app.package_jobs import BenchOutcome, BenchRequest, PackageFacts, bench_job, package_facts_job
from app.state import StudioState
from app.wording import error_text
from app.workers import Worker
from engine.errors import CancelledError


class BenchController(QObject):
    """Runs benchmarks of one package at a time and keeps every result."""

    factsChanged = Signal(object)
    """The :class:`PackageFacts` of the chosen package, or None (not a package)."""
    progress = Signal(float, str)
    completed = Signal(object)
    """A :class:`BenchOutcome`: the runs that finished, and what stopped the others."""
    cancelled = Signal()
    failed = Signal(str)
    finished = Signal()
    historyChanged = Signal()
    packageChanged = Signal(object)
    """Another package (a :class:`Path`, or None) was chosen: what was said of the last
    one no longer applies."""

    def __init__(self, state: StudioState, history: BenchHistory) -> None:
        super().__init__(state)
        self._state = state
        self.history = history
        self.facts: PackageFacts | None = None
        self.worker: Worker | None = None
        self._facts_for: Path | None = None

    @property
    def running(self) -> bool:
        return self.worker is not None

    def inspect(self, folder: str) -> None:
        """Find out what the package at ``folder`` can be benchmarked on (in a worker)."""
        path = Path(folder).expanduser() if folder.strip() else None
        changed = path != self._facts_for
        self._facts_for = path
        self.facts = None
        self.factsChanged.emit(None)
        if changed:
            self.packageChanged.emit(path)
        if path is None:
            return
        worker = Worker(partial(_tagged_facts, path), "package-facts")
        worker.signals.returned.connect(self._facts_returned)
        worker.start()

    @property
    def package(self) -> Path | None:
        """The package chosen now (its facts may still be on their way)."""
        return self._facts_for

    def runs_of_package(self) -> list[Any]:
        """The history's runs of the chosen package (oldest first)."""
        if self._facts_for is None:
            return []
        here = _same_place(self._facts_for)
        return [run for run in self.history.runs if _same_place(run.result.package) == here]

    def _facts_returned(self, tagged: tuple[Path, Any]) -> None:
        path, facts = tagged
        if path != self._facts_for:
            return  # the user has chosen another folder since
        if isinstance(facts, BaseException):
            self._state.report_error("bench", f"Cannot benchmark this folder: {error_text(facts)}")
            return
        self._state.clear_error("bench")
        self.facts = facts
        self.factsChanged.emit(facts)

    def run(self, request: BenchRequest) -> Worker | None:
        if self.worker is not None:
            return None
        self._state.clear_error("bench")
        # Each run goes to a process of its own (``isolated``): onnxruntime-genai computes
        # holding Python's GIL, which froze the window for whole tokens (6 s each through
        # WebGPU on lavapipe) on a thread, and a Cancel is answered at once.
        worker = Worker(partial(bench_job, request), "bench")
        worker.signals.progress.connect(self.progress)
        worker.signals.returned.connect(self._returned)
        worker.signals.errored.connect(self._errored)
        worker.signals.finished.connect(self._finished)
        self.worker = worker.start()
        return self.worker

    def cancel(self) -> None:
        if self.worker is not None:
            self.worker.cancel()

    def clear_history(self) -> None:
        self.history.clear()
        self.historyChanged.emit()

    def _returned(self, outcome: BenchOutcome) -> None:
        for result in outcome.results:
            self.history.add(result)
        self.historyChanged.emit()
        self.completed.emit(outcome)

    def _errored(self, exc: BaseException) -> None:
        if isinstance(exc, CancelledError):
            self.cancelled.emit()
            return
        message = error_text(exc)
        self._state.report_error("bench", f"Benchmark failed: {message}")
        self.failed.emit(message)

    def _finished(self) -> None:
        self.worker = None
        self.finished.emit()


def _same_place(path: Path | str) -> Path:
    return Path(path).expanduser().resolve()


def _tagged_facts(path: Path, progress: Any, cancel: Any) -> tuple[Path, Any]:
    try:
        return path, package_facts_job(path, progress, cancel)
    except Exception as exc:
        return path, exc
