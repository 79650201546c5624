"""Gemma 4's mixture-of-experts block (26B-A4B): a router, the experts, and the norms that
join them to the dense MLP running beside them.

As transformers 5.24 computes it (``Gemma4TextDecoderLayer`` with ``enable_moe_block``),
from the residual stream ``r`` after attention and the dense MLP's output ``m``:

* router: ``s = proj(rms(r) * scale * H^-0.5)``; ``p = softmax(s)`` in float32; the
  ``top_k`` largest ``p`` renormalized to sum 1, times ``per_expert_scale`` of the chosen
  experts;
* experts: ``x = pre_feedforward_layernorm_2(r)``; expert ``e`` computes
  ``down_e(gelu_tanh(g) * u)`` with ``[g | u] = gate_up_e(x)`` (the fused weight holds
  the gate rows first); the outputs are summed with the router's weights;
* ``post_feedforward_layernorm_1(m) + post_feedforward_layernorm_2(experts)`` replaces
  the MLP's output before the layer's ``post_feedforward_layernorm``.

Lowerings, chosen by the EP's ``data_dependent_shapes`` flag; both gather the chosen
experts' weights (``Gather`` of float weights, ``GatherBlockQuantized`` of quantized ones,
which dequantizes them exactly) and apply them with batched ``MatMul``s:

* per token (static shapes, graph capture, every op on the WebGPU EP): the top-k experts
  of every token, ``tokens x top_k`` experts' weights, which is little while decoding and
  grows with the prompt during prefill;
* per expert (``Unique``, for EPs without a static-graph need: the CPU): every expert any
  token picked, once, applied to all tokens and weighed by a routing matrix that is zero
  (and masked) where a token did not pick the expert: at most ``min(tokens * top_k, E)``
  experts' weights, so a prefill costs no more memory than one copy of the layer's experts.

No EP we can run has a fused kernel for this block: com.microsoft ``MoE`` / ``QMoE`` on
onnxruntime 1.32's CPU EP refuse ``geglu`` and a separate gate (FC3), and
onnxruntime-webgpu 1.27's ``QMoE`` runs only ``swiglu`` (``tests/engine/test_moe_ops.py``
and ``tests/webgpu/moe_ops.py`` keep measuring both).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.graph.components import activation, linear
from engine.graph.context import BuildContext
from engine.graph.modules import Module, Param, RMSNorm
from engine.spec import LayerSpec, ModelSpec, MoeSpec

EXPERT_AXIS = 0
"""Axis of the expert tensors ([E, N, K]) that the router's indices select."""


class RouterProjection(Module):
    """The router's scores ``x @ W.T`` for W [E, H]. Kept in float by the planner (role
    ``router``): quantizing it would move tokens between experts for a few kilobytes."""

    def __init__(self, hidden: int, num_experts: int) -> None:
        self.weight = Param((num_experts, hidden), "router")


class Router(Module):
    """Picks ``top_k`` experts per token and weighs them."""

    def __init__(self, hidden: int, moe: MoeSpec) -> None:
        self._hidden = hidden
        self._top_k = moe.top_k
        self.norm = RMSNorm(hidden, scale=False)
        self.scale = Param((hidden,), "scale")
        self.proj = RouterProjection(hidden, moe.num_experts)
        self.per_expert_scale = Param((moe.num_experts,), "scale")

    def __call__(self, ctx: BuildContext, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """float32 weights [B, S, k] and int64 expert indices [B, S, k] of hidden states
        x [B, S, H]."""
        op = ctx.op
        h = op.Mul(self.norm(ctx, x), ctx.param(self.scale.name))
        h = op.Mul(h, ctx.scalar(self._hidden**-0.5))
        scores = _float32(ctx, linear(ctx, h, self.proj.weight.name))
        probs = op.Softmax(scores, axis=-1)
        top, index = op.TopK(probs, ctx.ints([self._top_k]), axis=-1, _outputs=2)
        top = op.Div(top, op.ReduceSum(top, ctx.ints([-1]), keepdims=1))
        scale = op.Gather(ctx.param(self.per_expert_scale.name), index, axis=0)
        return op.Mul(top, _float32(ctx, scale)), index


class Experts(Module):
    """``num_experts`` gated GELU MLPs stored as two 3-D tensors, as the checkpoint has them."""

    def __init__(self, hidden: int, moe: MoeSpec, activation: str) -> None:
        self._hidden = hidden
        self._width = moe.intermediate_size
        self._top_k = moe.top_k
        self._activation = activation
        experts = moe.num_experts
        self.gate_up_proj = Param((experts, 2 * moe.intermediate_size, hidden), "experts")
        self.down_proj = Param((experts, hidden, moe.intermediate_size), "experts")

    def __call__(
        self, ctx: BuildContext, x: ir.Value, weights: ir.Value, index: ir.Value
    ) -> ir.Value:
        """The weighted sum of the chosen experts' outputs [B, S, H] for x [B, S, H]."""
        if ctx.caps.data_dependent_shapes:
            return self._per_expert(ctx, x, weights, index)
        return self._per_token(ctx, x, weights, index)

    def _per_token(
        self, ctx: BuildContext, x: ir.Value, weights: ir.Value, index: ir.Value
    ) -> ir.Value:
        op, hidden, width = ctx.op, self._hidden, self._width
        column = op.Reshape(x, ctx.ints([0, 0, 1, hidden, 1]))
        gate_up = selected_matmul(ctx, self.gate_up_proj.name, index, column, axis=3)
        gate_up = op.Reshape(gate_up, ctx.ints([0, 0, 0, 2 * width]))
        gate, up = op.Split(gate_up, axis=-1, num_outputs=2, _outputs=2)
        act = op.Mul(activation(ctx, gate, self._activation), up)
        act = op.Reshape(act, ctx.ints([0, 0, 0, width, 1]))
        out = selected_matmul(ctx, self.down_proj.name, index, act, axis=3)
        out = _float32(ctx, op.Reshape(out, ctx.ints([0, 0, 0, hidden])))
        # transformers weighs each expert's output in float32 and adds it in its dtype.
        weighted = op.Mul(out, op.Reshape(weights, ctx.ints([0, 0, 0, 1])))
        if ctx.dtype != ir.DataType.FLOAT:
            weighted = op.Cast(weighted, to=ctx.dtype)
        return op.ReduceSum(weighted, ctx.ints([2]), keepdims=0)

    def _per_expert(
        self, ctx: BuildContext, x: ir.Value, weights: ir.Value, index: ir.Value
    ) -> ir.Value:
        op, hidden = ctx.op, self._hidden
        experts = op.Unique(op.Reshape(index, ctx.ints([-1])), sorted=1, _outputs=4)[0]  # [U]
        index = op.Reshape(index, ctx.ints([-1, 1, self._top_k]))  # [T, 1, k]
        picked = op.Equal(index, op.Reshape(experts, ctx.ints([1, -1, 1])))  # [T, U, k]
        zero = ctx.const(np.zeros((), np.float32))
        routing = op.Reshape(weights, ctx.ints([-1, 1, self._top_k]))
        routing = op.ReduceSum(op.Where(picked, routing, zero), ctx.ints([2]), keepdims=0)
        chosen = op.Cast(
            op.ReduceMax(op.Cast(picked, to=ir.DataType.FLOAT), ctx.ints([2]), keepdims=0),
            to=ir.DataType.BOOL,
        )  # [T, U]
        tokens = op.Transpose(op.Reshape(x, ctx.ints([-1, hidden])), perm=[1, 0])  # [H, T]
        gate_up = selected_matmul(ctx, self.gate_up_proj.name, experts, tokens, axis=1)
        gate, up = op.Split(gate_up, axis=1, num_outputs=2, _outputs=2)  # [U, I, T] each
        act = op.Mul(activation(ctx, gate, self._activation), up)
        out = _float32(ctx, selected_matmul(ctx, self.down_proj.name, experts, act, axis=1))
        # [U, H, T] weighed by the routing [U, 1, T]; experts a token did not pick give 0
        # (masked, so an overflow there cannot turn 0 * inf into NaN).
        routing = op.Unsqueeze(op.Transpose(routing, perm=[1, 0]), ctx.ints([1]))
        chosen = op.Unsqueeze(op.Transpose(chosen, perm=[1, 0]), ctx.ints([1]))
        weighted = op.Where(chosen, op.Mul(out, routing), zero)
        if ctx.dtype != ir.DataType.FLOAT:
            weighted = op.Cast(weighted, to=ctx.dtype)
        summed = op.Transpose(op.ReduceSum(weighted, ctx.ints([0]), keepdims=0), perm=[1, 0])
        return op.Reshape(summed, op.Shape(x))


def selected_matmul(
    ctx: BuildContext, name: str, index: ir.Value, right: ir.Value, axis: int
) -> ir.Value:
    """``W[index] @ right`` for expert weights W [E, N, K]: the experts ``index`` selects
    (any index shape), each [N, K], times ``right`` (broadcast over the index's axes).
    Pieces split along N are gathered one by one and their products concatenated along
    ``axis``, the products' N axis."""
    wp = ctx.weight(name)
    rows = []
    for piece in wp.pieces:
        parts = ctx.parts(wp, piece)
        if wp.storage == "float":
            chosen = ctx.op.Gather(parts["weight"], index, axis=EXPERT_AXIS)
        else:
            assert wp.storage == "gbq" and wp.bits is not None
            chosen = ctx.ms.GatherBlockQuantized(
                parts["qweight"],
                index,
                parts["scales"],
                parts["zero_points"],
                gather_axis=EXPERT_AXIS,
                quantize_axis=2,
                block_size=wp.block_size,
                bits=wp.bits,
            )
        rows.append(ctx.op.MatMul(chosen, right))
    return rows[0] if len(rows) == 1 else ctx.op.Concat(*rows, axis=axis)


def _float32(ctx: BuildContext, x: ir.Value) -> ir.Value:
    return x if ctx.dtype == ir.DataType.FLOAT else ctx.op.Cast(x, to=ir.DataType.FLOAT)


class MoeBlock(Module):
    """The router, the experts and the three norms of an ``enable_moe_block`` layer.

    Its tensors sit loose in the layer in the checkpoint (``layers.N.router.*``,
    ``layers.N.experts.*``, ``layers.N.post_feedforward_layernorm_1.weight``), so it is
    bound at the layer's level.
    """

    _inline = True

    def __init__(self, spec: ModelSpec, layer: LayerSpec) -> None:
        assert layer.moe is not None
        h = spec.hidden_size
        self.router = Router(h, layer.moe)
        self.experts = Experts(h, layer.moe, spec.hidden_activation)
        self.post_feedforward_layernorm_1 = RMSNorm(h)
        self.post_feedforward_layernorm_2 = RMSNorm(h)
        self.pre_feedforward_layernorm_2 = RMSNorm(h)

    def __call__(self, ctx: BuildContext, mlp_out: ir.Value, residual: ir.Value) -> ir.Value:
        """What replaces the dense MLP's output: its norm plus the experts' normed sum."""
        dense = self.post_feedforward_layernorm_1(ctx, mlp_out)
        weights, index = self.router(ctx, residual)
        experts = self.experts(ctx, self.pre_feedforward_layernorm_2(ctx, residual), weights, index)
        return ctx.op.Add(dense, self.post_feedforward_layernorm_2(ctx, experts))
