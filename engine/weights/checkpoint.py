"""Streaming reads from safetensors checkpoints, one tensor (or slice) at a time.

The header is parsed here and data is read with plain file reads into fresh arrays, so
nothing is memory-mapped and the whole state dict is never resident: peak memory is
the tensor being converted plus a bounded read chunk. bf16 arrives through ml_dtypes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.dtypes import from_safetensors, numpy_dtype
from engine.errors import WeightsError, option

_MAX_HEADER = 100 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in the checkpoint."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    """Absolute byte offset of the data in ``file``."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize


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
            header = json.loads(f.read(header_len).decode("utf-8"))
    except OSError as exc:
        raise WeightsError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{path.name}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise WeightsError(f"{path.name}: corrupt safetensors header (not a JSON object)")
    data_start = 8 + header_len
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            code, shape, (begin, end) = (
                info["dtype"],
                tuple(int(d) for d in info["shape"]),
                info["data_offsets"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WeightsError(f"{path.name}: corrupt entry for tensor '{name}'") from exc
        dtype = from_safetensors(code)
        if dtype is None:
            raise WeightsError(
                f"{path.name}: tensor '{name}' has dtype {code}, which the engine does not read"
            )
        entry = TensorEntry(name, path, dtype, shape, data_start + int(begin))
        if int(end) - int(begin) != entry.nbytes or data_start + int(end) > size:
            raise WeightsError(
                f"{path.name}: tensor '{name}' points outside the file or has the wrong length; "
                "the file is truncated or corrupt"
            )
        entries[name] = entry
    return entries


class Checkpoint:
    """The tensors of a Hugging Face safetensors checkpoint folder.

    Honours ``model.safetensors.index.json`` when present, otherwise reads every
    ``*.safetensors`` file in the folder.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
                raise WeightsError(f"{index}: cannot read the shard index ({exc})") from exc
            files = sorted({self.folder / f for f in weight_map.values()})
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise WeightsError(
                    f"{index.name} names shard files that are missing: {', '.join(missing)}"
                )
        else:
            files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise WeightsError(
                f"'{self.folder}' has no .safetensors files; export needs safetensors weights "
                f"(or use {option('random_weights')} for an architecture-only package)"
            )
        self.entries: dict[str, TensorEntry] = {}
        for path in files:
            self.entries.update(_read_header(path))

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
