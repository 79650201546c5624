"""Long work in a spawned child process, so that the caller answers Ctrl-C and Cancel at once.

Python runs its signal handlers, and any other thread, only between bytecodes. A C call
defers them until it returns, and onnxruntime-genai computes holding the GIL: measured on
a 2-core machine, Ctrl-C during a 2,000-token prompt of Qwen2.5-0.5B on the CPU EP was
answered 26.6 s later through genai and 12.1 s later through our runner (a session's run);
on WebGPU's software adapter one prompt pass of Gemma 4 E2B is ~30 s and its load ~17 s.
In a child, the caller stays in Python, polling the child's messages: progress and the
answer come back through a queue, and a cancel or an interrupt reaches the child at once.

A job is a module-level function ``job(request, progress, cancel)`` with a picklable
request and answer (Orange3-style, as everywhere in the engine). Two ways to cancel:

- ``on_cancel="ask"``: the child's token is cancelled and its answer awaited, for jobs that
  clean up after themselves (an export removes its staging folder) or return what they
  finished;
- ``on_cancel="kill"``: the child is terminated at once, for jobs that write nothing the
  user keeps (a benchmark run). Whatever it wrote to its temporary folder, which is its
  own and removed after it, goes with it.

An exception in the caller while it waits (Ctrl-C as :class:`KeyboardInterrupt`) always
terminates the child at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue as queue_module
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from engine.errors import CancelledError, EngineError
from engine.progress import CancelToken, Progress

Job = Callable[[Any, Progress, CancelToken], Any]
OnCancel = Literal["ask", "kill"]

_ANSWER_WAIT_S = 60.0
"""How long a child that answered may take to exit before it is terminated."""


def run_in_child(
    job: Job,
    request: Any,
    progress: Progress,
    cancel: CancelToken | None = None,
    *,
    on_cancel: OnCancel = "ask",
    poll_s: float = 0.05,
    name: str = "export-studio-job",
) -> Any:
    """Run ``job(request, progress, cancel)`` in a spawned process and return its answer.

    ``job`` must be a module-level function and ``request`` picklable. What the job raises
    is raised here (an exception that does not pickle as an :class:`EngineError` naming
    it); a child that dies without an answer is an :class:`EngineError`.

    Raises:
        CancelledError: ``on_cancel="kill"`` and ``cancel`` was cancelled (or the job
            raised it).
    """
    cancel = cancel or CancelToken()
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    # A shared flag polled by the child. (An Event would be simpler, but setting one
    # blocks forever if the child exited while a thread of it was waiting on it.)
    stop = context.RawValue("b", 0)
    scratch = tempfile.mkdtemp(prefix="es-child-")
    child = context.Process(
        target=_child, args=(job, request, messages, stop, scratch), name=name, daemon=True
    )
    answered = False
    try:
        child.start()
        while True:
            if cancel.cancelled:
                if on_cancel == "kill":
                    raise CancelledError()
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
                continue
            answered = True
            if kind == "errored":
                raise payload
            return payload
    finally:
        stop.value = 1
        if answered:
            child.join(timeout=_ANSWER_WAIT_S)
        _end(child)
        messages.close()
        messages.cancel_join_thread()  # a killed child's unread messages must not hang us
        shutil.rmtree(scratch, ignore_errors=True)


def _end(child: Any) -> None:
    """Terminate a child that is still running (SIGTERM, then SIGKILL)."""
    if child.pid is None:
        return  # never started
    if child.is_alive():
        child.terminate()
        child.join(timeout=5)
    if child.is_alive():
        child.kill()
        child.join(timeout=5)


def _child(job: Job, request: Any, messages: Any, stop: Any, scratch: str) -> None:
    # Ctrl-C reaches the whole foreground process group: the caller answers it (and ends
    # this process), so here it would only print a traceback.
    with contextlib.suppress(ValueError, AttributeError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TMPDIR"] = tempfile.tempdir = scratch  # removed by the caller, whatever happens
    token = CancelToken()
    parent = multiprocessing.parent_process()

    def watch() -> None:
        while not stop.value:
            if parent is not None and not parent.is_alive():
                os._exit(1)  # the caller was killed: nobody will read an answer
            time.sleep(0.02)
        token.cancel()

    threading.Thread(target=watch, daemon=True).start()
    last = [0.0]

    def progress(fraction: float, message: str) -> None:
        now = time.monotonic()
        if fraction >= 1.0 or now - last[0] >= 0.02:
            last[0] = now
            messages.put(("progress", (fraction, message)))

    try:
        answer = job(request, progress, token)
    except BaseException as exc:  # every failure goes back to the caller
        messages.put(("errored", _picklable(exc)))
    else:
        messages.put(("returned", answer))


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineError(f"{type(exc).__name__}: {exc}")
    return exc
