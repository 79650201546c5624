"""Streaming reads from safetensors checkpoints, one tensor (or slice) at a time.

The header is parsed here and data is read with plain file reads into fresh arrays, so
nothing is memory-mapped and the whole state dict is never resident: peak memory is
the tensor being converted plus a bounded read chunk. bf16 arrives through ml_dtypes.

Headers are validated as strictly as the ``safetensors`` library does (a file it refuses is
refused here too, with the tensor named): every entry well typed, data ranges in bounds,
contiguous and not overlapping, the file covered exactly. With a shard index, the index is
the truth: every tensor is read from the shard it names, shard paths stay inside the
checkpoint folder, and a tensor found in two files is refused.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np

from engine.dtypes import from_safetensors, numpy_dtype
from engine.errors import WeightsError
from engine.weights.formats import no_safetensors_problem

_MAX_HEADER = 100 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024 * 1024
INDEX_FILE = "model.safetensors.index.json"

ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
"""Bytes per element of every safetensors dtype code (to check data ranges of any tensor,
even ones the export does not read)."""
FLOAT_CODES = ("F32", "F16", "BF16")
"""The float dtypes weights can be read in."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in the checkpoint."""

    name: str
    file: Path
    code: str
    """The safetensors dtype code (``F32``, ``BF16``, ``U8``, ...)."""
    shape: tuple[int, ...]
    offset: int
    """Absolute byte offset of the data in ``file``."""

    @property
    def dtype(self) -> str | None:
        """Our short dtype name (``fp32``, ...), or None for a dtype the engine does not read."""
        return from_safetensors(self.code)

    @property
    def is_float(self) -> bool:
        return self.code in FLOAT_CODES

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.code]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_header(path: Path) -> dict[str, TensorEntry]:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise WeightsError(f"{path.name}: not a safetensors file (shorter than 8 bytes)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER, size - 8):
                raise WeightsError(
                    f"{path.name}: corrupt safetensors header (declares {header_len} header bytes "
                    f"in a {size}-byte file); re-download or re-save the checkpoint"
                )
            header = json.loads(
                f.read(header_len).decode("utf-8"), object_pairs_hook=_no_duplicates
            )
    except OSError as exc:
        raise WeightsError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except _Duplicate as exc:
        raise WeightsError(
            f"{path.name}: corrupt safetensors header (the name '{exc.key}' appears twice)"
        ) from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WeightsError(f"{path.name}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: corrupt safetensors header (not a JSON object)")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise WeightsError(
            f"{path.name}: corrupt safetensors header (__metadata__ must map names to strings)"
        )
    data_start = 8 + header_len
    entries: dict[str, TensorEntry] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entry, begin, end = _entry(path, name, info, data_start)
        entries[name] = entry
        ranges.append((begin, end, name))
    _check_coverage(path, ranges, size - data_start)
    return entries


def _entry(path: Path, name: str, info: Any, data_start: int) -> tuple[TensorEntry, int, int]:
    def corrupt(what: str) -> WeightsError:
        return WeightsError(
            f"{path.name}: corrupt entry for tensor '{name}' ({what}); "
            "re-download or re-save the checkpoint"
        )

    if not isinstance(info, dict):
        raise corrupt("not a JSON object")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(code, str):
        raise corrupt(f"dtype {code!r} is not a name")
    if code not in ITEMSIZE:
        raise corrupt(f"unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise corrupt(f"shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise corrupt(f"data_offsets {offsets!r} is not a [begin, end] pair")
    begin, end = offsets
    entry = TensorEntry(name, path, code, tuple(shape), data_start + begin)
    if end < begin or end - begin != entry.nbytes:
        raise WeightsError(
            f"{path.name}: tensor '{name}' has {end - begin} bytes of data for its shape "
            f"{list(shape)} of {code}, which needs {entry.nbytes}; the file is corrupt"
        )
    return entry, begin, end


def _check_coverage(path: Path, ranges: list[tuple[int, int, str]], data_bytes: int) -> None:
    """Data ranges follow each other without gaps or overlaps and fill the file exactly."""
    position, previous = 0, None
    for begin, end, name in sorted(ranges):
        if begin != position:
            if begin < position:
                problem = f"overlaps the data of '{previous}'"
            else:
                problem = f"starts {begin - position} bytes after the previous tensor's data"
            raise WeightsError(
                f"{path.name}: tensor '{name}' {problem}; the file is corrupt "
                "(the safetensors library refuses it too)"
            )
        position, previous = end, name
    if position > data_bytes:
        raise WeightsError(
            f"{path.name}: tensor '{previous}' points outside the file "
            f"(its data ends at byte {position} of {data_bytes}); the file is truncated or corrupt"
        )
    if position != data_bytes:
        raise WeightsError(
            f"{path.name}: {data_bytes - position} bytes after the last tensor's data belong to "
            "no tensor; the file is truncated or corrupt"
        )


def _shard_path(folder: Path, index: Path, name: Any) -> Path:
    if not isinstance(name, str) or not name.strip():
        raise WeightsError(f"{index}: weight_map values must be file names, got {name!r}")
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if (
        posix.is_absolute()
        or windows.is_absolute()
        or windows.drive
        or ".." in posix.parts
        or ".." in windows.parts
    ):
        raise WeightsError(
            f"{index.name} names the shard '{name}', which is outside the checkpoint folder; "
            "shards must be files inside it"
        )
    return folder / posix


class Checkpoint:
    """The tensors of a Hugging Face safetensors checkpoint folder.

    Honours ``model.safetensors.index.json`` when present (only the shards it names are
    read and each tensor comes from the shard it names), otherwise reads every
    ``*.safetensors`` file in the folder.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        index = self.folder / INDEX_FILE
        weight_map: dict[str, Path] | None = None
        if index.is_file():
            weight_map = self._read_index(index)
            files = sorted(set(weight_map.values()))
            missing = [str(f.relative_to(self.folder)) for f in files if not f.is_file()]
            if missing:
                raise WeightsError(
                    f"{index.name} names shard files that are missing: {', '.join(missing)}"
                )
        else:
            files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise WeightsError(no_safetensors_problem(self.folder))
        found: dict[str, TensorEntry] = {}
        for path in files:
            for name, entry in _read_header(path).items():
                if name in found:
                    raise WeightsError(
                        f"tensor '{name}' is stored twice, in {found[name].file.name} and "
                        f"{path.name}; remove the stray file or re-save the checkpoint"
                    )
                found[name] = entry
        if weight_map is None:
            self.entries = found
            return
        self.entries = {}
        wrong = []
        for name, path in weight_map.items():
            listed = found.get(name)
            if listed is None or listed.file != path:
                where = f"in {listed.file.name}" if listed is not None else "in no shard"
                wrong.append(f"'{name}' (the index says {path.name}, found {where})")
                continue
            self.entries[name] = listed
        if wrong:
            more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
            raise WeightsError(
                f"{index.name} does not match its shards: {', '.join(wrong[:3])}{more}; "
                "re-download the checkpoint or re-save it"
            )

    def _read_index(self, index: Path) -> dict[str, Path]:
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise WeightsError(f"{index}: cannot read the shard index ({exc})") from exc
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(
                f"{index}: the shard index has no 'weight_map' object naming each tensor's file"
            )
        return {str(k): _shard_path(self.folder, index, v) for k, v in weight_map.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def read(
        self,
        name: str,
        axis: int = 0,
        start: int = 0,
        stop: int | None = None,
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """Read a tensor, or the [start, stop) slice of one axis, into a new array; with
        ``axis`` > 0, ``rows`` limits axis 0 to [rows[0], rows[1]) too."""
        entry = self.entries[name]
        if entry.dtype is None:
            raise WeightsError(
                f"{entry.file.name}: tensor '{name}' has dtype {entry.code}, which the engine "
                "does not read"
            )
        shape = list(entry.shape)
        stop = shape[axis] if stop is None else stop
        dtype = numpy_dtype(entry.dtype)
        if axis == 0:
            row_bytes = math.prod(shape[1:]) * dtype.itemsize
            out = np.empty((stop - start, *shape[1:]), dtype=dtype)
            self._read_into(entry, entry.offset + start * row_bytes, out)
            return out
        # A slice of a later axis: stream whole rows in bounded chunks, keep the columns.
        first, last = rows if rows is not None else (0, shape[0])
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        per_chunk = max(1, _CHUNK_BYTES // max(row_bytes, 1))
        out_shape = list(shape)
        out_shape[0] = last - first
        out_shape[axis] = stop - start
        out = np.empty(out_shape, dtype=dtype)
        index = [slice(None)] * len(shape)
        index[axis] = slice(start, stop)
        for begin in range(first, last, per_chunk):
            end = min(last, begin + per_chunk)
            chunk = np.empty((end - begin, *shape[1:]), dtype=dtype)
            self._read_into(entry, entry.offset + begin * row_bytes, chunk)
            out[begin - first : end - first] = chunk[(slice(None), *index[1:])]
        return out

    @staticmethod
    def _read_into(entry: TensorEntry, offset: int, out: np.ndarray) -> None:
        view = out.reshape(-1).view(np.uint8).data
        try:
            with entry.file.open("rb") as f:
                f.seek(offset)
                got = f.readinto(view)
        except OSError as exc:
            raise WeightsError(
                f"cannot read tensor '{entry.name}' from {entry.file}: {exc}"
            ) from exc
        if got != len(view):
            raise WeightsError(
                f"{entry.file.name}: tensor '{entry.name}' is truncated "
                f"(read {got} of {len(view)} bytes)"
            )
