"""AWQ's scales in the package: where each input's ``1 / s`` is folded, and a weight source
that reads the checkpoint already scaled (:mod:`engine.quantize.awq` finds ``s``).

An input can be scaled when whatever makes it can absorb ``1 / s`` exactly, found in the
float model's graph (so every family that lowers to the same ops is covered):

* a norm (``RMSNormalization``, ``SimplifiedLayerNormalization``,
  ``SkipSimplifiedLayerNormalization``) whose gain is a checkpoint weight and whose normed
  output only the linears read: the gain is divided by ``s`` (q/k/v, gate/up, an untied
  LM head);
* ``act(gate) * up``, where ``up`` is a linear's output (or a slice of a fused gate_up's,
  after a Split) that only this product reads: those rows of the up projection are divided
  by ``s`` (the down projection).

Anything else (o_proj after attention, Gemma 4's per-layer projections, a tied head, whose
table is also the token lookup) keeps ``s = 1``. The scaled weights are what the package
stores; its graph is the unscaled model's, op for op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.logical import LogicalWeight
from engine.weights.sources import WeightSource, read_fused

NORM_OPS = {
    "RMSNormalization": 1,
    "SimplifiedLayerNormalization": 1,
    "SkipSimplifiedLayerNormalization": 2,
}
"""Norm ops whose output is ``normed(x) * gain`` (no bias), and their gain's input index."""


@dataclass(frozen=True)
class Fold:
    """Where one input's ``1 / s`` goes: a norm's gain (``rows`` None), or rows
    ``rows[0]:rows[1]`` of the linear that makes the input (the up projection)."""

    weight: str
    rows: tuple[int, int] | None = None


def find_folds(proto: Any, inputs: Mapping[str, str]) -> dict[str, Fold]:
    """Activation -> where its ``1 / s`` can be folded, for the activations in ``inputs``
    (checkpoint linear weight -> the activation its MatMul reads) that allow it."""
    initializers = {t.name for t in proto.graph.initializer}
    producer = {out: node for node in proto.graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    linears: dict[str, set[str]] = {}
    for weight, activation in inputs.items():
        linears.setdefault(activation, set()).add(weight)

    def read_once(weight: str, activation: str) -> bool:
        return weight in linears[activation] and len(readers.get(weight, [])) == 1

    def linear_reads(node: Any, activation: str) -> bool:
        """``x @ W^T`` as MatMul(x, W stored [in, out]), or a head's ``W @ x^T`` as
        MatMul(W [out, in], Transpose(x))."""
        if node.op_type == "MatMul":
            return node.input[0] == activation and read_once(node.input[1], activation)
        if node.op_type == "Transpose":
            after = readers.get(node.output[0], [])
            return bool(after) and all(
                n.op_type == "MatMul"
                and n.input[1] == node.output[0]
                and read_once(n.input[0], activation)
                for n in after
            )
        return False

    def only_read_by_linears(activation: str) -> bool:
        nodes = readers.get(activation, [])
        return bool(nodes) and all(linear_reads(n, activation) for n in nodes)

    folds = {}
    for activation in linears:
        node = producer.get(activation)
        if node is None or not only_read_by_linears(activation):
            continue
        fold = _norm_fold(node, activation, initializers, readers)
        if fold is None:
            fold = _up_fold(node, activation, producer, readers, initializers, inputs, proto)
        if fold is not None:
            folds[activation] = fold
    return folds


def _norm_fold(
    node: Any, activation: str, initializers: set[str], readers: dict[str, list[Any]]
) -> Fold | None:
    index = NORM_OPS.get(node.op_type)
    if index is None or node.output[0] != activation or len(node.input) <= index:
        return None
    if node.op_type == "SkipSimplifiedLayerNormalization" and len(node.input) > 3 and node.input[3]:
        return None  # a bias would need the scale too
    gain = node.input[index]
    if gain not in initializers or len(readers.get(gain, [])) != 1:
        return None
    return Fold(gain)


def _up_fold(
    node: Any,
    activation: str,
    producer: dict[str, Any],
    readers: dict[str, list[Any]],
    initializers: set[str],
    inputs: Mapping[str, str],
    proto: Any,
) -> Fold | None:
    """``act(gate) * up``: the factor that is a linear's output (or a Split slice of one)."""
    if node.op_type != "Mul":
        return None
    for factor in node.input:
        if len(readers.get(factor, [])) != 1:
            continue
        made = producer.get(factor)
        if made is None:
            continue
        if made.op_type == "MatMul" and made.input[1] in inputs:
            width = _width(proto, made.input[1])
            return Fold(made.input[1], (0, width)) if width else None
        if made.op_type == "Split":
            matmul = producer.get(made.input[0])
            if matmul is None or matmul.op_type != "MatMul" or matmul.input[1] not in inputs:
                continue
            if _attribute(made, "axis", 0) != -1 or len(readers[made.input[0]]) != 1:
                continue
            sizes = _split_sizes(proto, made, _width(proto, matmul.input[1]))
            if sizes is None:
                continue
            k = list(made.output).index(factor)
            start = int(sum(sizes[:k]))
            return Fold(matmul.input[1], (start, start + int(sizes[k])))
    return None


def _width(proto: Any, name: str) -> int | None:
    """Output features of a MatMul weight stored ``[in, out]``."""
    for t in proto.graph.initializer:
        if t.name == name and len(t.dims) == 2:
            return int(t.dims[1])
    return None


def _constant(proto: Any, name: str) -> list[int] | None:
    from onnx import numpy_helper

    for t in proto.graph.initializer:
        if t.name == name:
            return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return [int(v) for v in numpy_helper.to_array(attr.t).reshape(-1)]
    return None


def _attribute(node: Any, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _split_sizes(proto: Any, node: Any, width: int | None) -> list[int] | None:
    """A last-axis Split's output widths: its ``split`` input, or ``num_outputs`` equal
    parts of ``width``."""
    if len(node.input) > 1 and node.input[1]:
        return _constant(proto, node.input[1])
    parts = _attribute(node, "num_outputs", len(node.output))
    if width is None or width % parts:
        return None
    return [width // parts] * parts


@dataclass
class Scaling:
    """Per-weight factors the package's weights are read with: ``columns[w]`` multiplies
    a linear's input columns, ``divides[w]`` divides a norm gain's values or, with
    ``rows``, a linear's output rows (each list: ``(first, last, s)`` ranges)."""

    columns: dict[str, np.ndarray] = field(default_factory=dict)
    divides: dict[str, list[tuple[int, int, np.ndarray]]] = field(default_factory=dict)

    def add(self, linears: Iterable[str], fold: Fold, scales: np.ndarray, rows: int) -> None:
        """Scale ``linears``' inputs by ``scales`` and fold ``1 / scales`` as ``fold`` says
        (``rows``: the norm's length, or ignored for a row fold)."""
        for weight in linears:
            self.columns[weight] = scales
        first, last = fold.rows or (0, rows)
        self.divides.setdefault(fold.weight, []).append((first, last, scales))

    def __bool__(self) -> bool:
        return bool(self.columns)

    def row_divisor(self, weight: str, length: int) -> np.ndarray | None:
        """The divisor of each of ``length`` rows (or values) of ``weight``; None: none."""
        ranges = self.divides.get(weight)
        if not ranges:
            return None
        out = np.ones(length, dtype=np.float32)
        for first, last, scales in ranges:
            out[first:last] = scales
        return out


class ScaledSource:
    """A :class:`WeightSource` that reads ``inner``'s weights with a :class:`Scaling`
    applied (names are the logical weights' and their parts'), scaled ones in float32;
    everything else it has (messages' tensor names, trust of its values) is the inner
    source's."""

    def __init__(self, inner: WeightSource, scaling: Scaling) -> None:
        self.inner = inner
        self.scaling = scaling

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

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
        data = self.inner.read(weight, axis, start, stop, rows)
        columns = self.scaling.columns.get(weight.name)
        divisor = self.scaling.row_divisor(weight.name, weight.shape[0]) if weight.shape else None
        if columns is None and divisor is None:
            return data
        out = np.asarray(data, dtype=np.float32)
        if columns is not None:
            cols = columns[start:stop] if axis == 1 else columns
            out = out * cols
        if divisor is not None:
            first, last = (start, stop) if axis == 0 else (rows or (0, weight.shape[0]))
            d = divisor[first:last]
            out = out / (d if out.ndim == 1 else d[:, None])
        # float32, not the checkpoint's dtype: a bf16 / fp16 round trip here would round
        # the scaled values twice (bf16: up to 0.35% per gain) or overflow fp16
        return out
