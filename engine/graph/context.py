"""Shared state of one graph build: op builders, the plan, dtypes, initializers."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxscript

from engine.caps import EpCapabilities
from engine.dtypes import ir_dtype, numpy_dtype
from engine.plan_model import ExportPlan, Piece, PlannedTensor, SessionPlan, WeightPlan
from engine.weights.factory import TensorFactory

OPSET = 23
"""Default-domain opset: new enough for RMSNormalization and Gelu(approximate=tanh), old
enough for every runtime we target (onnxruntime-webgpu 1.27 refuses IR > 11 and
opset > 24)."""
IR_VERSION = 10


class BuildContext:
    """What every component needs while it adds nodes to one session's graph.

    Initializers come from the plan: :meth:`tensor` turns a planned tensor into a graph
    value once, so weights that share bytes (a tied LM head) share the value.
    """

    def __init__(
        self, plan: ExportPlan, session: SessionPlan, factory: TensorFactory | None
    ) -> None:
        self.plan = plan
        self.session = session
        self.spec = plan.spec
        self.options = plan.options
        self.caps: EpCapabilities = plan.caps
        self.factory = factory
        self.dtype_name = plan.options.dtype or plan.caps.default_dtype
        self.dtype = ir_dtype(self.dtype_name)
        self.np_dtype = numpy_dtype(self.dtype_name)
        self.graph = ir.Graph(
            [], [], nodes=[], opset_imports={"": OPSET, "com.microsoft": 1}, name=session.name
        )
        self.builder = onnxscript.GraphBuilder(self.graph)
        self.op = self.builder.op
        self.ms = self.builder.opset("com.microsoft", 1)
        self._values: dict[str, ir.Value] = {}
        self._const_count = 0

    # ------------------------------------------------------------------ weights

    def weight(self, name: str) -> WeightPlan:
        return self.session.weight(name)

    def tensor(self, weight: WeightPlan, piece: Piece, tensor: PlannedTensor) -> ir.Value:
        """The graph value of one planned initializer (created on first use)."""
        value = self._values.get(tensor.name)
        if value is not None:
            return value
        const = (
            _no_data(tensor) if self.factory is None else self.factory.lazy(weight, piece, tensor)
        )
        value = ir.Value(
            name=tensor.name,
            shape=ir.Shape(tensor.shape),
            type=ir.TensorType(ir_dtype(tensor.dtype)),
            const_value=const,
        )
        self.graph.register_initializer(value)
        self._values[tensor.name] = value
        return value

    def param(self, name: str) -> ir.Value:
        """The single float initializer of an unsplit, unquantized weight (norms, biases)."""
        wp = self.weight(name)
        return self.parts(wp, wp.pieces[0])["weight"]

    def param_data(self, name: str) -> np.ndarray | None:
        """The values of a small unsplit float weight (a layer scalar) while the graph is
        built, as the package will store them; None for a graph built without weights."""
        if self.factory is None:
            return None
        wp = self.weight(name)
        piece = wp.pieces[0]
        (tensor,) = [t for t in piece.tensors if t.part == "weight"]
        return self.factory.produce(wp, piece, tensor)

    def parts(self, weight: WeightPlan, piece: Piece) -> dict[str, ir.Value]:
        """A piece's initializers by part (weight / qweight / scales / zero_points)."""
        return {t.part: self.tensor(weight, piece, t) for t in piece.tensors}

    # ------------------------------------------------------------------ constants

    def scalar(self, value: float) -> ir.Value:
        """A scalar constant in the activation dtype."""
        return self.const(np.array(value, dtype=self.np_dtype))

    def const(self, array: np.ndarray, name: str | None = None) -> ir.Value:
        """A small constant initializer (shapes, indices, scalars); named ones are reused,
        and a name asked for again must mean the same array (dtype, shape and values)."""
        if name is not None and name in self.graph.initializers:
            known = self.graph.initializers[name]
            held = known.const_value.numpy() if known.const_value is not None else None
            if held is None or held.dtype != array.dtype or not np.array_equal(held, array):
                raise ValueError(f"constant {name!r} asked for as {array!r}, already {held!r}")
            return known
        self._const_count += 1
        label = name or f"const.{self._const_count}"
        return self.builder.initializer(ir.tensor(array, name=label), name=label, qualify=False)

    def ints(self, values: list[int]) -> ir.Value:
        return self.const(np.array(values, dtype=np.int64))

    # ------------------------------------------------------------------ graph I/O

    def input(self, name: str, dtype: ir.DataType, shape: list[int | str]) -> ir.Value:
        return self.builder.input(name, dtype, shape)

    def output(
        self, value: ir.Value, name: str, dtype: ir.DataType, shape: list[int | str]
    ) -> None:
        value.name = name
        value.type = ir.TensorType(dtype)
        value.shape = ir.Shape(shape)
        self.graph.outputs.append(value)

    def model(self) -> ir.Model:
        return ir.Model(self.graph, ir_version=IR_VERSION, producer_name="export-studio")


def _no_data(tensor: PlannedTensor) -> ir.LazyTensor:
    """Placeholder data for graphs built without weights (audits, previews)."""

    def fail() -> ir.TensorProtocol:
        raise RuntimeError(f"{tensor.name}: this graph was built without weights")

    return ir.LazyTensor(
        fail, dtype=ir_dtype(tensor.dtype), shape=ir.Shape(tensor.shape), name=tensor.name
    )
