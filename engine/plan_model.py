"""The export plan's data model: every initializer of every session, with exact bytes.

:func:`engine.plan.plan` fills it; the preview charts it, the builder follows its storage
and split decisions, the weight writer produces exactly its tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from engine.caps import EpCapabilities
from engine.dtypes import itemsize
from engine.errors import render_message
from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.spec import ModelSpec

Storage = Literal["float", "float_t", "matmulnbits", "gbq"]
"""How a weight is stored: float as-is ([out, in] for tables), float transposed to
[in, out] for MatMul, MatMulNBits blocks, or GatherBlockQuantized blocks."""
Part = Literal["weight", "qweight", "scales", "zero_points"]


@dataclass(frozen=True)
class PlannedTensor:
    """One initializer as it will be written."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    part: Part

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


@dataclass(frozen=True)
class Piece:
    """A slice of a logical weight, stored as its own initializers.

    ``start`` / ``stop`` index ``axis`` of the weight in checkpoint layout; an unsplit
    weight is one piece covering the whole axis 0.
    """

    index: int
    axis: int
    start: int
    stop: int
    tensors: tuple[PlannedTensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def largest_buffer(self) -> int:
        return max(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class WeightPlan:
    """How one logical weight is stored."""

    weight: LogicalWeight
    storage: Storage
    dtype: str
    """Float dtype of the data (or of the scales, when quantized)."""
    pieces: tuple[Piece, ...]
    bits: int | None = None
    block_size: int | None = None
    symmetric: bool = False
    split_axis: int | None = None
    shares: str | None = None
    """Logical weight whose initializers this one reuses (a tied LM head)."""
    exceeds: tuple[str, ...] = ()
    """Limits the unsplit weight would exceed."""
    pieces_exceed: tuple[str, ...] = ()
    """Limits some piece still exceeds after splitting (reported, not fixed)."""
    note: str = ""

    @property
    def name(self) -> str:
        return self.weight.name

    @property
    def nbytes(self) -> int:
        """Bytes this weight adds to the package (0 when it shares another's)."""
        return 0 if self.shares else sum(p.nbytes for p in self.pieces)

    @property
    def unsplit_nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    @property
    def is_split(self) -> bool:
        return self.split_axis is not None

    @property
    def quantized(self) -> bool:
        return self.storage in ("matmulnbits", "gbq")

    @property
    def k_slices(self) -> int:
        """Slices of K a float linear's MatMul is split into (1: one MatMul); its weight is
        then stored [G, 1, K / G, N] (:func:`engine.plan.split_k_groups`)."""
        shape = self.pieces[0].tensors[0].shape
        return shape[0] if self.storage == "float_t" and len(shape) == 4 else 1

    def tensors(self) -> Iterator[PlannedTensor]:
        for piece in self.pieces:
            yield from piece.tensors


class SessionTree(Protocol):
    """The family's record of a session (:class:`engine.models.family.Session`), as far as
    this layer needs to know it: the tree the plan was walked from, kept so that the later
    stages build that same tree instead of making it again."""

    @property
    def name(self) -> str: ...

    @property
    def never_captured(self) -> str | None: ...

    def build(self, ctx: Any) -> None: ...


@dataclass(frozen=True)
class SessionPlan:
    """One ONNX file of the package."""

    name: str
    filename: str
    weights: tuple[WeightPlan, ...]
    tree: SessionTree | None = field(default=None, compare=False, repr=False)
    """The session's bound weight tree the weights were planned from (None only for plans
    written by hand in tests)."""

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    def weight(self, name: str) -> WeightPlan:
        for w in self.weights:
            if w.name == name:
                return w
        raise KeyError(name)

    def tensors(self) -> Iterator[PlannedTensor]:
        """Every initializer the session stores, once each (shared ones not repeated)."""
        for w in self.weights:
            if not w.shares:
                yield from w.tensors()


@dataclass(frozen=True)
class ExportPlan:
    """The whole package, per session."""

    spec: ModelSpec
    options: ExportOptions
    caps: EpCapabilities
    context_length: int
    sessions: tuple[SessionPlan, ...]
    attention: Literal["gqa", "standard"] = "gqa"
    """The attention lowering: com.microsoft GroupQueryAttention or standard ONNX ops."""
    warnings: tuple[str, ...] = field(default=())

    @property
    def uses_gqa(self) -> bool:
        return self.attention == "gqa"

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sessions)

    def session(self, name: str) -> SessionPlan:
        for s in self.sessions:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def decoder(self) -> SessionPlan:
        return self.session("decoder")

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view for the CLI's ``--json`` and the app's charts."""
        limit = self.options.max_buffer_size
        return {
            "model": self.spec.name,
            "ep": self.caps.name,
            "dtype": self.options.dtype,
            "weight_bits": self.options.weight_bits,
            "embedding_bits": self.options.embedding_bits,
            "block_size": self.options.block_size,
            "context_length": self.context_length,
            "attention": self.attention,
            "limits": {
                "max_buffer_size": limit,
                "max_storage_binding_size": self.caps.max_storage_binding_size,
            },
            "total_bytes": self.nbytes,
            "warnings": [render_message(w) for w in self.warnings],
            "sessions": [
                {
                    "name": s.name,
                    "filename": s.filename,
                    "bytes": s.nbytes,
                    "weights": [_weight_json(w) for w in s.weights],
                }
                for s in self.sessions
            ],
        }


def _weight_json(w: WeightPlan) -> dict[str, Any]:
    return {
        "name": w.name,
        "role": w.weight.role,
        "shape": list(w.weight.shape),
        "storage": w.storage,
        "dtype": w.dtype,
        "bits": w.bits,
        "block_size": w.block_size,
        "bytes": w.nbytes,
        "unsplit_bytes": w.unsplit_nbytes,
        "largest_buffer": max(p.largest_buffer for p in w.pieces),
        "shares": w.shares,
        "split_axis": w.split_axis,
        "pieces": [
            {
                "start": p.start,
                "stop": p.stop,
                "bytes": p.nbytes,
                "largest_buffer": p.largest_buffer,
            }
            for p in w.pieces
        ],
        "exceeds": list(w.exceeds),
        "pieces_exceed": list(w.pieces_exceed),
        "note": render_message(w.note),
        "tensors": [
            {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes}
            for t in w.tensors()
        ],
    }


def quantized_shapes(
    rows: int, cols: int, bits: int, block_size: int, storage: Storage
) -> dict[Part, tuple[int, ...]]:
    """Shapes of the qweight / scales / zero_points of a [rows, cols] weight quantized
    along cols. MatMulNBits keeps blocks as a middle axis, the last one padded to a whole
    block (as ONNX Runtime's quantizer pads K); GatherBlockQuantized packs the rows as they
    are, its last block possibly partial."""
    blocks = -(-cols // block_size)
    zp_cols = math.ceil(blocks * bits / 8)
    if storage == "matmulnbits":
        qweight: tuple[int, ...] = (rows, blocks, block_size * bits // 8)
    else:
        qweight = (rows, cols * bits // 8)
    return {"qweight": qweight, "scales": (rows, blocks), "zero_points": (rows, zp_cols)}
