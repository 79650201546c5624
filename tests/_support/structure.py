"""Checking a graph's structure without its weight bytes."""

from __future__ import annotations

import onnx
import onnx_ir as ir


def structural_proto(model: ir.Model) -> onnx.ModelProto:
    """The model with every initializer turned into a graph input of the same type and
    shape, so ``onnx.checker`` can check it without reading or producing weights."""
    graph = model.graph
    for name in list(graph.initializers):
        value = graph.initializers.pop(name)
        value.const_value = None
        graph.inputs.append(value)
    return ir.to_proto(model)
