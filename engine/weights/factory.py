"""Turns planned tensors into lazily produced initializer data.

Each planned tensor becomes an ``onnx_ir.LazyTensor`` whose function reads (or
computes) its slice, converts and quantizes it when the writer asks for its bytes; the
writer streams them to disk one at a time, so only the tensors in flight are in memory.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from engine.dtypes import ir_dtype, numpy_dtype
from engine.errors import WeightsError, option
from engine.plan_model import ExportPlan, Piece, PlannedTensor, WeightPlan, quantized_shapes
from engine.progress import CancelToken
from engine.spec import ModelSpec
from engine.weights.sources import WeightSource

_CHUNK_ELEMENTS = 16 * 1024 * 1024
"""Source elements read (and converted or quantized) at a time: 64 MiB of float32."""


@dataclass
class _Pending:
    """Quantized parts of one piece, kept until every part has been written."""

    lock: threading.Lock
    parts: dict[str, np.ndarray] | None = None
    remaining: int = 0


def _offset(piece: Piece, rows_read: int) -> tuple[int, int]:
    """Where a chunk read ``rows_read`` rows into a piece starts in the whole tensor."""
    if piece.axis == 0:
        return piece.start + rows_read, 0
    return rows_read, piece.start


def _position(index: np.ndarray, offset: tuple[int, int]) -> str:
    """``[row, col]`` of an element of a chunk, in the whole tensor's indices."""
    return str([int(i) + offset[axis] for axis, i in enumerate(index[:2])] + list(index[2:]))


def rope_cache(spec: ModelSpec, name: str, length: int) -> np.ndarray:
    """A ``rope.<kind>.<cos|sin>_cache`` tensor, float32."""
    _, kind, part = name.split(".")
    head_dim = next(layer.head_dim for layer in spec.layers if layer.attention == kind)
    cos, sin = spec.rope[kind].cos_sin(head_dim, length)  # type: ignore[index]
    return cos if part.startswith("cos") else sin


class TensorFactory:
    """Produces the data of every planned initializer of a session on demand."""

    def __init__(
        self,
        plan: ExportPlan,
        source: WeightSource,
        cancel: CancelToken | None = None,
        on_produced: Callable[[PlannedTensor], None] | None = None,
    ) -> None:
        self.plan = plan
        self.source = source
        self.cancel = cancel or CancelToken()
        self.on_produced = on_produced
        self._pending: dict[tuple[str, int], _Pending] = {}

    def lazy(self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor) -> ir.LazyTensor:
        """An initializer whose bytes are produced only when written."""
        if weight.quantized:
            self._pending[(weight.name, piece.index)] = _Pending(threading.Lock())

        def produce() -> ir.TensorProtocol:
            self.cancel.raise_if_cancelled()
            array = self.produce(weight, piece, tensor)
            if array.shape != tensor.shape or array.dtype != numpy_dtype(tensor.dtype):
                raise AssertionError(
                    f"{tensor.name}: produced {array.dtype}{list(array.shape)}, "
                    f"planned {tensor.dtype}{list(tensor.shape)}"
                )
            if self.on_produced is not None:
                self.on_produced(tensor)
            return ir.Tensor(array, dtype=ir_dtype(tensor.dtype), name=tensor.name)

        return ir.LazyTensor(
            produce, dtype=ir_dtype(tensor.dtype), shape=ir.Shape(tensor.shape), name=tensor.name
        )

    def produce(self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor) -> np.ndarray:
        """The data of one planned tensor, in its planned dtype and shape."""
        target = numpy_dtype(tensor.dtype)
        if weight.weight.role == "rope_cache":
            return rope_cache(self.plan.spec, weight.name, self.plan.context_length).astype(target)
        if weight.quantized:
            return self._quantized_part(weight, piece, tensor)
        if weight.storage == "float_t":
            data = self.source.read(weight.weight, piece.axis, piece.start, piece.stop)
            self._check_values(weight, data, target, _offset(piece, 0))
            return np.ascontiguousarray(data.T.astype(target, copy=False))
        if not tensor.shape:  # 0-d (a clip bound)
            data = np.asarray(self.source.read(weight.weight, 0, 0, 1))
            self._check_values(weight, data, target, (0, 0))
            return data.astype(target).reshape(())
        out = np.empty(tensor.shape, dtype=target)
        for rows, chunk in self._row_chunks(weight, piece):
            self._check_values(weight, chunk, target, _offset(piece, rows.start or 0))
            out[rows] = chunk
        return out

    def _check_values(
        self, weight: WeightPlan, data: np.ndarray, target: np.dtype, offset: tuple[int, int]
    ) -> None:
        """Refuse NaN / infinite values, and values the target float dtype cannot hold."""
        if getattr(self.source, "values_trusted", False) or data.size == 0:
            return
        limit = float(ml_dtypes.finfo(target).max)
        with np.errstate(invalid="ignore"):  # NaN propagates into both
            lo, hi = float(np.min(data)), float(np.max(data))
        if -limit <= lo and hi <= limit:
            return
        values = np.asarray(data, dtype=np.float32)
        name = self._tensor_name(weight)
        bad = ~np.isfinite(values)
        if bad.any():
            where = _position(np.argwhere(bad)[0], offset)
            raise WeightsError(
                f"{name} holds {int(bad.sum()):,} NaN or infinite value(s), the first at "
                f"{where}: the checkpoint is damaged. Re-download it or re-save it from a "
                "model that loads in transformers"
            )
        index = np.argwhere(np.abs(values) > limit)[0]
        value = float(values[tuple(index)])
        raise WeightsError(
            f"{name} holds {value:.6g} at {_position(index, offset)}, beyond the largest "
            f"{self.plan.options.dtype} value ({limit:.6g}); export with "
            f"{option('dtype', 'fp32')} (or bf16 where the EP runs it)"
        )

    def _tensor_name(self, weight: WeightPlan) -> str:
        describe = getattr(self.source, "tensor_name", None)
        return f"'{describe(weight.weight)}'" if describe else f"'{weight.name}'"

    def _row_chunks(self, weight: WeightPlan, piece: Piece) -> Iterator[tuple[slice, np.ndarray]]:
        """The piece's source data in bounded row chunks (rows are independent for every
        storage: tables are gathered by row, quantization blocks run along a row)."""
        shape = weight.weight.shape
        row_elems = math.prod(shape[1:]) if piece.axis == 0 else piece.stop - piece.start
        if piece.axis == 0 and len(shape) > 1:
            first, last = piece.start, piece.stop
            step = max(1, _CHUNK_ELEMENTS // max(row_elems, 1))
            for begin in range(first, last, step):
                end = min(last, begin + step)
                self.cancel.raise_if_cancelled()
                rows = slice(begin - first, end - first)
                yield rows, self.source.read(weight.weight, 0, begin, end)
        else:
            yield slice(None), self.source.read(weight.weight, piece.axis, piece.start, piece.stop)

    def _quantized_part(
        self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor
    ) -> np.ndarray:
        key = (weight.name, piece.index)
        pending = self._pending.setdefault(key, _Pending(threading.Lock()))
        with pending.lock:
            if pending.parts is None:
                pending.parts = self._quantize_piece(weight, piece)
                pending.remaining = len(piece.tensors)
            array = pending.parts[tensor.part].reshape(tensor.shape)
            pending.remaining -= 1
            if pending.remaining == 0:
                pending.parts = None
                self._pending.pop(key, None)
            return array

    def _quantize_piece(self, weight: WeightPlan, piece: Piece) -> dict[str, np.ndarray]:
        """Quantize one piece chunk by chunk into preallocated 2-D part arrays."""
        from engine.quantize import quantize

        assert weight.bits is not None and weight.block_size is not None
        shape = list(weight.weight.shape)
        shape[piece.axis] = piece.stop - piece.start
        # Blocks run along the last axis; leading axes (the experts of a [E, N, K] tensor)
        # are rows like the others, so a 3-D piece is quantized as [E * N, K].
        cols = shape[-1]
        rows = math.prod(shape[:-1])
        per_first = math.prod(shape[1:-1])
        shapes = quantized_shapes(rows, cols, weight.bits, weight.block_size, weight.storage)
        scale_dtype = numpy_dtype(weight.dtype)
        parts = {
            # 2-D [rows, bytes]: MatMulNBits' blocks padded to whole ones, GBQ's rows as they are.
            "qweight": np.empty((rows, math.prod(shapes["qweight"][1:])), np.uint8),
            "scales": np.empty(shapes["scales"], scale_dtype),
            "zero_points": np.empty(shapes["zero_points"], np.uint8),
        }
        for first, chunk in self._row_chunks(weight, piece):
            index = (
                first
                if first.start is None
                else slice(first.start * per_first, first.stop * per_first)
            )
            blocks = quantize(
                chunk.reshape(-1, cols),
                bits=weight.bits,
                block_size=weight.block_size,
                symmetric=weight.symmetric,
                scale_dtype=scale_dtype,
                method=self.plan.options.quant_method,
                name=self._tensor_name(weight),
            )
            qweight = blocks.qweight
            if weight.storage == "gbq":
                qweight = blocks.gather_data(cols, weight.bits)
            parts["qweight"][index] = qweight
            parts["scales"][index] = blocks.scales
            parts["zero_points"][index] = blocks.zero_points
        return parts
