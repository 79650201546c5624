"""Writing a package folder atomically.

Everything is written into a hidden temporary folder beside the destination and renamed
into place at the end. A failure or a cancel removes the temporary folder; an existing
destination is replaced only when the caller asked for it, and only after the new
package is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.errors import PackageError, option

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "generation_config.json",
)
MANIFEST = "export_studio.json"


def check_destination(output: str | os.PathLike[str], overwrite: bool) -> Path:
    """Validate the destination before any work; returns its absolute path."""
    out = Path(output).expanduser().absolute()
    if out.exists() and not overwrite:
        raise PackageError(
            f"'{out}' already exists; choose another folder or pass {option('overwrite')} "
            "to replace it"
        )
    if out.exists() and not out.is_dir():
        raise PackageError(f"'{out}' exists and is not a folder; it will not be replaced")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PackageError(f"cannot create the folder '{parent}': {exc.strerror or exc}") from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PackageError(
            f"cannot write into '{parent}': permission denied; choose another folder"
        )
    return out


@contextlib.contextmanager
def staging_folder(output: Path, overwrite: bool) -> Iterator[Path]:
    """A temporary folder that becomes ``output`` if the block completes.

    On any exception (cancel included) the temporary folder is deleted and ``output`` is
    left exactly as it was.
    """
    staging = output.parent / f".{output.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
    except OSError as exc:
        raise PackageError(
            f"cannot create a folder in '{output.parent}': {exc.strerror or exc}"
        ) from exc
    try:
        yield staging
        _swap_into_place(staging, output, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: Path, output: Path, overwrite: bool) -> None:
    if not output.exists():
        staging.rename(output)
        return
    if not overwrite:
        raise PackageError(
            f"'{output}' appeared while exporting; the new package was not moved there"
        )
    backup = output.parent / f".{output.name}.old-{uuid.uuid4().hex[:8]}"
    output.rename(backup)
    try:
        staging.rename(output)
    except OSError:
        backup.rename(output)
        raise
    shutil.rmtree(backup, ignore_errors=True)


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
    """File name -> bytes, for the summary."""
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
