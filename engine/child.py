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

An exception in the caller while it waits (Ctrl-C as :class:`KeyboardInterrupt`) ends the
child as a cancel does: at once with ``"kill"``; with ``"ask"``, its token is cancelled and it
has a minute to clean up and exit before it is terminated.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any, Literal

from engine.errors import CancelledError, EngineError
from engine.progress import CancelToken, Progress

Job = Callable[[Any, Progress, CancelToken], Any]
OnCancel = Literal["ask", "kill"]

_ASKED_WAIT_S = 60.0
"""How long an ``"ask"`` child that was asked to stop may take to clean up and exit."""
_ANSWERED_WAIT_S = 5.0
"""How long a child that answered may take to exit: its job is done."""


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
    is raised here, with the child's traceback as its cause (an exception that does not
    pickle comes as an :class:`EngineError` naming it); a child that dies without an answer
    is an :class:`EngineError`. A script that calls this needs the usual
    ``if __name__ == "__main__":`` guard of spawned processes.

    Raises:
        CancelledError: ``on_cancel="kill"`` and ``cancel`` was cancelled (or the job
            raised it).
    """
    cancel = cancel or CancelToken()
    context = multiprocessing.get_context("spawn")
    # One way, child to caller. The caller closes its copy of the sending end once the
    # child has one: a child that dies, even part way through a message, is then an end
    # of file here rather than a read that waits for ever.
    receiver, sender = context.Pipe(duplex=False)
    # A shared flag polled by the child. (An Event would be simpler, but setting one
    # blocks forever if the child exited while a thread of it was waiting on it.)
    stop = context.RawValue("b", 0)
    scratch = tempfile.mkdtemp(prefix="es-child-")
    child = context.Process(
        target=_child,
        args=(job, request, sender, stop, scratch, os.getpid()),
        name=name,
        daemon=True,
    )
    answered = False
    try:
        with _sigint_blocked():  # the child ignores it from its first instruction
            child.start()
        sender.close()
        while True:
            if cancel.cancelled:
                if on_cancel == "kill":
                    raise CancelledError()
                stop.value = 1
            # The child's exit too: a process it started may hold the pipe open after it.
            ready = wait([receiver, child.sentinel], timeout=poll_s)
            if receiver in ready:  # read what it sent before it exited, first
                try:
                    kind, payload = receiver.recv()
                except (EOFError, OSError):
                    raise _ended(child) from None
                if kind == "progress":
                    progress(*payload)
                    continue
                answered = True
                if kind == "errored":
                    exc, text = payload
                    if text and not isinstance(exc, EngineError):
                        exc.__cause__ = ChildTraceback(text)
                    raise exc
                return payload
            if ready:
                raise _ended(child)
    finally:
        stop.value = 1
        try:
            if child.pid is not None:
                if answered:  # its job is done: it only has to exit
                    _wait_for_exit(child, receiver, _ANSWERED_WAIT_S)
                elif on_cancel == "ask":  # asked to stop (above), it cleans up first
                    _wait_for_exit(child, receiver, _ASKED_WAIT_S)
        finally:
            try:
                _end(child)
            finally:
                sender.close()  # already closed unless the start failed
                receiver.close()
                shutil.rmtree(scratch, ignore_errors=True)


def _ended(child: Any) -> EngineError:
    """The error for a child that exited (or closed its end) without an answer."""
    child.join(timeout=5)
    code = child.exitcode
    if code is None:
        return EngineError("the job's process stopped answering")
    if code < 0:
        name = _signal_name(-code)
        hint = " (the system may have run out of memory)" if name == "SIGKILL" else ""
        return EngineError(f"the job's process ended without an answer: killed by {name}{hint}")
    return EngineError(f"the job's process ended without an answer (exit code {code})")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _wait_for_exit(child: Any, receiver: Any, seconds: float) -> None:
    """Wait up to ``seconds`` for the child to exit, reading (and dropping) what it still
    sends: a child blocked writing to a full pipe could not exit."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready = wait([receiver, child.sentinel], timeout=left)
        if child.sentinel in ready:
            return
        if receiver in ready:
            try:
                receiver.recv()
            except (EOFError, OSError):
                child.join(timeout=max(deadline - time.monotonic(), 0))
                return


class ChildTraceback(Exception):
    """Where in the child an exception was raised (set as its ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back from this thread, and so from a child started in it until the
    child ignores it (a spawned interpreter inherits the mask): a Ctrl-C that reaches the
    whole process group while the child starts would print its start-up's traceback."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    if os.name == "posix":
        # The first spawn also starts multiprocessing's resource tracker, and starting it
        # unblocks SIGINT in this thread (CPython does, so that the tracker can be
        # interrupted): have it running before the block.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    previous = block(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, previous)


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


def _child(job: Job, request: Any, sender: Any, stop: Any, scratch: str, caller: int) -> None:
    # Ctrl-C reaches the whole foreground process group: the caller answers it (and ends
    # this process), so here it would only print a traceback.
    with contextlib.suppress(ValueError, AttributeError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with(caller)
    os.set_inheritable(sender.fileno(), False)  # a process the job starts must not keep it
    for variable in ("TMPDIR", "TEMP", "TMP"):  # removed by the caller, whatever happens
        os.environ[variable] = scratch
    tempfile.tempdir = scratch
    token = CancelToken()
    lock = threading.Lock()  # progress may come from a job's threads

    def send(message: tuple[str, Any]) -> None:
        with lock:
            sender.send(message)

    parent = multiprocessing.parent_process()

    def watch() -> None:
        while not stop.value:
            # (On Windows getppid() keeps the id of a parent that exited.)
            if os.getppid() != caller or (parent is not None and not parent.is_alive()):
                os._exit(1)  # the caller was killed: nobody will read an answer
            time.sleep(0.02)
        token.cancel()

    threading.Thread(target=watch, daemon=True).start()
    last_at, last_message = [0.0], [""]

    def progress(fraction: float, message: str) -> None:
        # Repeats of one step are thinned out; a new step always goes (a long C call may
        # follow it, and the caller would show the step before for all of it).
        now = time.monotonic()
        if fraction >= 1.0 or message != last_message[0] or now - last_at[0] >= 0.02:
            last_at[0], last_message[0] = now, message
            send(("progress", (fraction, message)))

    try:
        answer = job(request, progress, token)
    except BaseException as exc:  # every failure goes back to the caller
        send(("errored", (_picklable(exc), traceback.format_exc())))
    else:
        send(("returned", answer))
    finally:
        sender.close()


def _die_with(caller: int) -> None:
    """On Linux, have the kernel end this process when its caller dies: the watch thread
    cannot run while the job is inside a C call that holds the GIL."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != caller:
        os._exit(1)  # it died before the request above


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineError(f"{type(exc).__name__}: {exc}")
    return exc
