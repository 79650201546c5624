"""Static empty KV: replace a dynamic zero-length tensor with a constant.

KV-shared attention layers feed GroupQueryAttention an empty ``[batch, 0, kv_hidden]``
key/value built as ``Shape -> Concat -> ConstantOfShape -> Cast`` (or ``CastLike``).
Under WebGPU graph capture ``Shape`` leaves the device and ``ConstantOfShape`` has no
WebGPU kernel, so the capture is refused. Graph capture runs batch 1 with static shapes,
so the tensor is the constant ``zeros([1, 0, kv_hidden])`` of the activation dtype.
bfloat16 (which numpy lacks) becomes a float32 constant and a Cast.

Applied only when the EP's ``capture_needs_static_graph`` flag asks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

_NUMPY_FLOATS = {
    ir.DataType.FLOAT: np.float32,
    ir.DataType.FLOAT16: np.float16,
    ir.DataType.DOUBLE: np.float64,
}
_STATIC_BATCH = 1


def _tail_dims(tail: ir.Value) -> list[int] | None:
    if tail.const_value is None:
        return None
    dims = tail.const_value.numpy()
    return [int(d) for d in dims.reshape(-1)] if dims.ndim <= 1 else None


def _check(shape_source: ir.Value, batch: ir.Value, tail: ir.Value) -> MatchResult:
    result = MatchResult()
    node = batch.producer()
    if node is None or node.op_type != "Shape":
        return result.fail("the leading dims do not come from Shape", batch)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", None)
    rank = len(shape_source.shape) if shape_source.shape is not None else None
    stop = end if end is not None else rank
    if start != 0 or stop != 1:
        return result.fail("Shape does not take exactly the batch dimension", node)
    dims = _tail_dims(tail)
    if dims is None:
        return result.fail("the trailing dims are not a constant 1-D tensor", tail)
    if 0 not in dims:
        return result.fail("the tensor is not empty (no zero dim)", tail)
    return result


def _static_empty(op: Any, tail: ir.Value, dtype: ir.DataType) -> ir.Value:
    dims = [_STATIC_BATCH, *(_tail_dims(tail) or [])]
    if dtype in _NUMPY_FLOATS:
        return op.Constant(value=ir.tensor(np.zeros(dims, dtype=_NUMPY_FLOATS[dtype])))
    # No numpy bfloat16 in onnx_ir's constant path: a float32 constant and a Cast.
    zeros = op.Constant(value=ir.tensor(np.zeros(dims, dtype=np.float32)))
    return op.Cast(zeros, to=dtype)


class StaticEmptyKvCast(RewriteRuleClassBase):
    """Shape -> Concat -> ConstantOfShape -> Cast(to=dtype)."""

    def pattern(self, op: Any, shape_source: Any, tail: Any) -> Any:
        batch = op.Shape(shape_source, _allow_other_attributes=True, _outputs=["batch"])
        dims = op.Concat(batch, tail, axis=0)
        zeros = op.ConstantOfShape(dims, _allow_other_attributes=True)
        return op.Cast(zeros, _allow_other_attributes=True, _outputs=["empty"])

    def check(self, op: Any, *args: Any, **values: Any) -> MatchResult:
        return _check(values["shape_source"], values["batch"], values["tail"])

    def rewrite(self, op: Any, tail: ir.Value, empty: ir.Value, **_: Any) -> ir.Value:
        cast = empty.producer()
        assert cast is not None
        return _static_empty(op, tail, ir.DataType(cast.attributes.get_int("to")))


class StaticEmptyKvCastLike(RewriteRuleClassBase):
    """Shape -> Concat -> ConstantOfShape -> CastLike(like)."""

    def pattern(self, op: Any, shape_source: Any, tail: Any, like: Any) -> Any:
        batch = op.Shape(shape_source, _allow_other_attributes=True, _outputs=["batch"])
        dims = op.Concat(batch, tail, axis=0)
        zeros = op.ConstantOfShape(dims, _allow_other_attributes=True)
        return op.CastLike(zeros, like)

    def check(self, op: Any, *args: Any, **values: Any) -> MatchResult:
        result = _check(values["shape_source"], values["batch"], values["tail"])
        if result and values["like"].dtype is None:
            return result.fail("the CastLike target's dtype is unknown", values["like"])
        return result

    def rewrite(self, op: Any, tail: ir.Value, like: ir.Value, **_: Any) -> ir.Value:
        assert like.dtype is not None
        return _static_empty(op, tail, like.dtype)


rules = RewriteRuleSet(
    [
        StaticEmptyKvCast.rule("StaticEmptyKvCast"),
        StaticEmptyKvCastLike.rule("StaticEmptyKvCastLike"),
    ]
)
