"""The files a package's sessions need: present beside their .onnx file, and as long
as the graph says.

The graph lists every external tensor's file, offset and length, so a truncated data file
is found by reading the .onnx file without its weights, before a runtime maps them (and
fails with its own text, or crashes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import PackageError


def check_session_files(folder: Path, model: Mapping[str, Any], config_file: Path) -> None:
    """Every session file named in genai_config exists, with its external data."""
    missing: list[str] = []
    for key, section in model.items():
        if not isinstance(section, dict) or not isinstance(section.get("filename"), str):
            continue
        onnx_file = folder / section["filename"]
        if not onnx_file.is_file():
            missing.append(f"{section['filename']} (model.{key}.filename)")
            continue
        missing += [
            f"{name} (external data of {onnx_file.name})" for name in _missing_data(onnx_file)
        ]
    if missing:
        raise PackageError(
            f"{config_file} names files the folder does not have: "
            f"{', '.join(missing)}; copy the whole package folder or rebuild it"
        )


def _missing_data(onnx_file: Path) -> list[str]:
    """External-data files an .onnx file refers to that are not beside it; a present one
    shorter than the tensors it should hold is refused (cheap: the graph lists every
    tensor's offset and length, and is read without its weights).

    Raises:
        PackageError: The .onnx file cannot be parsed, or an external-data file is short.
    """
    try:
        import onnx
    except ImportError:  # a runtime-only environment: onnxruntime will report it instead
        return []
    try:
        proto = onnx.load(str(onnx_file), load_external_data=False)
    except Exception as exc:  # any parse failure means a damaged file
        raise PackageError(
            f"{onnx_file} is not a readable ONNX model: {' '.join(str(exc).split())}; "
            "export the package again"
        ) from exc
    if not proto.graph.node:  # an empty file parses as an empty model
        raise PackageError(
            f"{onnx_file.parent}: the package's {onnx_file.name} holds no graph (it is empty, "
            "truncated or not an ONNX model); export it again"
        )
    needed: dict[str, int] = {}
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location")
        if location is None:
            continue
        end = int(entries.get("offset") or 0) + _external_length(onnx, tensor, entries)
        needed[location] = max(needed.get(location, 0), end)
    missing = []
    for location, expected in sorted(needed.items()):
        data = onnx_file.parent / location
        if not data.is_file():
            missing.append(location)
        elif data.stat().st_size < expected:
            raise truncated_error(onnx_file.parent, location, expected, data.stat().st_size)
    return missing


def _external_length(onnx: Any, tensor: Any, entries: Mapping[str, str]) -> int:
    """Bytes of one external tensor: its ``length`` entry, else its dims times its
    element size (0 when neither says, e.g. a 4-bit type without a length)."""
    if entries.get("length"):
        return int(entries["length"])
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except Exception:  # a type numpy has no size for
        return 0
    count = 1
    for dim in tensor.dims:
        count *= int(dim)
    return count * int(itemsize)


def truncated_error(folder: Path, name: str, expected: int, found: int) -> PackageError:
    """The one message for a package file shorter than its model needs."""
    return PackageError(
        f"{folder}: the package's {name} is truncated or corrupt (expected {expected:,} "
        f"bytes, found {found:,}); export it again"
    )


_ORT_SHORT_DATA = re.compile(
    r"External initializer: \S+ offset: (\d+) size to read: (\d+) given file_length: (\d+)"
)


def load_failure(folder: Path, model_file: str, message: str) -> PackageError | None:
    """onnxruntime's text for an external-data file too short for ``model_file`` (as when
    onnx is not installed to check it up front), as :func:`truncated_error`; None for
    any other failure."""
    match = _ORT_SHORT_DATA.search(message)
    if match is None:
        return None
    offset, size, found = (int(group) for group in match.groups())
    return truncated_error(folder, f"external data of {model_file}", offset + size, found)
