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

import numpy as np
import onnx_ir as ir

from engine.dtypes import ir_dtype, numpy_dtype
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
            return np.ascontiguousarray(data.T.astype(target, copy=False))
        if not tensor.shape:  # 0-d (a clip bound)
            return np.asarray(self.source.read(weight.weight, 0, 0, 1), dtype=target).reshape(())
        out = np.empty(tensor.shape, dtype=target)
        for rows, chunk in self._row_chunks(weight, piece):
            out[rows] = chunk
        return out

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
        shapes = quantized_shapes(rows, cols, weight.bits, weight.block_size, "gbq")
        scale_dtype = numpy_dtype(weight.dtype)
        parts = {
            "qweight": np.empty(shapes["qweight"], np.uint8),
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
            )
            parts["qweight"][index] = blocks.qweight
            parts["scales"][index] = blocks.scales
            parts["zero_points"][index] = blocks.zero_points
        return parts
