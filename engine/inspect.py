"""Inspect any ONNX package folder, ours or another exporter's, without loading its weights.

Every ``.onnx`` file is read with a small protobuf wire-format reader over a memory map:
initializers' names, dtypes, shapes and byte sizes come from their headers, and weight
bytes (inline ``raw_data`` or external data files) are skipped by length, never read. So
a multi-gigabyte package is inspected in about the time its graph takes to scan. Sessions
come from ``genai_config.json`` when there is one (every ``model.*`` section with a
``filename``), else from the ``.onnx`` files themselves.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import PackageError

_DTYPE_TABLE = """
1 float32 32, 2 uint8 8, 3 int8 8, 4 uint16 16, 5 int16 16, 6 int32 32, 7 int64 64,
8 string 0, 9 bool 8, 10 float16 16, 11 float64 64, 12 uint32 32, 13 uint64 64,
14 complex64 64, 15 complex128 128, 16 bfloat16 16, 17 float8e4m3fn 8, 18 float8e4m3fnuz 8,
19 float8e5m2 8, 20 float8e5m2fnuz 8, 21 uint4 4, 22 int4 4, 23 float4e2m1 4, 24 float8e8m0 8
"""
DTYPES: dict[int, tuple[str, int]] = {
    int(code): (name, int(bits))
    for code, name, bits in (entry.split() for entry in _DTYPE_TABLE.replace("\n", " ").split(","))
}
"""ONNX ``TensorProto.DataType`` -> (name, bits per element)."""
_PIECE = re.compile(r"^(?P<base>.+?)[._]part(?P<index>\d+)(?P<part>\.[A-Za-z_]+)?$")


@dataclass(frozen=True)
class TensorInfo:
    """One initializer, as stored."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    """Bytes of its data (the external data's recorded length when there is one)."""
    location: str = ""
    """External data file, or empty when the data is inside the .onnx file."""

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SplitGroup:
    """Initializers that are pieces of one logical tensor (``name.partN[.suffix]``)."""

    base: str
    pieces: int
    tensors: tuple[TensorInfo, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def largest(self) -> int:
        return max(t.nbytes for t in self.tensors)

    @property
    def unsplit_largest(self) -> int:
        """The largest buffer the tensor would need unsplit: per kind of part (qweight,
        scales, ...), the pieces summed; the largest of those."""
        by_part: Counter[str] = Counter()
        for t in self.tensors:
            match = _PIECE.match(t.name)
            by_part[(match and match.group("part")) or ""] += t.nbytes
        return max(by_part.values())


@dataclass(frozen=True)
class SessionInfo:
    """One ONNX file of the package."""

    name: str
    filename: str
    file_bytes: int
    initializers: tuple[TensorInfo, ...]
    op_counts: dict[str, int]
    """``op`` or ``domain::op`` -> count, top-level graph."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ir_version: int
    opsets: dict[str, int]
    producer: str

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.initializers)

    @property
    def nodes(self) -> int:
        return sum(self.op_counts.values())

    def by_dtype(self) -> dict[str, int]:
        sizes: Counter[str] = Counter()
        for t in self.initializers:
            sizes[t.dtype] += t.nbytes
        return dict(sizes.most_common())

    def splits(self) -> tuple[SplitGroup, ...]:
        groups: dict[str, list[TensorInfo]] = {}
        indices: dict[str, set[int]] = {}
        for t in self.initializers:
            match = _PIECE.match(t.name)
            if match:
                groups.setdefault(match.group("base"), []).append(t)
                indices.setdefault(match.group("base"), set()).add(int(match.group("index")))
        return tuple(
            SplitGroup(base, len(indices[base]), tuple(tensors))
            for base, tensors in groups.items()
            if len(indices[base]) > 1
        )


@dataclass(frozen=True)
class PackageInfo:
    """What a package folder holds."""

    path: Path
    sessions: tuple[SessionInfo, ...]
    files: dict[str, int]
    genai_config: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    """``export_studio.json`` of our own packages."""
    problems: tuple[str, ...] = field(default=())
    """What looks wrong (missing external data, files genai_config names but lacks)."""

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sessions)

    @property
    def producer(self) -> str:
        if self.manifest and self.manifest.get("producer"):
            return str(self.manifest["producer"])
        names = sorted({s.producer for s in self.sessions if s.producer})
        return ", ".join(names) or "unknown"

    @property
    def ep(self) -> str | None:
        """The EP the package targets: from our manifest, else genai_config's provider
        options of the first session that names one; None when neither says."""
        from engine.caps import get_caps, list_eps

        options = (self.manifest or {}).get("options") or {}
        if isinstance(options.get("ep"), str):
            return str(options["ep"])
        model = (self.genai_config or {}).get("model") or {}
        for section in model.values() if isinstance(model, dict) else ():
            if not isinstance(section, dict):
                continue
            entries = (section.get("session_options") or {}).get("provider_options")
            for entry in entries if isinstance(entries, list) else ():
                for ep in list_eps():
                    if isinstance(entry, dict) and get_caps(ep).genai_provider in entry:
                        return ep
        return "cpu" if self.genai_config else None

    def largest(self, count: int = 12) -> list[TensorInfo]:
        everything = [t for s in self.sessions for t in s.initializers]
        return sorted(everything, key=lambda t: t.nbytes, reverse=True)[:count]


def inspect_package(folder: str | os.PathLike[str]) -> PackageInfo:
    """Read a package folder's sessions, initializers, files and configs.

    Raises:
        PackageError: The folder does not exist, holds no .onnx file, or one is unreadable.
    """
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise PackageError(f"'{path}' is not a folder")
    config = _json(path / "genai_config.json")
    manifest = _json(path / "export_studio.json")
    files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}
    named: list[tuple[str, str]] = []
    problems: list[str] = []
    model = (config or {}).get("model")
    for key, section in model.items() if isinstance(model, dict) else ():
        if isinstance(section, dict) and isinstance(section.get("filename"), str):
            if section["filename"] in files:
                named.append((key, section["filename"]))
            else:
                problems.append(
                    f"genai_config names {section['filename']} (model.{key}), "
                    "which the folder does not have"
                )
    listed = {filename for _, filename in named}
    named += [(Path(f).stem, f) for f in files if f.endswith(".onnx") and f not in listed]
    if not named:
        raise PackageError(f"'{path}' holds no .onnx file; choose a package folder")
    sessions = []
    for name, filename in named:
        session = read_session(path / filename, name)
        sessions.append(session)
        for location in sorted({t.location for t in session.initializers if t.location}):
            if location not in files:
                problems.append(f"{filename} keeps weights in {location}, which is missing")
    return PackageInfo(path.absolute(), tuple(sessions), files, config, manifest, tuple(problems))


def read_session(onnx_file: Path, name: str = "") -> SessionInfo:
    """One .onnx file's header facts, without reading its weight bytes.

    Raises:
        PackageError: The file is not a readable ONNX model.
    """
    try:
        with open(onnx_file, "rb") as handle, _map(handle) as data:
            view = memoryview(data)
            try:
                return _session(view, onnx_file, name or onnx_file.stem)
            finally:
                view.release()
    except (OSError, ValueError, IndexError, BufferError) as exc:
        raise PackageError(f"{onnx_file} is not a readable ONNX model: {exc}") from exc


def _map(handle: Any) -> Any:
    if os.fstat(handle.fileno()).st_size == 0:
        raise ValueError("the file is empty")
    return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _session(buf: memoryview, onnx_file: Path, name: str) -> SessionInfo:
    ir_version, producer, opsets = 0, "", {}
    graph: tuple[int, int] | None = None
    for number, wire, value in _fields(buf, 0, len(buf)):
        if number == 1 and wire == 0:
            ir_version = value
        elif number == 2 and wire == 2:
            producer = _text(buf, value)
        elif number == 7 and wire == 2:
            graph = value
        elif number == 8 and wire == 2:
            domain, version = "", 0
            for n, w, v in _fields(buf, *value):
                if n == 1 and w == 2:
                    domain = _text(buf, v)
                elif n == 2 and w == 0:
                    version = v
            opsets[domain or "ai.onnx"] = version
    if graph is None:
        raise ValueError("no graph in the model")
    initializers: list[TensorInfo] = []
    ops: Counter[str] = Counter()
    inputs: list[str] = []
    outputs: list[str] = []
    for number, wire, value in _fields(buf, *graph):
        if wire != 2:
            continue
        if number == 1:
            ops[_op(buf, value)] += 1
        elif number == 5:
            initializers.append(_tensor(buf, value))
        elif number in (11, 12):
            target = inputs if number == 11 else outputs
            target += [_text(buf, v) for n, w, v in _fields(buf, *value) if n == 1 and w == 2]
    return SessionInfo(
        name,
        onnx_file.name,
        len(buf),
        tuple(initializers),
        dict(ops.most_common()),
        tuple(inputs),
        tuple(outputs),
        ir_version,
        opsets,
        producer,
    )


def _op(buf: memoryview, span: tuple[int, int]) -> str:
    op_type, domain = "", ""
    for n, w, v in _fields(buf, *span):
        if n == 4 and w == 2:
            op_type = _text(buf, v)
        elif n == 7 and w == 2:
            domain = _text(buf, v)
    return f"{domain}::{op_type}" if domain and domain != "ai.onnx" else op_type


def _tensor(buf: memoryview, span: tuple[int, int]) -> TensorInfo:
    dims: list[int] = []
    data_type, name, stored, location, length = 0, "", None, "", None
    for n, w, v in _fields(buf, *span):
        if n == 1 and w == 0:
            dims.append(_signed(v))
        elif n == 1 and w == 2:
            dims += [_signed(x) for x in _packed_varints(buf, v)]
        elif n == 2 and w == 0:
            data_type = v
        elif n == 8 and w == 2:
            name = _text(buf, v)
        elif n == 9 and w == 2:
            stored = v[1] - v[0]  # raw_data: its length, never its bytes
        elif n == 13 and w == 2:
            entry = {k: val for k, val in _entry(buf, v)}
            if "location" in entry:
                location = entry["location"]
            if "length" in entry:
                length = int(entry["length"])
    dtype, bits = DTYPES.get(data_type, (f"type {data_type}", 0))
    shape = tuple(dims)
    computed = math.ceil(math.prod(shape) * bits / 8)
    nbytes = length if length is not None else stored if stored is not None else computed
    if location and length is None:
        nbytes = computed
    return TensorInfo(name, dtype, shape, nbytes, location)


def _entry(buf: memoryview, span: tuple[int, int]) -> Iterator[tuple[str, str]]:
    key = value = ""
    for n, w, v in _fields(buf, *span):
        if n == 1 and w == 2:
            key = _text(buf, v)
        elif n == 2 and w == 2:
            value = _text(buf, v)
    yield key, value


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message; length-delimited values as spans."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise ValueError("a field runs past the end of its message (truncated file?)")
            yield number, wire, (pos, pos + size)
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} (not an ONNX model?)")


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint (not an ONNX model?)")


def _packed_varints(buf: memoryview, span: tuple[int, int]) -> Iterator[int]:
    pos, end = span
    while pos < end:
        value, pos = _varint(buf, pos)
        yield value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(buf: memoryview, span: tuple[int, int]) -> str:
    return bytes(buf[span[0] : span[1]]).decode("utf-8", errors="replace")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
