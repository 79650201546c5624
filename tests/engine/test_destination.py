"""Where a package may be written: never over the input, the current folder, a parent of
either or a folder that is not ours; and nothing left behind when an export fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from engine.errors import PackageError, WeightsError
from engine.options import ExportOptions
from engine.package import MANIFEST, PARTIAL_MARKER
from engine.pipeline import export
from tests._support.cli import ROOT
from tests._support.fake_checkpoint import write_checkpoint


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "models" / "M")


@pytest.mark.parametrize("target", ["model", "its parent", "the grandparent"])
def test_overwrite_never_replaces_the_input_or_a_folder_holding_it(
    model: Path, tmp_path: Path, target: str
):
    out = {"model": model, "its parent": model.parent, "the grandparent": tmp_path}[target]
    before = snapshot(tmp_path)
    with pytest.raises(PackageError, match="would delete it") as info:
        export(out, model_dir=model, overwrite=True)
    assert "input folder" in str(info.value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("output", [".", "", "..", "sub/.."])
def test_overwrite_never_replaces_the_current_folder(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
):
    cwd = tmp_path / "work"
    (cwd / "sub").mkdir(parents=True)
    (cwd / "notes.txt").write_text("mine")
    monkeypatch.chdir(cwd)
    before = snapshot(tmp_path)
    with pytest.raises(PackageError, match=r"no output folder|current folder"):
        export(output, model_dir=model, overwrite=True)
    assert snapshot(tmp_path) == before


def test_overwrite_refuses_a_folder_that_is_not_our_package(model: Path, tmp_path: Path):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"\xff\xd8 not a package")
    with pytest.raises(PackageError, match=f"not a package written by this tool.*{MANIFEST}"):
        export(out, model_dir=model, overwrite=True)
    assert snapshot(out) == {"holiday.jpg": b"\xff\xd8 not a package"}
    # A manifest that another tool wrote does not count either.
    (out / MANIFEST).write_text(json.dumps({"producer": "someone-else"}))
    with pytest.raises(PackageError, match="not a package written by this tool"):
        export(out, model_dir=model, overwrite=True)


def test_overwrite_replaces_an_empty_folder_and_our_own_package(model: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    export(out, model_dir=model, overwrite=True)
    first = snapshot(out)
    export(out, model_dir=model, overwrite=True, options=ExportOptions(dtype="fp16"))
    assert snapshot(out) != first and (out / MANIFEST).is_file()
    assert leftovers(tmp_path) == []


def a_file_is_saved_before_the_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user saves ``draft.txt`` into the output folder just before an export moves its
    package there."""
    from engine import package

    swap = package._swap_into_place

    def user_saves_a_file_meanwhile(staging: Path, output: Path, overwrite: bool) -> None:
        (output / "draft.txt").write_text("mine")
        swap(staging, output, overwrite)

    monkeypatch.setattr(package, "_swap_into_place", user_saves_a_file_meanwhile)


def test_an_empty_folder_made_for_the_package_needs_no_overwrite(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Made with mkdir first, as many users do: nothing to lose. One that gets a file while
    the export runs is left as it is."""
    out = tmp_path / "out"
    out.mkdir()
    export(out, model_dir=model)
    assert (out / MANIFEST).is_file() and leftovers(tmp_path) == []
    with pytest.raises(PackageError, match="already exists"):
        export(out, model_dir=model)  # now a package: replaced only with --overwrite
    other = tmp_path / "other"
    other.mkdir()
    a_file_is_saved_before_the_swap(monkeypatch)
    with pytest.raises(PackageError, match="stopped being empty while exporting"):
        export(other, model_dir=model)
    assert [p.name for p in other.iterdir()] == ["draft.txt"]
    assert leftovers(tmp_path) == []


def test_an_empty_folder_keeps_its_mode_and_comes_back_if_the_move_fails(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    made = tmp_path / "shared"
    made.mkdir()
    made.chmod(0o2770)
    export(made, model_dir=model)
    assert (made / MANIFEST).is_file() and made.stat().st_mode & 0o7777 == 0o2770
    again = tmp_path / "again"
    again.mkdir()
    again.chmod(0o750)
    rename = Path.rename

    def disk_full(self: Path, target: Path) -> Path:
        if Path(target) == again:
            raise OSError(28, "No space left on device")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", disk_full)
    with pytest.raises(PackageError, match="No space left on device; nothing was left behind"):
        export(again, model_dir=model)
    assert again.is_dir() and not any(again.iterdir())
    assert again.stat().st_mode & 0o7777 == 0o750
    assert leftovers(tmp_path) == []


def test_an_empty_mount_point_is_not_taken_for_a_folder_made_for_the_package(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """It cannot be swapped for the package folder: refused up front, as any existing
    folder is without --overwrite."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == mount or real(p))
    with pytest.raises(PackageError, match="already exists"):
        export(mount, model_dir=model)
    assert not any(mount.iterdir()) and leftovers(tmp_path) == []


def test_overwrite_never_deletes_files_the_user_put_into_our_package(model: Path, tmp_path: Path):
    out = tmp_path / "out"
    export(out, model_dir=model)
    (out / "NOTES.md").write_text("what I found")
    (out / "results").mkdir()
    (out / "results" / "bench.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(PackageError, match=r"did not write \('NOTES.md', 'results/'\)"):
        export(out, model_dir=model, overwrite=True, options=ExportOptions(dtype="fp16"))
    assert snapshot(tmp_path) == before
    assert leftovers(tmp_path) == []
    # Moved out, the package is ours alone again and is replaced.
    shutil.move(out / "NOTES.md", tmp_path / "NOTES.md")
    shutil.rmtree(out / "results")
    export(out, model_dir=model, overwrite=True, options=ExportOptions(dtype="fp16"))
    listed = json.loads((out / MANIFEST).read_text())["files"]
    assert listed == sorted(p.name for p in out.iterdir())


def test_a_package_from_before_the_file_list_is_replaced_only_with_its_own_files(
    model: Path, tmp_path: Path
):
    out = tmp_path / "out"
    export(out, model_dir=model)
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["files"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "bench.json").write_text("{}")  # not a name this tool writes
    with pytest.raises(PackageError, match=r"'bench\.json'"):
        export(out, model_dir=model, overwrite=True)
    (out / "bench.json").unlink()
    export(out, model_dir=model, overwrite=True)
    assert leftovers(tmp_path) == []


def test_a_file_added_while_exporting_stops_the_swap(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    out = tmp_path / "out"
    export(out, model_dir=model)
    a_file_is_saved_before_the_swap(monkeypatch)
    with pytest.raises(PackageError, match="changed while exporting"):
        export(out, model_dir=model, overwrite=True)
    assert (out / "draft.txt").read_text() == "mine" and (out / MANIFEST).is_file()
    assert leftovers(tmp_path) == []


def test_a_symlinked_output_is_written_through_and_keeps_its_link(model: Path, tmp_path: Path):
    real = tmp_path / "real"
    export(real, model_dir=model)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    result = export(link, model_dir=model, overwrite=True, options=ExportOptions(dtype="fp16"))
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert result.output == real.resolve()
    assert json.loads((real / MANIFEST).read_text())["options"]["dtype"] == "fp16"
    assert leftovers(tmp_path) == []


def test_a_dangling_symlink_output_is_a_clear_error(model: Path, tmp_path: Path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(PackageError, match=r"symbolic link to .*gone', which does not exist"):
        export(link, model_dir=model, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "models"]


def test_a_failed_build_removes_the_parent_folders_it_created(model: Path, tmp_path: Path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.3.mlp.up_proj.weight"][5, 7] = float("nan")
    save_file(tensors, str(model / "model.safetensors"))
    with pytest.raises(WeightsError, match="NaN"):
        export(tmp_path / "a" / "b" / "c" / "out", model_dir=model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
    # A parent that existed before stays, even when the export made it no fuller.
    (tmp_path / "kept").mkdir()
    with pytest.raises(WeightsError):
        export(tmp_path / "kept" / "new" / "out", model_dir=model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "models"]
    assert list((tmp_path / "kept").iterdir()) == []


def _stale_partial(parent: Path, name: str, pid: int, host: str | None = None) -> Path:
    folder = parent / f".{name}.partial-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / "model.onnx.data").write_bytes(b"\0" * 4096)
    marker = {"pid": pid, "host": host or socket.gethostname(), "started": None}
    (folder / PARTIAL_MARKER).write_text(json.dumps(marker))
    return folder


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_partial_folders_of_dead_exports_are_removed_and_said(model: Path, tmp_path: Path):
    dead = _stale_partial(tmp_path, "out", _dead_pid())
    live = _stale_partial(tmp_path, "out", os.getpid())  # an export still running
    elsewhere = _stale_partial(tmp_path, "out", _dead_pid() + 1, host="another-machine")
    foreign = tmp_path / ".out.partial-notours1"
    foreign.mkdir()  # no marker: not ours to judge
    other_name = _stale_partial(tmp_path, "other", _dead_pid())
    result = export(tmp_path / "out", model_dir=model)
    assert not dead.exists()
    assert live.exists() and elsewhere.exists() and foreign.exists() and other_name.exists()
    said = [n for n in result.notes if dead.name in n]
    assert said and "unfinished export" in said[0] and "which is gone" in said[0]
    assert PARTIAL_MARKER not in {p.name for p in (tmp_path / "out").iterdir()}
    assert PARTIAL_MARKER not in result.files


def test_a_package_an_interrupted_overwrite_moved_aside_is_removed(model: Path, tmp_path: Path):
    out = tmp_path / "out"
    export(out, model_dir=model)
    old = tmp_path / ".out.old-12345678"
    shutil.copytree(out, old)
    not_ours = tmp_path / ".out.old-87654321"
    not_ours.mkdir()
    (not_ours / "diary.txt").write_text("mine")
    result = export(out, model_dir=model, overwrite=True)
    assert not old.exists() and (not_ours / "diary.txt").read_text() == "mine"
    assert any(old.name in note for note in result.notes)


def test_an_old_package_moved_aside_stays_while_it_is_the_only_copy(model: Path, tmp_path: Path):
    out = tmp_path / "out"
    export(out, model_dir=model)
    old = tmp_path / ".out.old-12345678"
    out.rename(old)  # killed between moving the old package aside and moving the new in
    before = snapshot(old)
    with pytest.raises(WeightsError):
        bad = write_checkpoint(tmp_path / "bad")
        (bad / "model.safetensors").write_bytes(b"\0" * 16)
        export(out, model_dir=bad)
    assert snapshot(old) == before
    export(out, model_dir=model)
    assert not old.exists()


def _run_as_other_user(action) -> str:
    """Run ``action()`` as an unprivileged user (root forks and drops to nobody); returns
    what it raised, as 'Type: message', or 'ok'."""
    if os.geteuid() != 0:
        try:
            action()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, report, never return into pytest
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            action()
            outcome = "ok"
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


def test_an_old_package_this_user_cannot_delete_is_refused_before_any_work(tmp_path: Path):
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"es-perm-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        model = write_checkpoint(base / "M")
        parent = base / "shared"
        parent.mkdir()
        out = parent / "out"
        export(out, model_dir=model)  # written by "another user" (root) or made read-only
        os.chmod(out, 0o555)
        os.chmod(parent, 0o777)
        for path in (base, model, *model.iterdir()):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        before = snapshot(out)
        outcome = _run_as_other_user(lambda: export(out, model_dir=model, overwrite=True))
        assert outcome.startswith("PackageError: cannot replace"), outcome
        assert "may not delete" in outcome
        assert snapshot(out) == before
        assert leftovers(parent) == []
    finally:
        for dirpath, _, _ in os.walk(base):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(base)


def test_an_unwritable_destination_is_refused_before_any_work(tmp_path: Path):
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"es-ro-{os.getpid()}"
    base.mkdir(mode=0o755)  # not writable by the unprivileged user
    try:
        outcome = _run_as_other_user(
            lambda: export(
                base / "deep" / "out",
                preset="gemma4-tiny",
                options=ExportOptions(random_weights=True),
            )
        )
        assert outcome.startswith("PackageError: cannot write into"), outcome
        assert list(base.iterdir()) == []
    finally:
        shutil.rmtree(base)


SLOW_DRIVER = """
import sys, time
from pathlib import Path
from engine.weights import sources

ready, sent = Path(sys.argv[1]), Path(sys.argv[2])
original = sources.RandomSource.read

def held(self, weight, *args):
    # a layer's weights as they are written (its scalar is read once while the graph is
    # built, before anything is written)
    if weight.name.startswith("layers.3.") and not weight.name.endswith("layer_scalar"):
        ready.touch()
        while not sent.exists():  # hold this tensor until the test has sent its signal
            time.sleep(0.01)
    return original(self, weight, *args)

sources.RandomSource.read = held
from engine.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _as_a_foreground_job() -> None:
    """In the child before exec: SIGINT, SIGQUIT and SIGHUP as in a terminal's foreground job.

    A non-interactive shell starts background jobs (``pytest ... &``, a CI runner's child)
    with SIGINT ignored, and the ignore survives exec: the export then rightly ignores
    Ctrl-C (``test_an_ignored_sigint_stays_ignored``), which is not what these tests send
    it; `nohup` does the same to SIGHUP. Restoring the defaults makes the test independent of
    how pytest was started.
    """
    import signal

    for name in ("SIGINT", "SIGQUIT", "SIGHUP"):  # SIGHUP: `nohup pytest` ignores it
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def _export_held_midway(tmp_path: Path, out: Path) -> tuple[subprocess.Popen[str], Path]:
    ready, sent = tmp_path / "ready", tmp_path / "sent"
    args = ["build", "--preset", "gemma4-tiny", "--random-weights", "--quiet", str(out)]
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_DRIVER, str(ready), str(sent), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_foreground_job,
    )
    while not ready.exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    return process, sent


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_interrupting_signals_cancel_cleanly(tmp_path: Path, name: str, code: int):
    import signal

    out = tmp_path / "pkgs" / "out"
    process, sent = _export_held_midway(tmp_path, out)
    assert leftovers(out.parent)  # it is writing
    process.send_signal(getattr(signal, name))
    sent.touch()
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == "cancelled: interrupted; nothing was written"
    assert "Traceback" not in stderr
    assert not (tmp_path / "pkgs").exists()


def test_a_killed_export_is_cleaned_up_by_the_next_one(tmp_path: Path):
    import signal

    out = tmp_path / "out"
    process, sent = _export_held_midway(tmp_path, out)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=300)
    sent.touch()
    (stale,) = leftovers(tmp_path)
    result = export(out, preset="gemma4-tiny", options=ExportOptions(random_weights=True))
    assert leftovers(tmp_path) == []
    assert any(stale in note and f"process {process.pid}" in note for note in result.notes)


def test_signals_set_the_cancel_token_and_interrupt_once():
    import signal

    from engine.progress import InterruptOnSignals

    before = signal.getsignal(signal.SIGTERM)
    with InterruptOnSignals() as signals:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)  # interrupted long before this ends
        assert signals.cancel.cancelled and signals.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: the cleanup is running
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_ignored_sigint_stays_ignored():
    """A background job of a non-interactive shell ignores SIGINT; so does the CLI then."""
    import signal

    from engine.progress import InterruptOnSignals

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with InterruptOnSignals() as signals:
            os.kill(os.getpid(), signal.SIGINT)
            assert not signals.cancel.cancelled
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_model_folder_this_user_may_not_enter_is_one_error(tmp_path: Path):
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"es-locked-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        model = write_checkpoint(base / "M")
        os.chmod(model, 0o700 if os.geteuid() == 0 else 0o000)
        outcome = _run_as_other_user(
            lambda: export(base / "out", model_dir=model, options=ExportOptions())
        )
        assert outcome.startswith("SpecError: cannot read"), outcome
        assert "Permission denied" in outcome
    finally:
        os.chmod(base / "M", 0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("command", [["info", "--preset", "gemma4-tiny"], ["plan", "--preset",
                                     "gemma4-e2b", "--ep", "webgpu"]])  # fmt: skip
def test_output_into_a_pipe_nobody_reads_is_not_a_traceback(command: list[str]):
    """``... | head -1``: the reader is gone before the output is written."""
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "engine", *command],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_ctrl_c_while_the_modules_load_is_a_cancel_not_a_traceback(monkeypatch, capsys):
    """Before the CLI's own handler is set up (the imports, the parser) a Ctrl-C is the
    same one-line cancel and exit 130 (it printed ~50 lines of import traceback)."""
    import runpy

    import engine.cli

    def interrupted(argv: object = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.cli, "main", interrupted)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("engine", run_name="__main__")
    assert exited.value.code == 130
    assert capsys.readouterr().err.strip() == "cancelled: interrupted"
