"""engine.child: work in a spawned process answers Cancel and Ctrl-C at once, whatever the
child is computing, and leaves nothing behind."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.child import ChildTraceback, run_in_child
from engine.errors import CancelledError, EngineError, OptionsError
from engine.progress import CancelToken

ROOT = Path(__file__).resolve().parents[2]


def _answer(request: int, progress: Any, cancel: Any) -> dict[str, int]:
    progress(0.5, "halfway")
    return {"twice": request * 2, "pid": os.getpid()}


def _refuse(request: Any, progress: Any, cancel: Any) -> None:
    raise OptionsError("no such option; use --another")


def _spin_in_c(request: Any, progress: Any, cancel: Any) -> None:
    """Writes a file to its temporary folder, says where, and once the caller has read
    that, never returns nor lets go of its GIL: one C call (what genai's compute does).
    (Holding the GIL, it could not send a message after that.)"""
    scratch = Path(tempfile.gettempdir())
    (scratch / "scratch.bin").write_bytes(b"left behind?")
    progress(0.1, str(scratch))
    while not (scratch / "read").exists():
        time.sleep(0.01)
    sum(itertools.repeat(1))


def _read(message: str) -> Path:
    """The caller's side of :func:`_spin_in_c`: the folder, its job now in its C call."""
    scratch = Path(message)
    (scratch / "read").touch()
    time.sleep(1)  # time to see that and start spinning, on a busy machine too
    return scratch


def _ask_then_stop(request: Any, progress: Any, cancel: Any) -> str:
    progress(0.1, "started")
    while not cancel.cancelled:
        time.sleep(0.01)
    return "stopped at a check"


def test_the_answer_and_the_progress_come_back():
    seen: list[tuple[float, str]] = []
    answer = run_in_child(_answer, 21, lambda f, m: seen.append((f, m)))
    assert answer["twice"] == 42
    assert answer["pid"] != os.getpid()
    assert seen == [(0.5, "halfway")]
    assert not multiprocessing.active_children()


def test_what_the_job_raises_is_raised_here():
    with pytest.raises(OptionsError, match="use --another"):
        run_in_child(_refuse, None, lambda f, m: None)


def _fail(request: Any, progress: Any, cancel: Any) -> None:
    {}["missing"]  # a bug, not an EngineError


def test_a_bug_in_the_job_comes_back_with_the_childs_traceback():
    with pytest.raises(KeyError) as caught:
        run_in_child(_fail, None, lambda f, m: None)
    cause = caught.value.__cause__
    assert isinstance(cause, ChildTraceback)
    assert "in _fail" in cause.text and '{}["missing"]' in cause.text


def _two_steps(request: Any, progress: Any, cancel: Any) -> None:
    progress(0.1, "loading")
    progress(0.2, "warm-up 1/1")  # at once: a long C call would follow it


def test_a_new_step_is_never_thinned_out():
    seen: list[str] = []
    run_in_child(_two_steps, None, lambda f, m: seen.append(m))
    assert seen == ["loading", "warm-up 1/1"]


def _big_message(request: Any, progress: Any, cancel: Any) -> None:
    progress(0.1, str(os.getpid()))
    progress(0.2, "x" * 10_000_000)  # far more than a pipe holds: the write blocks


def test_a_child_killed_part_way_through_a_message_is_an_error_not_a_hang():
    """The OOM killer's way: the caller must not wait for the rest of a message."""

    def progress(fraction: float, message: str) -> None:
        if fraction == 0.1:
            time.sleep(1)  # the child is now part way through its big write
            os.kill(int(message), signal.SIGKILL)

    outcome = _run_beside(lambda: run_in_child(_big_message, None, progress))
    assert "hung" not in outcome
    assert isinstance(outcome.get("raised"), EngineError)
    assert "ended without an answer" in str(outcome["raised"])


def _run_beside(target: Any) -> dict[str, Any]:
    """Run ``target()`` on a thread; what it raised or returned, or "hung" after 120 s
    (the job never ends by itself, so an unanswered cancel would hang the test)."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["returned"] = target()
        except BaseException as exc:
            outcome["raised"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=120)
    if thread.is_alive():
        outcome["hung"] = True
    return outcome


def test_kill_ends_a_child_stuck_in_a_c_call_and_removes_its_temporary_folder():
    cancel = CancelToken()
    scratch: list[Path] = []

    def progress(fraction: float, message: str) -> None:
        scratch.append(_read(message))
        cancel.cancel()

    outcome = _run_beside(
        lambda: run_in_child(_spin_in_c, None, progress, cancel, on_cancel="kill")
    )
    assert "hung" not in outcome
    assert isinstance(outcome.get("raised"), CancelledError)
    assert scratch and scratch[0].name.startswith("es-child-")
    assert not scratch[0].exists()  # the file the child wrote went with its folder
    assert not multiprocessing.active_children()


def test_ask_lets_the_job_stop_at_its_own_check_and_answer():
    cancel = CancelToken()
    outcome = _run_beside(
        lambda: run_in_child(_ask_then_stop, None, lambda f, m: cancel.cancel(), cancel)
    )
    assert outcome.get("returned") == "stopped at a check"


def test_an_interrupt_while_waiting_ends_a_killable_child_at_once():
    def progress(fraction: float, message: str) -> None:
        _read(message)
        raise KeyboardInterrupt  # Ctrl-C, as the CLI's handler raises it in the caller

    outcome = _run_beside(lambda: run_in_child(_spin_in_c, None, progress, on_cancel="kill"))
    assert isinstance(outcome.get("raised"), KeyboardInterrupt)
    assert not multiprocessing.active_children()


def _clean_up_when_cancelled(marker: Path, progress: Any, cancel: Any) -> None:
    progress(0.1, "started")
    while not cancel.cancelled:
        time.sleep(0.01)
    marker.write_text("cleaned up")  # what an export does with its staging folder


def test_an_interrupt_while_waiting_lets_an_asked_child_clean_up(tmp_path: Path):
    def progress(fraction: float, message: str) -> None:
        raise KeyboardInterrupt

    marker = tmp_path / "marker"
    outcome = _run_beside(lambda: run_in_child(_clean_up_when_cancelled, marker, progress))
    assert isinstance(outcome.get("raised"), KeyboardInterrupt)
    assert marker.read_text() == "cleaned up"
    assert not multiprocessing.active_children()


def _announce_then_spin(request: Any, progress: Any, cancel: Any) -> None:
    progress(0.1, str(os.getpid()))
    time.sleep(0.5)  # the message on its way, then one C call that never lets go
    sum(itertools.repeat(1))


def test_a_child_whose_caller_was_killed_exits_even_inside_a_c_call():
    """The child's watch thread cannot run while its job holds the GIL: the kernel ends
    it (PR_SET_PDEATHSIG on Linux)."""
    script = (
        "from engine.child import run_in_child\n"
        "from tests.engine.test_child import _announce_then_spin\n"
        "run_in_child(_announce_then_spin, None, lambda f, m: print(m, flush=True))\n"
    )
    caller = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert caller.stdout is not None
    child = int(caller.stdout.readline())
    time.sleep(1.5)  # now spinning
    caller.kill()
    caller.wait()
    for _ in range(600):  # at once by the kernel; allow a busy machine a minute
        if not _alive(child):
            break
        time.sleep(0.1)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive


FIRST_CHILD = """
import os, sys, time
from engine.child import run_in_child
from tests.engine.test_child import _ask_then_stop

def started(fraction, message):
    sys.stdout.write("started\\n")
    sys.stdout.flush()

try:
    run_in_child(_ask_then_stop, None, started)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("delay_ms", [0, 10, 20, 40, 80])
def test_ctrl_c_while_the_first_child_starts_prints_no_traceback(delay_ms: int):
    """Ctrl-C reaches the whole process group, the starting child too: it must be
    blocked there until the child ignores it. The first child a process starts is the
    one at risk (starting multiprocessing's resource tracker unblocks SIGINT)."""
    caller = subprocess.Popen(
        [sys.executable, "-c", FIRST_CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_foreground_job,
        start_new_session=True,
    )
    for _ in range(3000):  # until the child exists (its Python is starting up)
        if _children(caller.pid):
            break
        time.sleep(0.001)
    time.sleep(delay_ms / 1000)
    os.killpg(caller.pid, signal.SIGINT)
    _, stderr = caller.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr
    assert caller.returncode == 130, stderr


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread may end while we look
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited (its parent is gone; init reaps it)


def _killed(request: Any, progress: Any, cancel: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_child_is_named_as_such():
    with pytest.raises(EngineError, match=r"killed by SIGKILL \(the system may have run out"):
        run_in_child(_killed, None, lambda f, m: None)


def _leave_a_process_behind(request: Any, progress: Any, cancel: Any) -> None:
    subprocess.Popen(["sleep", "60"], close_fds=False)  # may inherit what it is given
    os._exit(3)


def test_a_process_the_job_started_does_not_hold_the_caller():
    began = time.monotonic()
    with pytest.raises(EngineError, match=r"exit code 3"):
        run_in_child(_leave_a_process_behind, None, lambda f, m: None)
    assert time.monotonic() - began < 30  # not the 60 s of the process left behind


def test_a_request_that_cannot_be_sent_is_that_error():
    with pytest.raises(TypeError, match="pickle"):
        run_in_child(_answer, threading.Lock(), lambda f, m: None)


def test_a_child_that_dies_is_an_error():
    with pytest.raises(EngineError, match=r"ended without an answer \(exit code 3\)"):
        run_in_child(_die, None, lambda f, m: None)


def _die(request: Any, progress: Any, cancel: Any) -> None:
    os._exit(3)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["genai", "ort"])
def test_ctrl_c_during_a_long_prompt_is_answered_at_once(
    runtime: str, qwen_package: Path, tmp_path: Path
):
    """Before each run had a process of its own, Ctrl-C during this 2,000-token prompt
    waited for the prompt pass: 26.6 s through genai, 12.1 s through our runner (2 idle
    cores). Sent 8 s in, it lands in the package's load or its prompt pass, both single C
    calls; wherever it lands, the answer must come within seconds."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    command = [sys.executable, "-m", "engine", "bench", str(qwen_package), "--runtime", runtime]
    command += ["--prompt-len", "2000", "--new-tokens", "4", "--repeats", "3", "--warmup", "1"]
    bench = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        preexec_fn=_as_a_foreground_job,
        start_new_session=True,  # a process group of its own, as a terminal's job has
    )
    time.sleep(8)
    assert bench.poll() is None, bench.communicate()
    sent = time.monotonic()
    os.killpg(bench.pid, signal.SIGINT)  # Ctrl-C: to the group, the run's process too
    _, stderr = bench.communicate(timeout=300)
    answered = time.monotonic() - sent
    assert bench.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "cancelled: interrupted"
    assert "Traceback" not in stderr
    assert answered < 5.0, f"Ctrl-C answered after {answered:.1f} s"
    assert list(scratch.iterdir()) == []  # the run's temporary folder went with it


def _as_a_foreground_job() -> None:
    # A background job of a non-interactive shell inherits SIGINT ignored (see
    # tests/engine/test_destination.py); a terminal's foreground job has the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def qwen_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2.5-0.5B's shape with random weights on the CPU: big enough that a
    2,000-token prompt takes seconds."""
    from engine.options import ExportOptions
    from engine.pipeline import export

    out = tmp_path_factory.mktemp("qwen") / "pkg"
    export(out, preset="qwen2.5-0.5b", options=ExportOptions(ep="cpu", random_weights=True))
    return out
