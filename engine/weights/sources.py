"""Where weight data comes from: a checkpoint folder, or seeded random numbers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.errors import WeightsError
from engine.logical import LogicalWeight, RowOrder
from engine.weights.checkpoint import Checkpoint
from engine.weights.formats import adapter_problem, lora_problem, quantized_problem

_MAX_LISTED = 20


class WeightSource(Protocol):
    """Reads a logical weight, or a slice of one axis of it, in checkpoint layout.

    ``rows``, with ``axis`` > 0, restricts axis 0 too (a block of a column slice), so a
    column piece can be read in bounded row chunks.
    """

    def read(
        self,
        weight: LogicalWeight,
        axis: int,
        start: int,
        stop: int,
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray: ...


def read_fused(
    weight: LogicalWeight,
    axis: int,
    start: int,
    stop: int,
    source: WeightSource,
    rows: tuple[int, int] | None = None,
) -> np.ndarray:
    """A slice of a fused weight, assembled from its parts (concatenated along axis 0),
    each read through ``source``.

    Only the parts the wanted rows overlap are read, each over just the overlapping rows:
    the rows ``start:stop`` of a row slice, or ``rows`` (all when None) of a column slice
    (``axis`` > 0). So a fused weight streams in row chunks like an ordinary one. A part
    one rank below the weight is one row per ``repeat``.
    """
    rank = len(weight.shape)
    first, last = (start, stop) if axis == 0 else (rows or (0, weight.shape[0]))
    chunks = []
    offset = 0
    for part in weight.parts:
        count = part.part_rows(rank)
        lo, hi = max(first, offset) - offset, min(last, offset + count) - offset
        offset += count
        if lo < hi:
            part_rows = None if rows is None else (lo, hi)
            chunks.append(_part_rows(part, rank, axis, start, stop, lo, hi, part_rows, source))
    return np.concatenate(chunks, axis=0) if len(chunks) > 1 else chunks[0]


def _part_rows(
    part: LogicalWeight,
    rank: int,
    axis: int,
    start: int,
    stop: int,
    lo: int,
    hi: int,
    rows: tuple[int, int] | None,
    source: WeightSource,
) -> np.ndarray:
    """Rows ``lo:hi`` of one part's stacked copies (columns ``start:stop`` when axis > 0;
    ``rows`` passes ``lo:hi`` on to a column read that was given rows)."""
    read_part = source.read
    if len(part.shape) < rank:  # a row repeated ``repeat`` times
        row = (
            read_part(part, axis - 1, start, stop)
            if axis > 0
            else read_part(part, 0, 0, part.shape[0])
        )
        return np.broadcast_to(row, (hi - lo, *row.shape)).copy()
    base = part.shape[0]
    if part.repeat == 1:
        if axis == 0:
            return read_part(part, 0, lo, hi)
        return read_part(part, axis, start, stop, rows=rows)
    # Stacked copies of a small part: read it once, pick the rows.
    whole = read_part(part, 0, 0, base) if axis == 0 else read_part(part, axis, start, stop)
    return whole[np.arange(lo, hi) % base]


class CheckpointSource:
    """Logical weights read from a safetensors checkpoint folder, by their ``source`` key."""

    def __init__(
        self,
        folder: str | Path,
        needed: Iterable[LogicalWeight],
        ignorable: Callable[[str], bool],
    ) -> None:
        """``needed``: every weight the export reads; ``ignorable``: checkpoint keys it may
        leave unread without complaint (towers not exported, unused tensors)."""
        adapter = adapter_problem(Path(folder))
        if adapter is not None:
            raise WeightsError(adapter)
        self.checkpoint = Checkpoint(folder)
        self.needed = {
            p.source: p for w in needed for p in (w.parts or (w,)) if p.source is not None
        }
        self.ignorable = ignorable

    def validate(self) -> None:
        """Check every needed tensor is present with the right shape and nothing unknown is
        left over; raises one :class:`WeightsError` listing every problem."""
        needed = self.needed
        missing = [key for key in needed if key not in self.checkpoint]
        misshaped = [
            f"{key}: expected {list(w.shape)}, found {list(self.checkpoint.entries[key].shape)}"
            for key, w in needed.items()
            if key in self.checkpoint and self.checkpoint.entries[key].shape != w.shape
        ]
        unexpected = [
            key for key in self.checkpoint.entries if key not in needed and not self.ignorable(key)
        ]
        not_float = [
            f"{key}: {self.checkpoint.entries[key].code}"
            for key in needed
            if key in self.checkpoint and not self.checkpoint.entries[key].is_float
        ]
        if missing or misshaped or not_float or unexpected:
            self._refuse_known_formats(unexpected)
        problems = []
        for label, items in (
            ("missing", missing),
            ("with the wrong shape", misshaped),
            ("stored as integers or another non-float dtype where float weights belong", not_float),
            ("unexpected", unexpected),
        ):
            if items:
                shown = items[:_MAX_LISTED]
                more = (
                    f"\n    ... and {len(items) - len(shown)} more"
                    if len(items) > len(shown)
                    else ""
                )
                problems.append(
                    f"  {len(items)} tensor(s) {label}:\n    " + "\n    ".join(shown) + more
                )
        if problems:
            raise WeightsError(
                f"the checkpoint in '{self.checkpoint.folder}' does not match its config.json:\n"
                + "\n".join(problems)
                + "\nCheck that config.json belongs to these weights."
            )

    def _refuse_known_formats(self, unexpected: list[str]) -> None:
        """A checkpoint that does not match its config because it is pre-quantized or
        carries LoRA tensors: say that, and what to do, instead of listing tensors."""
        folder = self.checkpoint.folder
        entries = self.checkpoint.entries
        codes = {key: entries[key].code for key in self.needed if key in entries}
        problem = quantized_problem(folder, _config(folder), codes, unexpected)
        problem = problem or lora_problem(folder, unexpected)
        if problem is not None:
            raise WeightsError(problem)

    def read(
        self,
        weight: LogicalWeight,
        axis: int,
        start: int,
        stop: int,
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray:
        if weight.parts:
            return read_fused(weight, axis, start, stop, self, rows)
        if weight.source is None and weight.fill is not None:
            return _filled(weight, axis, start, stop, rows)
        if weight.source is None:
            raise WeightsError(f"{weight.name} is computed, not read from the checkpoint")
        if weight.row_order is not None:
            return self._reordered(weight, weight.row_order, axis, start, stop, rows)
        data = self.checkpoint.read(weight.source, axis, start, stop, rows=rows)
        if weight.offset:
            data = np.asarray(data, dtype=np.float32) + np.float32(weight.offset)
        return data

    def _reordered(
        self,
        weight: LogicalWeight,
        order: RowOrder,
        axis: int,
        start: int,
        stop: int,
        rows: tuple[int, int] | None,
    ) -> np.ndarray:
        """The rows a reordered weight's slice is made of, read as one span of the
        checkpoint (they lie within the slice's blocks) and taken in order."""
        first, last = (start, stop) if axis == 0 else (rows or (0, weight.shape[0]))
        wanted = order.source_rows(first, last)
        low, high = int(wanted.min()), int(wanted.max()) + 1
        plain = replace(weight, row_order=None)
        if axis == 0:
            span = self.read(plain, 0, low, high)
        else:
            span = self.read(plain, axis, start, stop, (low, high))
        return np.ascontiguousarray(span[wanted - low])

    def tensor_name(self, weight: LogicalWeight) -> str:
        """The weight's name in the checkpoint files (for messages); a fused weight's
        parts, joined."""
        if weight.parts:
            return " + ".join(weight.sources) or weight.name
        return weight.source or weight.name


def _config(folder: Path) -> dict[str, Any]:
    """The folder's config.json, or {} (it was read before; this is only for a message)."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


class RandomSource:
    """Seeded random weights for architecture-only packages (previews, benchmarks).

    Each stored piece is drawn from its own generator keyed by the seed, the weight's
    name and the slice, so the same plan always produces the same bytes.
    """

    values_trusted = True
    """Its values are finite and small: the writer need not check them."""

    def __init__(self, seed: int = 0, std: float = 0.02) -> None:
        self.seed = seed
        self.std = std

    def read(
        self,
        weight: LogicalWeight,
        axis: int,
        start: int,
        stop: int,
        rows: tuple[int, int] | None = None,
    ) -> np.ndarray:
        # A fused weight draws each part under the part's own name: the same numbers as
        # the unfused weights wherever the row chunks fall on part boundaries.
        if weight.parts:
            return read_fused(weight, axis, start, stop, self, rows)
        shape = list(weight.shape)
        key = f"{self.seed}:{weight.name}:{axis}:{start}:{stop}"
        if shape:
            shape[axis] = stop - start
            if rows is not None and axis != 0:
                shape[0] = rows[1] - rows[0]
                key += f":rows:{rows[0]}:{rows[1]}"
        digest = hashlib.sha256(key.encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        if weight.fill is not None:
            return np.full(shape, weight.fill, dtype=np.float32)
        # Uniform draws with the requested spread: 1.5x faster than normal ones, and
        # drawing dominates an architecture-only export's time.
        out = rng.random(shape, dtype=np.float32)
        out -= 0.5
        if weight.role in ("norm", "scale"):
            out *= 0.2 * 3**0.5
            out += 1.0
        else:
            out *= 2 * self.std * 3**0.5
        return out


def _filled(
    weight: LogicalWeight, axis: int, start: int, stop: int, rows: tuple[int, int] | None
) -> np.ndarray:
    shape = list(weight.shape)
    if shape:
        shape[axis] = stop - start
        if rows is not None and axis != 0:
            shape[0] = rows[1] - rows[0]
    assert weight.fill is not None
    return np.full(shape, weight.fill, dtype=np.float32)
