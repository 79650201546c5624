"""Turns planned tensors into lazily produced initializer data.

Each planned tensor becomes an ``onnx_ir.LazyTensor`` whose function reads (or
computes) its slice, converts and quantizes it when the writer asks for its bytes; the
writer streams them to disk one at a time, so only the tensors in flight are in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from engine.dtypes import ir_dtype, numpy_dtype
from engine.plan import ExportPlan, Piece, PlannedTensor, WeightPlan
from engine.progress import CancelToken
from engine.spec import ModelSpec
from engine.weights.sources import WeightSource


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
        if not weight.quantized:
            data = self.source.read(weight.weight, piece.axis, piece.start, piece.stop)
            if weight.storage == "float_t":
                data = data.T
            return np.ascontiguousarray(data.astype(target, copy=False))
        return self._quantized_part(weight, piece, tensor)

    def _quantized_part(
        self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor
    ) -> np.ndarray:
        from engine.quantize import quantize

        key = (weight.name, piece.index)
        pending = self._pending.setdefault(key, _Pending(threading.Lock()))
        with pending.lock:
            if pending.parts is None:
                data = self.source.read(weight.weight, piece.axis, piece.start, piece.stop)
                assert weight.bits is not None and weight.block_size is not None
                blocks = quantize(
                    data,
                    bits=weight.bits,
                    block_size=weight.block_size,
                    symmetric=weight.symmetric,
                    scale_dtype=numpy_dtype(weight.dtype),
                    method=self.plan.options.quant_method,
                )
                pending.parts = {
                    "qweight": blocks.qweight,
                    "scales": blocks.scales,
                    "zero_points": blocks.zero_points,
                }
                pending.remaining = len(piece.tensors)
            array = pending.parts[tensor.part].reshape(tensor.shape)
            pending.remaining -= 1
            if pending.remaining == 0:
                pending.parts = None
                self._pending.pop(key, None)
            return array
