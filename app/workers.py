"""Workers: the only place long work runs (superqt-style, on the global QThreadPool).

A job is a plain function ``job(progress, cancel) -> result`` (Orange3-style: testable with
a recording ``progress`` and a :class:`engine.progress.CancelToken`, no event loop).
:class:`Worker` runs it on a pool thread and reports through signals that live on a
separate QObject: ``started``, ``progress(fraction, message)``, ``returned(result)``,
``errored(exception)``, ``finished``. Progress is throttled so a job that reports per
tensor cannot flood the UI thread; a report held back is sent when its interval ends (the
last step's name is never lost to a quicker one before it).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QRunnable, QThreadPool, Signal, SignalInstance
from shiboken6 import isValid

from engine.progress import CancelToken, Progress

Job = Callable[[Progress, CancelToken], Any]

_ACTIVE: set[Worker] = set()
"""Workers in flight: Python must keep them alive until they finish."""
_SHUTDOWN_HOOKED = False
SHUTDOWN_WAIT_MS = 10_000
"""How long leaving the app waits for cancelled workers to reach a cancel point."""


class WorkerSignals(QObject):
    """Signals of one worker (a QRunnable cannot carry signals itself)."""

    started = Signal()
    progress = Signal(float, str)
    returned = Signal(object)
    errored = Signal(object)
    finished = Signal()


class Worker(QRunnable):
    """Runs one job on a pool thread; cancel it with :meth:`cancel`."""

    def __init__(self, job: Job, name: str = "job", min_interval_s: float = 0.04) -> None:
        super().__init__()
        self.setAutoDelete(False)
        self.name = name
        self.signals = WorkerSignals()
        self.cancel_token = CancelToken()
        self._job = job
        self._min_interval = min_interval_s
        self._last_emit = 0.0
        self._pending: tuple[float, str] | None = None
        """The latest report held back, sent by a timer at the end of its interval."""
        self._closed = False
        self._lock = threading.Lock()
        self._running = False
        self.signals.finished.connect(self._forget)

    # Runs on the pool thread.
    def run(self) -> None:
        self._running = True
        self._emit(self.signals.started)
        try:
            result = self._job(self._report, self.cancel_token)
        except BaseException as exc:  # every failure goes to the UI, none is swallowed
            self._close()
            self._emit(self.signals.errored, exc)
        else:
            self._close()
            self._emit(self.signals.returned, result)
        finally:
            self._running = False
            self._emit(self.signals.finished)

    def _emit(self, signal: SignalInstance, *args: Any) -> None:
        """Emit unless the signals object is gone. It lives as long as this worker, which
        :func:`shutdown_workers` waits for; this guards a job still running past that wait
        at interpreter exit, when nobody is left to tell."""
        if isValid(self.signals):
            with contextlib.suppress(RuntimeError):  # deleted between the check and the emit
                signal.emit(*args)

    def _report(self, fraction: float, message: str) -> None:
        now = time.monotonic()
        with self._lock:  # emitting under it keeps reports in order (a signal only posts)
            if self._closed:
                return
            wait = self._min_interval - (now - self._last_emit)
            held = self._pending is not None
            if fraction >= 1.0 or wait <= 0:
                self._last_emit, self._pending = now, None
                self._emit(self.signals.progress, float(fraction), str(message))
                return
            self._pending = (float(fraction), str(message))
        if not held:  # one timer per interval sends whatever is latest by then
            timer = threading.Timer(wait, self._flush)
            timer.daemon = True
            timer.start()

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is not None and not self._closed:
                self._last_emit = time.monotonic()
                self._emit(self.signals.progress, *pending)

    def _close(self) -> None:
        """No progress after the outcome (a held report is dropped, a timer finds none)."""
        with self._lock:
            self._closed, self._pending = True, None

    # Called from the UI thread.
    def start(self, pool: QThreadPool | None = None) -> Worker:
        """Queue the job on ``pool`` (the global pool by default); returns self."""
        _hook_shutdown()
        _ACTIVE.add(self)
        (pool or QThreadPool.globalInstance()).start(self)
        return self

    def cancel(self) -> None:
        """Ask the job to stop at its next cancel point."""
        self.cancel_token.cancel()

    @property
    def running(self) -> bool:
        return self._running

    def _forget(self) -> None:
        _ACTIVE.discard(self)


def start_worker(
    job: Job,
    *,
    owner: QObject,
    name: str = "job",
    on_returned: Callable[[Any], None] | None = None,
    on_errored: Callable[[BaseException], None] | None = None,
    on_progress: Callable[[float, str], None] | None = None,
    on_finished: Callable[[], None] | None = None,
) -> Worker:
    """Create, connect and start a worker in one call.

    The callbacks run on the UI thread and only while ``owner`` (the widget that asked)
    still exists: a result that arrives after its window closed is dropped.
    """
    worker = Worker(job, name)
    for signal, callback in (
        (worker.signals.returned, on_returned),
        (worker.signals.errored, on_errored),
        (worker.signals.progress, on_progress),
        (worker.signals.finished, on_finished),
    ):
        if callback is not None:
            signal.connect(_while_alive(owner, callback))
    return worker.start()


def _while_alive(owner: QObject, callback: Callable[..., None]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        if isValid(owner):
            callback(*args)

    return call


def active_workers() -> list[Worker]:
    """Workers not finished yet (for tests and a clean shutdown)."""
    return list(_ACTIVE)


def shutdown_workers(wait_ms: int = SHUTDOWN_WAIT_MS) -> bool:
    """Cancel every worker in flight and wait for the pool; True when all have finished.

    Runs when the application quits and at interpreter exit, so a script that creates a
    window and ends (or a user quitting right after launch) never leaves a job emitting
    into objects Python has already torn down.
    """
    for worker in list(_ACTIVE):
        worker.cancel()
    return bool(QThreadPool.globalInstance().waitForDone(wait_ms))


def _hook_shutdown() -> None:
    global _SHUTDOWN_HOOKED
    if _SHUTDOWN_HOOKED:
        return
    _SHUTDOWN_HOOKED = True
    atexit.register(shutdown_workers)
    app = QCoreApplication.instance()
    if app is not None:
        app.aboutToQuit.connect(shutdown_workers)
