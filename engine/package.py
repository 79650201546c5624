"""Writing a package folder atomically, without ever losing a user's file.

Everything is written into a hidden staging folder beside the destination
(``.OUT.partial-XXXXXXXX``, marked with the writing process's id) and renamed into place
at the end. A failure, a cancel or a signal removes the staging folder and any parent
folder the export created; an existing destination is replaced only when the caller asked
for it, only when it is a package this tool wrote (its manifest says so) or an empty
folder, and only after the new package is complete. A folder that holds the input
checkpoint or the current directory is never a destination. Staging folders left by a
killed export (their marker names a process that is gone) are removed by the next export
to the same place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import stat
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError, PackageError, option

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "generation_config.json",
)
MANIFEST = "export_studio.json"
PRODUCER = "export-studio"
PARTIAL_MARKER = ".export-studio-partial"
"""File inside a staging folder naming the process that writes it (JSON)."""
_MAX_LISTED = 3


_WRITTEN_NAMES = frozenset(
    (*TOKENIZER_FILES, MANIFEST, "genai_config.json", "processor_config.json",
     "audio_processor_config.json")
)  # fmt: skip
"""What packages whose manifest predates its file list may hold besides ``*.onnx(.data)``."""


def _manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest this tool wrote in ``folder``, or None."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("producer") == PRODUCER else None


def is_our_package(folder: Path) -> bool:
    """Whether ``folder`` holds a manifest this tool wrote."""
    return _manifest(folder) is not None


def foreign_entries(folder: Path) -> list[str]:
    """Names in ``folder`` that its manifest does not list as written by this tool.

    Everything else may be the user's (notes, results): an overwrite must not delete it.
    A manifest from before the file list (no ``files``) vouches for the names this tool
    writes; a folder without our manifest has nothing of ours.
    """
    manifest = _manifest(folder)
    listed = manifest.get("files") if manifest is not None else None

    def ours(entry: Path) -> bool:
        if manifest is None or entry.is_symlink() or not entry.is_file():
            return False  # this tool writes plain files only, never a folder or a link
        if isinstance(listed, list):
            return entry.name in listed
        return entry.name in _WRITTEN_NAMES or entry.name.endswith((".onnx", ".onnx.data"))

    return [
        entry.name + ("/" if entry.is_dir() and not entry.is_symlink() else "")
        for entry in sorted(folder.iterdir(), key=lambda p: p.name)
        if not ours(entry)
    ]


def resolve_output(output: str | os.PathLike[str]) -> Path:
    """The absolute destination; a symbolic link stands for the folder it points to."""
    if not os.fspath(output).strip():
        raise PackageError("no output folder given; name a new folder for the package")
    out = Path(output).expanduser().absolute()
    if out.is_symlink():
        try:
            return out.resolve(strict=True)
        except FileNotFoundError:
            raise PackageError(
                f"'{out}' is a symbolic link to '{os.readlink(out)}', which does not exist; "
                "remove the link, or create the folder it points to"
            ) from None
        except (OSError, RuntimeError) as exc:
            raise PackageError(
                f"'{out}' is a symbolic link that cannot be followed: {exc}"
            ) from exc
    return out


def check_destination(
    output: str | os.PathLike[str],
    overwrite: bool,
    protect: Iterable[str | os.PathLike[str] | None] = (),
) -> Path:
    """Validate the destination before any work; returns its absolute path.

    Args:
        output: The package folder to create (or replace).
        overwrite: Whether an existing package there may be replaced.
        protect: Folders that must survive (the input checkpoint); the current directory
            is always protected. The destination may be neither of them nor a folder
            that holds one of them.

    Raises:
        PackageError: The destination cannot or must not be written.
    """
    try:
        return _check_destination(output, overwrite, protect)
    except OSError as exc:  # a parent this user may not enter
        raise PackageError(
            f"cannot use '{output}' as the package folder: {exc.strerror or exc}"
            + (f" ('{exc.filename}')" if exc.filename else "")
            + "; choose another folder"
        ) from exc


def _check_destination(
    output: str | os.PathLike[str],
    overwrite: bool,
    protect: Iterable[str | os.PathLike[str] | None],
) -> Path:
    out = resolve_output(output)
    _refuse_protected(out, [("the current folder", Path.cwd()), *_labelled(protect)])
    if occupied(out):
        if not out.is_dir():
            raise PackageError(f"'{out}' exists and is not a folder; it will not be replaced")
        if not overwrite:
            raise PackageError(
                f"'{out}' already exists; choose another folder or pass {option('overwrite')} "
                "to replace it"
            )
        if not is_our_package(out) and not _is_empty(out):
            raise PackageError(
                f"'{out}' is not a package written by this tool (it has no {MANIFEST}) and is "
                "not empty; it will not be replaced. Choose a new folder for the package"
            )
        if not replaceable(out):
            raise PackageError(_foreign_message(out))
        _check_removable(out)
    elif out.exists():  # an empty folder made for the package: removed at the end
        _check_removable(out)
    ancestor = existing_ancestor(out.parent)
    if not ancestor.is_dir():
        raise PackageError(f"cannot create the folder '{out.parent}': '{ancestor}' is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PackageError(
            f"cannot write into '{ancestor}': permission denied; choose another folder"
        )
    return out


def replaceable(folder: Path) -> bool:
    """A folder ``--overwrite`` may replace: one of our packages holding nothing but the
    files its manifest lists, or an empty folder."""
    try:
        return _is_empty(folder) or (is_our_package(folder) and not foreign_entries(folder))
    except OSError:
        return False


def occupied(output: Path) -> bool:
    """Whether writing a package to ``output`` would replace something: it exists and is not
    an empty folder (one made for the package has nothing to lose: no overwrite needed). A
    mount point counts as occupied even when empty: it cannot be swapped for another folder."""
    if output.is_symlink():  # a dangling one too
        return True
    if not output.exists():
        return False
    if not output.is_dir() or os.path.ismount(output):
        return True
    return not _is_empty(output)


def _is_empty(folder: Path) -> bool:
    try:
        return not any(folder.iterdir())
    except OSError:
        return False


def _foreign_message(folder: Path) -> str:
    foreign = foreign_entries(folder)
    shown = ", ".join(f"'{name}'" for name in foreign[:_MAX_LISTED])
    more = f" and {len(foreign) - _MAX_LISTED} more" if len(foreign) > _MAX_LISTED else ""
    return (
        f"'{folder}' holds files this tool did not write ({shown}{more}); replacing the "
        "package would delete them. Move them out of the folder, or choose a new folder"
    )


def _labelled(paths: Iterable[str | os.PathLike[str] | None]) -> list[tuple[str, Path]]:
    return [("the input folder", Path(p).expanduser()) for p in paths if p is not None]


def _refuse_protected(out: Path, protected: list[tuple[str, Path]]) -> None:
    target = _real(out)
    for label, path in protected:
        real = _real(path)
        if target == real or target in real.parents:
            what = label if target == real else f"a folder that holds {label} ('{path}')"
            raise PackageError(
                f"'{out}' is {what}; writing the package there would delete it. "
                "Choose a new folder for the package"
            )


def _real(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):
        return path.expanduser().absolute()


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest parent that exists."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _check_removable(folder: Path) -> None:
    """Refuse up front to replace a folder this user could move aside but not delete."""
    blocked: list[str] = []
    parent = folder.parent
    try:
        parent_stat, folder_stat = parent.stat(), folder.lstat()
    except OSError as exc:
        raise PackageError(f"cannot inspect '{folder}': {exc.strerror or exc}") from exc
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    if (
        uid != 0
        and parent_stat.st_mode & stat.S_ISVTX
        and uid not in (parent_stat.st_uid, folder_stat.st_uid)
    ):
        blocked.append(str(folder))

    def unreadable(exc: OSError) -> None:
        blocked.append(str(exc.filename))

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable):
        if (dirnames or filenames) and not os.access(dirpath, os.W_OK | os.X_OK):
            blocked.append(dirpath)
    if blocked:
        shown = ", ".join(f"'{p}'" for p in blocked[:_MAX_LISTED])
        raise PackageError(
            f"cannot replace '{folder}': this user may not delete {shown} "
            f"({len(blocked)} folder(s) in all; they may belong to another user). "
            "Remove the old package yourself, or choose another folder"
        )


# ------------------------------------------------------------------------------ staging


@dataclass(frozen=True)
class _Owner:
    pid: int
    host: str
    started: int | None


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell reused ids."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _me() -> _Owner:
    return _Owner(os.getpid(), socket.gethostname(), _process_start(os.getpid()))


def _read_owner(staging: Path) -> _Owner | None:
    try:
        data = json.loads((staging / PARTIAL_MARKER).read_text(encoding="utf-8"))
        return _Owner(int(data["pid"]), str(data["host"]), data.get("started"))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def _alive(owner: _Owner) -> bool:
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    except OSError:
        return True
    started = _process_start(owner.pid)
    return owner.started is None or started is None or started == owner.started


def partial_folders(output: Path) -> list[Path]:
    """Staging folders of exports to ``output`` (finished or not, ours or not)."""
    try:
        return sorted(output.parent.glob(f".{_glob_escape(output.name)}.partial-*"))
    except OSError:
        return []


def old_folders(output: Path) -> list[Path]:
    """Folders an overwrite moved ``output`` to before deleting it."""
    try:
        return sorted(output.parent.glob(f".{_glob_escape(output.name)}.old-*"))
    except OSError:
        return []


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def remove_stale(output: Path) -> list[str]:
    """Remove what killed exports to ``output`` left behind; returns what was done, in words.

    A staging folder is removed when its marker names a process of this machine that is
    gone; a folder an interrupted overwrite moved aside, when it holds one of our packages
    and ``output`` exists again (otherwise it may be the only copy: it stays until the next
    export there completes).
    """
    said: list[str] = []
    host = socket.gethostname()
    for folder in partial_folders(output):
        owner = _read_owner(folder)
        if owner is None or owner.host != host or _alive(owner):
            continue
        size = _tree_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)
        state = "removed" if not folder.exists() else "could not remove"
        said.append(
            f"{state} '{folder.name}', an unfinished export to this folder left by process "
            f"{owner.pid}, which is gone ({size / 2**20:.1f} MiB)"
        )
    if output.exists():
        for folder in old_folders(output):
            if _remove_old(folder):
                said.append(f"removed '{folder.name}', a package an earlier overwrite left behind")
    return said


def _remove_old(folder: Path) -> bool:
    if not (folder.is_dir() and not folder.is_symlink() and replaceable(folder)):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def _tree_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(dirpath, name))
                # Blocks in use, not the apparent size: the writer's data file is sparse.
                total += getattr(info, "st_blocks", info.st_size // 512) * 512
    return total


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those created, outermost first."""
    missing = []
    path = folder
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    created: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            _remove_empty(created)
            raise PackageError(f"cannot create the folder '{path}': {exc.strerror or exc}") from exc
        created.append(path)
    return created


def _remove_empty(created: list[Path]) -> None:
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            return


@contextlib.contextmanager
def staging_folder(output: Path, overwrite: bool) -> Iterator[Path]:
    """A temporary folder that becomes ``output`` if the block completes.

    On any exception (cancel included) the temporary folder and the parent folders created
    for it are deleted and ``output`` is left exactly as it was. An ``OSError`` (a full
    disk, a permission) becomes a :class:`PackageError` that says what happened.
    """
    created = _make_parents(output.parent)
    staging = output.parent / f".{output.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        me = _me()
        (staging / PARTIAL_MARKER).write_text(
            json.dumps({"pid": me.pid, "host": me.host, "started": me.started}), encoding="utf-8"
        )
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        raise PackageError(
            f"cannot create a folder in '{output.parent}': {exc.strerror or exc}"
        ) from exc
    try:
        yield staging
        _swap_into_place(staging, output, overwrite)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        cause = _engine_cause(exc) or exc  # the writer may wrap it (onnx_ir's SerdeError)
        if isinstance(cause, OSError):
            raise _write_error(cause, output) from cause
        if cause is not exc:
            raise cause from None
        raise


def _engine_cause(exc: BaseException) -> BaseException | None:
    """The engine's own error (or an OSError) that a library wrapped, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (EngineError, OSError, KeyboardInterrupt)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _write_error(exc: OSError, output: Path) -> PackageError:
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        advice = "free some space there or choose a folder on another disk"
    else:
        advice = "check the folder's permissions, or choose another folder"
    return PackageError(
        f"writing the package to '{output}' failed: {exc.strerror or exc}{where}; "
        f"nothing was left behind. {advice[0].upper()}{advice[1:]}"
    )


def _swap_into_place(staging: Path, output: Path, overwrite: bool) -> None:
    (staging / PARTIAL_MARKER).unlink(missing_ok=True)
    if not os.path.lexists(output):
        staging.rename(output)
        _remove_olds(output)
        return
    if not occupied(output):
        _replace_empty_folder(staging, output)
        return
    if not overwrite:
        raise PackageError(
            f"'{output}' appeared or stopped being empty while exporting; it was left as it is "
            "and the new package was not moved there"
        )
    if output.is_symlink() or not output.is_dir() or not replaceable(output):
        raise PackageError(
            f"'{output}' changed while exporting: it is no longer a package of ours alone "
            "(a file was added, or its manifest went); it was left as it is and the new "
            "package was not moved there"
        )
    backup = output.parent / f".{output.name}.old-{uuid.uuid4().hex[:8]}"
    output.rename(backup)
    try:
        staging.rename(output)
    except OSError:
        backup.rename(output)
        raise
    shutil.rmtree(backup, ignore_errors=True)
    _remove_olds(output)


def _replace_empty_folder(staging: Path, output: Path) -> None:
    """The package moved where an empty folder was (one made for it): the folder's mode and
    group go to the package; if the move fails, the empty folder is put back as it was."""
    kept = output.stat()
    _give_mode(staging, kept)
    try:
        output.rmdir()  # refuses a folder that stopped being empty
    except OSError as exc:
        reason = (
            "a file appeared in it while exporting"
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST)
            else exc.strerror or str(exc)
        )
        raise PackageError(
            f"'{output}' could not take the package ({reason}); it was left as it is and "
            "the new package was not moved there"
        ) from exc
    try:
        staging.rename(output)
    except OSError:
        with contextlib.suppress(OSError):  # the move's own error is the one to tell
            output.mkdir()
            _give_mode(output, kept)
        raise
    _remove_olds(output)


def _give_mode(folder: Path, kept: os.stat_result) -> None:
    """``folder`` takes the mode and, where this user may give it, the group in ``kept``."""
    os.chmod(folder, stat.S_IMODE(kept.st_mode))
    with contextlib.suppress(OSError):  # another group may not be ours to give
        os.chown(folder, -1, kept.st_gid)


def _remove_olds(output: Path) -> None:
    for folder in old_folders(output):
        _remove_old(folder)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def copy_tokenizer(model_dir: Path | None, staging: Path) -> list[str]:
    """Copy the tokenizer files the checkpoint has; returns their names."""
    if model_dir is None:
        return []
    copied = []
    for name in TOKENIZER_FILES:
        source = model_dir / name
        if source.is_file():
            shutil.copy2(source, staging / name)
            copied.append(name)
    return copied


def folder_files(folder: Path) -> dict[str, int]:
    """File name -> bytes, for the summary (the staging marker is not part of a package)."""
    return {
        p.name: p.stat().st_size
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != PARTIAL_MARKER
    }
