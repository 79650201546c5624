"""Progress reporting and cancellation for long engine work.

Long work is a plain function that takes ``progress(fraction, message)`` and a
:class:`CancelToken`. The CLI drives it with a progress bar, the app from a worker thread;
tests pass a recording callable and no event loop.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, Protocol

from engine.errors import CancelledError


class Progress(Protocol):
    """Receives a fraction of the work done, in [0, 1], and a short stage message."""

    def __call__(self, fraction: float, message: str) -> None: ...


def no_progress(fraction: float, message: str) -> None:
    """A progress sink that ignores everything."""


class CancelToken:
    """A thread-safe flag the caller sets and the work checks at safe points."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise CancelledError()


def sub_progress(progress: Progress, start: float, end: float) -> Progress:
    """Map a sub-step's [0, 1] onto [start, end] of the parent's range."""
    span = end - start

    def report(fraction: float, message: str) -> None:
        progress(start + span * min(max(fraction, 0.0), 1.0), message)

    return report


class Stepper:
    """Counts weighted steps of a known total and reports them as fractions."""

    def __init__(self, progress: Progress, total: float, cancel: CancelToken | None = None):
        self._progress = progress
        self._total = max(total, 1e-12)
        self._done = 0.0
        self._cancel = cancel
        self._lock = threading.Lock()

    def advance(self, amount: float, message: str) -> None:
        with self._lock:
            self._done += amount
            fraction = min(self._done / self._total, 1.0)
        self._progress(fraction, message)
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()


ProgressFactory = Callable[[float, float], Progress]


class InterruptOnSignals:
    """Within the block, SIGTERM and SIGHUP interrupt the work as Ctrl-C (SIGINT) does.

    The first of these signals sets :attr:`cancel` (work that checks the token, such as an
    export's writer threads, stops at its next check) and raises :class:`KeyboardInterrupt`
    in the main thread, so the work unwinds through its cleanup (a cancelled export leaves
    nothing behind). Later SIGTERM / SIGHUP are ignored while that cleanup runs; a second
    Ctrl-C interrupts as usual. ``signum`` tells which signal it was. Outside the main
    thread, or where the signals do not exist, the block runs unchanged.
    """

    def __init__(self, cancel: CancelToken | None = None) -> None:
        self.cancel = cancel or CancelToken()
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> InterruptOnSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            number = getattr(signal, name, None)
            if number is None or signal.getsignal(number) is signal.SIG_IGN:
                continue  # e.g. SIGINT of a background job: the shell asked to ignore it
            self._saved[number] = signal.signal(number, self._interrupt)
        return self

    def _interrupt(self, signum: int, frame: object) -> None:
        if self.signum is not None and signum != getattr(signal, "SIGINT", None):
            return
        self.signum = signum
        self.cancel.cancel()
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._saved.items():
            signal.signal(number, handler)
        self._saved.clear()
