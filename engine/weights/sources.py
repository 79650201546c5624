"""Where weight data comes from: a checkpoint folder, or seeded random numbers."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from engine.errors import WeightsError
from engine.logical import LogicalWeight
from engine.weights.checkpoint import Checkpoint

_MAX_LISTED = 20


class WeightSource(Protocol):
    """Reads a logical weight, or a slice of one axis of it, in checkpoint layout."""

    def read(self, weight: LogicalWeight, axis: int, start: int, stop: int) -> np.ndarray: ...


PartReader = Callable[[LogicalWeight, int, int, int], np.ndarray]


def read_fused(
    weight: LogicalWeight, axis: int, start: int, stop: int, read_part: PartReader
) -> np.ndarray:
    """A slice of a fused weight, assembled from its parts (concatenated along axis 0).

    Only the parts a row slice overlaps are read, each over just the overlapping rows, so
    a fused weight streams like an ordinary one; a column slice (``axis`` > 0) reads that
    slice of every part. A part one rank below the weight is one row per ``repeat``.
    """
    rank = len(weight.shape)
    chunks = []
    offset = 0
    for part in weight.parts:
        rows = part.part_rows(rank)
        lo, hi = (
            (max(start, offset), min(stop, offset + rows)) if axis == 0 else (offset, offset + rows)
        )
        offset += rows
        if lo >= hi:
            continue
        lo, hi = lo - (offset - rows), hi - (offset - rows)
        chunks.append(_part_rows(part, rank, axis, start, stop, lo, hi, read_part))
    return np.concatenate(chunks, axis=0) if len(chunks) > 1 else chunks[0]


def _part_rows(
    part: LogicalWeight,
    rank: int,
    axis: int,
    start: int,
    stop: int,
    lo: int,
    hi: int,
    read_part: PartReader,
) -> np.ndarray:
    """Rows ``lo:hi`` of one part's stacked copies (columns ``start:stop`` when axis > 0)."""
    if len(part.shape) < rank:  # a row repeated ``repeat`` times
        row = (
            read_part(part, axis - 1, start, stop)
            if axis > 0
            else read_part(part, 0, 0, part.shape[0])
        )
        return np.broadcast_to(row, (hi - lo, *row.shape)).copy()
    base = part.shape[0]
    if part.repeat == 1:
        return read_part(part, 0, lo, hi) if axis == 0 else read_part(part, axis, start, stop)
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
        problems = []
        for label, items in (
            ("missing", missing),
            ("with the wrong shape", misshaped),
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

    def read(self, weight: LogicalWeight, axis: int, start: int, stop: int) -> np.ndarray:
        if weight.parts:
            return read_fused(weight, axis, start, stop, self.read)
        if weight.source is None and weight.fill is not None:
            return _filled(weight, axis, start, stop)
        if weight.source is None:
            raise WeightsError(f"{weight.name} is computed, not read from the checkpoint")
        return self.checkpoint.read(weight.source, axis, start, stop)


class RandomSource:
    """Seeded random weights for architecture-only packages (previews, benchmarks).

    Each stored piece is drawn from its own generator keyed by the seed, the weight's
    name and the slice, so the same plan always produces the same bytes.
    """

    def __init__(self, seed: int = 0, std: float = 0.02) -> None:
        self.seed = seed
        self.std = std

    def read(self, weight: LogicalWeight, axis: int, start: int, stop: int) -> np.ndarray:
        # A fused weight draws each part under the part's own name: the same numbers as
        # the unfused weights wherever the row chunks fall on part boundaries.
        if weight.parts:
            return read_fused(weight, axis, start, stop, self.read)
        shape = list(weight.shape)
        if shape:
            shape[axis] = stop - start
        key = f"{self.seed}:{weight.name}:{axis}:{start}:{stop}".encode()
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        if weight.fill is not None:
            return np.full(shape, weight.fill, dtype=np.float32)
        # Uniform draws with the requested spread: 1.5x faster than normal ones, and
        # drawing dominates an architecture-only export's time.
        out = rng.random(shape, dtype=np.float32)
        out -= 0.5
        if weight.role == "norm":
            out *= 0.2 * 3**0.5
            out += 1.0
        else:
            out *= 2 * self.std * 3**0.5
        return out


def _filled(weight: LogicalWeight, axis: int, start: int, stop: int) -> np.ndarray:
    shape = list(weight.shape)
    if shape:
        shape[axis] = stop - start
    assert weight.fill is not None
    return np.full(shape, weight.fill, dtype=np.float32)
