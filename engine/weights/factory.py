"""Turns planned tensors into initializer data, produced in bounded row chunks.

Each planned tensor becomes a :class:`PieceTensor`: an ``onnx_ir.LazyTensor`` that knows
its weight, piece and part. The package writer (:mod:`engine.weights.stream_writer`) asks
:meth:`TensorFactory.chunks` for a piece's data and gets every part of it (the float data,
or the codes, scales and zero points of a quantized piece) one row chunk at a time, from
one pass over the source rows: rows are independent for every storage (tables are
gathered by row, quantization blocks run along a row), so no tensor is ever whole in
memory, however large (E2B's fused per-layer table is 9.4 GB in fp32).
:meth:`TensorFactory.produce` still gives whole arrays, for in-memory use (tests, small
graphs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import ml_dtypes
import numpy as np
import onnx_ir as ir

from engine.dtypes import ir_dtype, numpy_dtype
from engine.errors import WeightsError, option
from engine.plan_model import ExportPlan, Piece, PlannedTensor, WeightPlan
from engine.progress import CancelToken
from engine.quantize.gptq import Feedback
from engine.weights.sources import WeightSource

CHUNK_ELEMENTS = 8 * 1024 * 1024
"""Source elements read (and converted or quantized) at a time: 32 MiB of float32. With
the writer's few workers and the quantizer's temporaries, a few hundred MB in all."""

Chunk = dict[str, np.ndarray]
"""The next rows of every part of a piece (``weight``, or ``qweight`` / ``scales`` /
``zero_points``): each part's bytes continue where its previous chunk's ended."""


def _offset(piece: Piece, rows_read: int) -> tuple[int, int]:
    """Where a chunk read ``rows_read`` rows into a piece starts in the whole tensor."""
    if piece.axis == 0:
        return piece.start + rows_read, 0
    return rows_read, piece.start


def _position(index: np.ndarray, offset: tuple[int, int]) -> str:
    """``[row, col]`` of an element of a chunk, in the whole tensor's indices."""
    return str([int(i) + offset[axis] for axis, i in enumerate(index[:2])] + list(index[2:]))


class PieceTensor(ir.LazyTensor):
    """A planned initializer: whole when asked for its array or bytes, streamed in row
    chunks by ``tofile`` and by the package writer."""

    def __init__(
        self, factory: TensorFactory, weight: WeightPlan, piece: Piece, tensor: PlannedTensor
    ) -> None:
        super().__init__(
            lambda: factory.whole(weight, piece, tensor),
            dtype=ir_dtype(tensor.dtype),
            shape=ir.Shape(tensor.shape),
            name=tensor.name,
        )
        self.factory = factory
        self.weight = weight
        self.piece = piece
        self.planned = tensor

    @property
    def group(self) -> tuple[str, int]:
        """The piece this tensor is a part of: parts of one piece come from one pass."""
        return (self.weight.name, self.piece.index)

    def chunks(self) -> Iterator[Chunk]:
        """Every part of this tensor's piece, row chunk by row chunk."""
        return self.factory.chunks(self.weight, self.piece)

    def tofile(self, file: object) -> None:
        """Write this part's bytes chunk by chunk (a quantized piece is quantized once per
        part this way; the package writer writes all parts from one pass instead)."""
        for chunk in self.chunks():
            file.write(as_bytes(chunk[self.planned.part]))  # type: ignore[attr-defined]


def as_bytes(array: np.ndarray) -> memoryview:
    """The array's bytes, as stored in ONNX (little-endian, row-major), without a copy when
    it is already contiguous."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


class TensorFactory:
    """Produces the data of every planned initializer of a session on demand."""

    def __init__(
        self,
        plan: ExportPlan,
        source: WeightSource,
        cancel: CancelToken | None = None,
        on_produced: Callable[[PlannedTensor], None] | None = None,
        feedback: Mapping[str, Feedback] | None = None,
    ) -> None:
        """``feedback``: GPTQ's statistics per linear weight name (engine.calibration);
        the linears it names are quantized with GPTQ, every other weight as the options
        say (RTN or the scale search)."""
        self.plan = plan
        self.source = source
        self.cancel = cancel or CancelToken()
        self.on_produced = on_produced
        self.feedback = feedback or {}
        self.gptq_fallbacks: set[str] = set()
        """Calibrated weights quantized by RTN after all (a width that is not whole blocks)."""
        self.gptq_applied: set[str] = set()
        """Weights GPTQ quantized (the rest of a calibrated export: round to nearest)."""
        self.gptq_inputs: dict[str | int, Feedback] = {}
        """The distinct inputs those weights were calibrated on (by their Feedback's source,
        or its ``id`` where it has none), without their arrays (:meth:`Feedback.stripped`:
        a large model's factors would add up to GBs)."""

    def lazy(self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor) -> PieceTensor:
        """An initializer whose bytes are produced only when written."""
        return PieceTensor(self, weight, piece, tensor)

    def whole(self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor) -> ir.Tensor:
        """One planned tensor, whole, as an ``onnx_ir`` tensor."""
        self.cancel.raise_if_cancelled()
        array = self.produce(weight, piece, tensor)
        if self.on_produced is not None:
            self.on_produced(tensor)
        return ir.Tensor(array, dtype=ir_dtype(tensor.dtype), name=tensor.name)

    def produce(self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor) -> np.ndarray:
        """The data of one planned tensor, in its planned dtype and shape."""
        out = np.empty(tensor.shape, dtype=numpy_dtype(tensor.dtype))
        flat = out.reshape(-1)
        filled = 0
        for chunk in self.chunks(weight, piece):
            part = chunk[tensor.part]
            if part.dtype != out.dtype:
                raise AssertionError(
                    f"{tensor.name}: produced {part.dtype}, planned {tensor.dtype}"
                )
            flat[filled : filled + part.size] = part.reshape(-1)
            filled += part.size
        if filled != out.size:
            raise AssertionError(
                f"{tensor.name}: produced {filled} elements, planned {list(tensor.shape)}"
            )
        return out

    def chunks(self, weight: WeightPlan, piece: Piece) -> Iterator[Chunk]:
        """Every part of a piece, in row chunks of at most :data:`CHUNK_ELEMENTS` source
        elements, each already in its planned dtype."""
        target = numpy_dtype(weight.dtype)
        computed = weight.weight.computed
        if computed is not None:
            length, cols = weight.weight.shape
            step = max(1, CHUNK_ELEMENTS // max(cols, 1))
            for begin in range(0, length, step):
                self.cancel.raise_if_cancelled()
                rows = computed.rows(begin, min(length, begin + step), cols)
                yield {"weight": rows.astype(target, copy=False)}
            return
        if weight.storage == "float_t":
            # [out, in] -> [in, out]: a transpose needs the whole weight (one linear layer,
            # tens of MB); its rows are not the source's rows.
            data = self.source.read(weight.weight, piece.axis, piece.start, piece.stop)
            self._check_values(weight, data, target, _offset(piece, 0))
            yield {"weight": np.ascontiguousarray(data.T.astype(target, copy=False))}
            return
        if not weight.weight.shape:  # 0-d: a clip bound or a layer scalar
            data = np.asarray(self.source.read(weight.weight, 0, 0, 1))
            if weight.weight.role == "clip":
                yield {"weight": self._clip_bound(weight, data, target)}
                return
            self._check_values(weight, data, target, (0, 0))
            yield {"weight": data.astype(target).reshape(())}
            return
        rows_read = 0
        feedback: list[Feedback | None] = []  # looked up once a piece (it may be measured)
        for rows in self._source_rows(weight, piece):
            if weight.quantized:
                yield self._quantize(weight, rows, feedback)
            else:
                # Quantized weights are not checked: their scales, not their values, must
                # fit the dtype (as before the chunked writer).
                self._check_values(weight, rows, target, _offset(piece, rows_read))
                yield {"weight": rows.astype(target, copy=False)}
            rows_read += rows.shape[0]

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

    def _clip_bound(self, weight: WeightPlan, data: np.ndarray, target: np.dtype) -> np.ndarray:
        """A clamp bound in the package's dtype. -inf / inf are what transformers
        initialises the bounds to and mean "no clamp": they are kept, and ``Clip`` with an
        infinite bound passes every value through as ``torch.clamp`` does. A finite bound
        beyond the dtype's range becomes infinite too, as ``model.half()`` makes it: no
        value of that dtype reaches it. Only NaN, which clamps every value to NaN, is
        refused."""
        value = float(np.asarray(data, dtype=np.float32).reshape(()))
        if math.isnan(value):
            raise WeightsError(
                f"{self._tensor_name(weight)} (a clamp bound) is NaN: the checkpoint is "
                "damaged. Re-download it or re-save it from a model that loads in transformers"
            )
        with np.errstate(over="ignore"):
            return np.asarray(value, dtype=np.float32).astype(target).reshape(())

    def _tensor_name(self, weight: WeightPlan) -> str:
        describe = getattr(self.source, "tensor_name", None)
        return f"'{describe(weight.weight)}'" if describe else f"'{weight.name}'"

    def _source_rows(self, weight: WeightPlan, piece: Piece) -> Iterator[np.ndarray]:
        """The piece's source data in bounded chunks of whole rows (of axis 0)."""
        shape = weight.weight.shape
        if piece.axis == 0:
            first, last = piece.start, piece.stop
            row_elems = math.prod(shape[1:])
        else:
            first, last = 0, shape[0]
            row_elems = math.prod(shape[1:]) // shape[piece.axis] * (piece.stop - piece.start)
        step = max(1, CHUNK_ELEMENTS // max(row_elems, 1))
        for begin in range(first, last, step):
            end = min(last, begin + step)
            self.cancel.raise_if_cancelled()
            if piece.axis == 0:
                yield self.source.read(weight.weight, 0, begin, end)
            else:
                yield self.source.read(
                    weight.weight, piece.axis, piece.start, piece.stop, rows=(begin, end)
                )

    def _feedback(self, weight: WeightPlan, cols: int) -> Feedback | None:
        """GPTQ's statistics for a MatMulNBits weight (a fused one's parts read one input:
        its first part's), or a token table a tied head reads (its rows are the head's
        outputs), when calibrated and the width is whole blocks."""
        if not self.feedback or weight.block_size is None:
            return None
        if weight.storage not in ("matmulnbits", "gbq"):
            return None
        name = (weight.weight.parts or (weight.weight,))[0].name
        found = self.feedback.get(name)
        if found is None:
            return None
        if cols % weight.block_size or found.factor.shape[0] != cols:
            self.gptq_fallbacks.add(weight.name)
            return None
        return found

    def _quantize(
        self, weight: WeightPlan, rows: np.ndarray, found: list[Feedback | None]
    ) -> Chunk:
        """Quantize whole rows: blocks run along a row, so chunks quantize independently
        and their parts' bytes follow each other in the planned tensors. ``found``: the
        piece's GPTQ feedback once looked up (empty before its first chunk)."""
        from engine.quantize import quantize

        assert weight.bits is not None and weight.block_size is not None
        # Blocks run along the last axis; leading axes (the experts of a [E, N, K] tensor)
        # are rows like the others, so a 3-D chunk is quantized as [E * N, K].
        cols = rows.shape[-1]
        if not found:
            found.append(self._feedback(weight, cols))
        feedback = found[0]
        if feedback is not None:
            from engine.quantize.gptq import gptq_quantize

            self.gptq_applied.add(weight.name)
            self.gptq_inputs[feedback.source or id(feedback)] = feedback.stripped()
            blocks = gptq_quantize(
                rows.reshape(-1, cols),
                feedback,
                bits=weight.bits,
                block_size=weight.block_size,
                symmetric=weight.symmetric,
                scale_dtype=numpy_dtype(weight.dtype),
                name=self._tensor_name(weight),
            )
        else:
            blocks = quantize(
                rows.reshape(-1, cols),
                bits=weight.bits,
                block_size=weight.block_size,
                symmetric=weight.symmetric,
                scale_dtype=numpy_dtype(weight.dtype),
                method=self.plan.options.block_quantizer,
                name=self._tensor_name(weight),
            )
        # MatMulNBits' blocks padded to whole ones, GatherBlockQuantized's rows as they are.
        qweight = (
            blocks.gather_data(cols, weight.bits) if weight.storage == "gbq" else blocks.qweight
        )
        return {
            "qweight": qweight,
            "scales": blocks.scales,
            "zero_points": blocks.zero_points,
        }
