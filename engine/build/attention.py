"""Attention lowerings: com.microsoft GroupQueryAttention, and a standard-ONNX path.

Both take queries / keys / values already normed (Gemma's q/k/v norms come before the
rotary embedding) and apply RoPE themselves, read the KV cache in BNSH layout and
return the present KV. A layer that shares another's KV passes ``key=None``: it attends
to the producer's present KV and adds nothing to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from engine.build.context import BuildContext
from engine.spec import AttentionKind, LayerSpec


@dataclass
class AttentionInputs:
    """Per-graph values every attention layer reads, computed once."""

    batch_ids: ir.Value
    """input_ids, for shapes of the empty KV of shared layers."""
    seqlens_k: ir.Value | None = None
    total_length: ir.Value | None = None
    positions: ir.Value | None = None
    bias: dict[AttentionKind, ir.Value] = field(default_factory=dict)
    rope: dict[AttentionKind, tuple[ir.Value, ir.Value]] = field(default_factory=dict)
    empty_kv: dict[int, ir.Value] = field(default_factory=dict)
    """Zero-length keys/values by width, shared by every KV-shared layer."""


def rope_caches(ctx: BuildContext, kind: AttentionKind) -> tuple[ir.Value, ir.Value]:
    """The planned cos / sin cache initializers of one attention kind."""
    values = []
    for part in ("cos", "sin"):
        wp = ctx.weight(f"rope.{kind}.{part}_cache")
        values.append(ctx.parts(wp, wp.pieces[0])["weight"])
    return values[0], values[1]


def gqa_inputs(ctx: BuildContext, input_ids: ir.Value, attention_mask: ir.Value) -> AttentionInputs:
    """seqlens_k, total_sequence_length and (where needed) the sliding-window bias.

    Everything comes from the mask's values, never from Shape: under graph capture the
    runtime passes a static [1, max_length] mask of ones then zeros, and Shape would
    leave the device. total_sequence_length is the mask's width (the attended key
    length, static under capture); seqlens_k the valid length minus one. With int32
    masks (EPs whose int64 arithmetic falls back to the CPU) it all stays in int32.
    """
    op = ctx.op
    mask = attention_mask
    if mask.dtype != ir.DataType.INT32:
        mask = op.Cast(mask, to=ir.DataType.INT32)
    lengths = op.ReduceSum(mask, ctx.ints([1]), keepdims=0)  # [B]
    seqlens_k = op.Sub(lengths, ctx.const(np.array(1, dtype=np.int32), name="one_i32"))
    ones = _ones_like(ctx, mask)
    widths = op.ReduceSum(ones, ctx.ints([1]), keepdims=0)  # [B], every row the mask width
    total = op.Gather(widths, ctx.const(np.array(0, dtype=np.int64), name="index_0"))
    inputs = AttentionInputs(batch_ids=input_ids, seqlens_k=seqlens_k, total_length=total)
    for kind in _kinds(ctx):
        inputs.rope[kind] = rope_caches(ctx, kind)
    if "sliding" in inputs.rope and not ctx.caps.gqa_local_window:
        inputs.bias["sliding"] = _window_bias(ctx, input_ids, lengths, ones)
    return inputs


def _ones_like(ctx: BuildContext, x: ir.Value) -> ir.Value:
    """Ones of x's shape and int dtype, by arithmetic (no Shape, stays on the device)."""
    zero = ctx.const(np.array(0, dtype=np.int32), name="zero_i32")
    one = ctx.const(np.array(1, dtype=np.int32), name="one_i32")
    return ctx.op.Add(ctx.op.Mul(x, zero), one)


def _window_bias(
    ctx: BuildContext, input_ids: ir.Value, lengths: ir.Value, key_ones: ir.Value
) -> ir.Value:
    """Additive [B, 1, S, T] bias keeping keys j with 0 <= p - j < sliding_window for a
    query at position p, for EPs whose GroupQueryAttention ignores ``local_window_size``
    (WebGPU under graph capture) or mishandles it (KV-shared layers).

    Positions are float32 running sums (exact below 2**24) so every op has a float
    kernel on the device.
    """
    op, f32 = ctx.op, ir.DataType.FLOAT
    ids = (
        input_ids
        if input_ids.dtype == ir.DataType.INT32
        else op.Cast(input_ids, to=ir.DataType.INT32)
    )
    query_ones = op.Cast(_ones_like(ctx, ids), to=f32)  # [B, S]
    one = ctx.const(np.array(1.0, dtype=np.float32), name="one_f32")
    query_index = op.Sub(
        op.CumSum(query_ones, ctx.const(np.array(1, dtype=np.int32), name="axis_1_i32")), one
    )
    new_tokens = op.ReduceSum(query_ones, ctx.ints([1]), keepdims=1)  # [B, 1]
    valid = op.Unsqueeze(op.Cast(lengths, to=f32), ctx.ints([1]))  # [B, 1]
    query_pos = op.Add(op.Sub(valid, new_tokens), query_index)  # [B, S]
    key_pos = op.Sub(
        op.CumSum(
            op.Cast(key_ones, to=f32), ctx.const(np.array(1, dtype=np.int32), name="axis_1_i32")
        ),
        one,
    )
    distance = op.Sub(op.Unsqueeze(query_pos, ctx.ints([2])), op.Unsqueeze(key_pos, ctx.ints([1])))
    zero = ctx.const(np.array(0.0, dtype=np.float32), name="zero_f32")
    window = ctx.const(
        np.array(float(ctx.spec.sliding_window), dtype=np.float32), name="window_f32"
    )
    allowed = op.And(op.GreaterOrEqual(distance, zero), op.Less(distance, window))  # [B, S, T]
    bias = op.Where(allowed, ctx.scalar(0.0), ctx.scalar(float(np.finfo(ctx.np_dtype).min)))
    return op.Unsqueeze(bias, ctx.ints([1]))


def gqa(
    ctx: BuildContext,
    layer: LayerSpec,
    inputs: AttentionInputs,
    query: ir.Value,
    key: ir.Value | None,
    value: ir.Value | None,
    past_key: ir.Value,
    past_value: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """GroupQueryAttention with rotary inside; queries [B, S, N*D], keys [B, S, kvN*D].

    Sliding layers use ``local_window_size`` where the EP honours it, else the
    precomputed window bias (then the attribute is left unset).
    """
    kv_width = layer.num_kv_heads * layer.head_dim
    if key is None or value is None:
        if kv_width not in inputs.empty_kv:
            inputs.empty_kv[kv_width] = _empty_kv(ctx, inputs.batch_ids, kv_width)
        key = value = inputs.empty_kv[kv_width]
    cos, sin = inputs.rope[layer.attention]
    bias = inputs.bias.get(layer.attention)
    window = ctx.spec.sliding_window if layer.attention == "sliding" and bias is None else -1
    out, present_key, present_value = ctx.ms.GroupQueryAttention(
        query,
        key,
        value,
        past_key,
        past_value,
        inputs.seqlens_k,
        inputs.total_length,
        cos,
        sin,
        None,  # position_ids: derived from seqlens_k
        bias,
        num_heads=ctx.spec.num_attention_heads,
        kv_num_heads=layer.num_kv_heads,
        scale=1.0,
        do_rotary=1,
        rotary_interleaved=0,
        local_window_size=window,
        _outputs=3,
    )
    return out, present_key, present_value


def _empty_kv(ctx: BuildContext, input_ids: ir.Value, width: int) -> ir.Value:
    """A [B, 0, width] tensor of the activation dtype, built from the batch size.

    This dynamic form works for any batch; the static-empty-KV rewrite replaces it with
    a constant for EPs that run under graph capture (batch 1, no Shape on the device).
    """
    op = ctx.op
    batch = op.Shape(input_ids, start=0, end=1)
    shape = op.Concat(batch, ctx.ints([0, width]), axis=0)
    zeros = op.ConstantOfShape(shape)
    return op.Cast(zeros, to=ctx.dtype)


# ---------------------------------------------------------------------------- standard


def standard_inputs(
    ctx: BuildContext, input_ids: ir.Value, attention_mask: ir.Value
) -> AttentionInputs:
    """Positions, RoPE rows and additive masks for the standard path, once per graph."""
    op = ctx.op
    total = op.Shape(attention_mask, start=1, end=2)  # [1]
    seq = op.Shape(input_ids, start=1, end=2)
    past = op.Sub(total, seq)
    positions = op.Range(
        op.Squeeze(past), op.Squeeze(total), ctx.const(np.array(1, dtype=np.int64))
    )
    key_positions = op.Range(
        ctx.const(np.array(0, dtype=np.int64)),
        op.Squeeze(total),
        ctx.const(np.array(1, dtype=np.int64)),
    )
    distance = op.Sub(
        op.Unsqueeze(positions, ctx.ints([1])), op.Unsqueeze(key_positions, ctx.ints([0]))
    )
    causal = op.GreaterOrEqual(distance, ctx.const(np.array(0, dtype=np.int64)))
    keep = op.Unsqueeze(
        op.Equal(attention_mask, ctx.const(np.array(1, dtype=attention_mask_np(attention_mask)))),
        ctx.ints([1, 2, 3]),
    )  # [B, 1, 1, 1, T]
    inputs = AttentionInputs(batch_ids=input_ids, positions=positions)
    for kind in _kinds(ctx):
        allowed = causal
        if kind == "sliding":
            within = op.Less(distance, ctx.const(np.array(ctx.spec.sliding_window, dtype=np.int64)))
            allowed = op.And(causal, within)
        allowed = op.And(op.Unsqueeze(allowed, ctx.ints([0, 1, 2])), keep)  # [B, 1, 1, S, T]
        inputs.bias[kind] = op.Where(
            allowed,
            ctx.const(np.array(0.0, dtype=np.float32)),
            ctx.const(np.array(np.finfo(np.float32).min, dtype=np.float32)),
        )
        cos, sin = rope_caches(ctx, kind)
        inputs.rope[kind] = (_rope_rows(ctx, cos, positions), _rope_rows(ctx, sin, positions))
    return inputs


def attention_mask_np(mask: ir.Value) -> type:
    return np.int32 if mask.dtype == ir.DataType.INT32 else np.int64


def _rope_rows(ctx: BuildContext, cache: ir.Value, positions: ir.Value) -> ir.Value:
    """cos or sin rows for the positions, doubled for rotate_half: [1, S, 1, D]."""
    rows = ctx.op.Gather(cache, positions, axis=0)  # [S, D/2]
    doubled = ctx.op.Concat(rows, rows, axis=-1)
    return ctx.op.Unsqueeze(doubled, ctx.ints([0, 2]))


def _rotate(ctx: BuildContext, x: ir.Value, rope: tuple[ir.Value, ir.Value]) -> ir.Value:
    """x * cos + rotate_half(x) * sin for x [B, S, heads, D]."""
    op = ctx.op
    cos, sin = rope
    first, second = op.Split(x, axis=-1, num_outputs=2, _outputs=2)
    rotated = op.Concat(op.Neg(second), first, axis=-1)
    return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))


def standard(
    ctx: BuildContext,
    layer: LayerSpec,
    inputs: AttentionInputs,
    query: ir.Value,
    key: ir.Value | None,
    value: ir.Value | None,
    past_key: ir.Value,
    past_value: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """MatMul / Softmax attention with Concat-grown KV; queries [B, S, N*D].

    For a shared layer, ``past_key`` / ``past_value`` are the producer's present KV.
    """
    op = ctx.op
    spec = ctx.spec
    heads, kv_heads, dim = spec.num_attention_heads, layer.num_kv_heads, layer.head_dim
    groups = heads // kv_heads
    rope = inputs.rope[layer.attention]
    q = _rotate(ctx, op.Reshape(query, ctx.ints([0, 0, heads, dim])), rope)
    if key is not None and value is not None:
        k = _rotate(ctx, op.Reshape(key, ctx.ints([0, 0, kv_heads, dim])), rope)
        v = op.Reshape(value, ctx.ints([0, 0, kv_heads, dim]))
        present_key = op.Concat(past_key, op.Transpose(k, perm=[0, 2, 1, 3]), axis=2)
        present_value = op.Concat(past_value, op.Transpose(v, perm=[0, 2, 1, 3]), axis=2)
    else:
        present_key, present_value = past_key, past_value
    # Group queries by KV head: [B, kvN, G, S, D] against [B, kvN, 1, T, D].
    q5 = op.Reshape(op.Transpose(q, perm=[0, 2, 1, 3]), ctx.ints([0, kv_heads, groups, -1, dim]))
    k5 = op.Unsqueeze(op.Transpose(present_key, perm=[0, 1, 3, 2]), ctx.ints([2]))
    scores = op.MatMul(q5, k5)  # Gemma 4's attention scale is 1.0
    if ctx.dtype != ir.DataType.FLOAT:
        scores = op.Cast(scores, to=ir.DataType.FLOAT)
    probs = op.Softmax(op.Add(scores, inputs.bias[layer.attention]), axis=-1)
    if ctx.dtype != ir.DataType.FLOAT:
        probs = op.Cast(probs, to=ctx.dtype)
    out = op.MatMul(probs, op.Unsqueeze(present_value, ctx.ints([2])))  # [B, kvN, G, S, D]
    out = op.Reshape(out, ctx.ints([0, heads, -1, dim]))
    out = op.Reshape(op.Transpose(out, perm=[0, 2, 1, 3]), ctx.ints([0, 0, heads * dim]))
    return out, present_key, present_value


def _kinds(ctx: BuildContext) -> list[AttentionKind]:
    kinds: list[AttentionKind] = []
    for layer in ctx.spec.layers:
        if layer.attention not in kinds:
            kinds.append(layer.attention)
    return kinds
