"""The vision session of a multimodal Gemma 4 package.

onnxruntime-genai runs it once per image: ``pixel_values`` [1, N, 3 * patch^2] (patches
in [0, 1]) and ``pixel_position_ids`` [1, N, 2] (x, y; padding patches are (-1, -1)) in,
``image_features`` [tokens, text_hidden] out, exactly that image's tokens. The graph
follows transformers' ``Gemma4Model.get_image_features``: patch embedding of
``2 * (x - 0.5)`` plus a learned 2-D position table, an encoder with axial 2-D RoPE and
bidirectional attention over the valid patches, average pooling of k x k patches by
position, ``sqrt(hidden)`` scaling, optional standardization, then ``embed_vision``.

The token count depends on the positions, so the output's size is data-dependent: one
Slice reads it at run time (graph capture cannot replay this session).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.errors import SpecError
from engine.graph import axial_rope
from engine.graph.components import activation
from engine.graph.context import BuildContext
from engine.graph.modules import ClippableLinear, Linear, Module, Param, RMSNorm
from engine.spec import ModelSpec, VisionSpec

F32 = ir.DataType.FLOAT
I32 = ir.DataType.INT32
I64 = ir.DataType.INT64


class VisionAttention(Module):
    """Bidirectional self-attention over the patches, with axial 2-D RoPE."""

    def __init__(self, v: VisionSpec) -> None:
        h, dim, clipped = v.hidden_size, v.head_dim, v.use_clipped_linears
        self._spec = v
        self.q_proj = ClippableLinear(h, v.num_heads * dim, clipped=clipped)
        self.k_proj = ClippableLinear(h, v.num_kv_heads * dim, clipped=clipped)
        self.v_proj = ClippableLinear(h, v.num_kv_heads * dim, clipped=clipped)
        self.o_proj = ClippableLinear(v.num_heads * dim, h, clipped=clipped)
        self.q_norm = RMSNorm(dim, eps=v.rms_norm_eps)
        self.k_norm = RMSNorm(dim, eps=v.rms_norm_eps)
        self.v_norm = RMSNorm(dim, scale=False, eps=v.rms_norm_eps)

    def __call__(self, ctx: BuildContext, x: ir.Value, state: _EncoderState) -> ir.Value:
        op, v = ctx.op, self._spec
        heads, kv_heads, dim = v.num_heads, v.num_kv_heads, v.head_dim

        def per_head(value: ir.Value, count: int) -> ir.Value:
            return op.Reshape(value, ctx.ints([0, 0, count, dim]))

        q = state.rotate(ctx, self.q_norm(ctx, per_head(self.q_proj(ctx, x), heads)))
        k = state.rotate(ctx, self.k_norm(ctx, per_head(self.k_proj(ctx, x), kv_heads)))
        value = self.v_norm(ctx, per_head(self.v_proj(ctx, x), kv_heads))
        q = op.Transpose(q, perm=[0, 2, 1, 3])  # [1, heads, N, D]
        k = op.Transpose(k, perm=[0, 2, 3, 1])  # [1, kv, D, N]
        value = op.Transpose(value, perm=[0, 2, 1, 3])  # [1, kv, N, D]
        chunks = state.kv_chunks
        if chunks == 1:
            out = _attend(ctx, v, kv_heads, q, k, value, state.bias)
        else:
            # Scores of a few KV heads at a time, so none exceeds the EP's buffer limits.
            qs = op.Split(q, axis=1, num_outputs=chunks, _outputs=chunks)
            ks = op.Split(k, axis=1, num_outputs=chunks, _outputs=chunks)
            vs = op.Split(value, axis=1, num_outputs=chunks, _outputs=chunks)
            per = kv_heads // chunks
            parts = [_attend(ctx, v, per, qs[i], ks[i], vs[i], state.bias) for i in range(chunks)]
            out = op.Concat(*parts, axis=1)
        out = op.Reshape(op.Transpose(out, perm=[0, 2, 1, 3]), ctx.ints([0, 0, heads * dim]))
        return self.o_proj(ctx, out)


def _attend(
    ctx: BuildContext,
    v: VisionSpec,
    kv_heads: int,
    q: ir.Value,
    k_t: ir.Value,
    value: ir.Value,
    bias: ir.Value,
) -> ir.Value:
    """softmax(q k^T + bias) v for q [1, kv * G, N, D], k^T [1, kv, D, N], v [1, kv, N, D];
    query heads grouped per KV head as transformers' ``repeat_kv`` pairs them. Gemma 4's
    attention scale is 1. Returns [1, kv * G, N, D]."""
    op = ctx.op
    heads = kv_heads * (v.num_heads // v.num_kv_heads)
    grouped = op.Reshape(q, ctx.ints([0, kv_heads, -1, v.head_dim]))  # [1, kv, G*N, D]
    scores = op.MatMul(grouped, k_t)
    if ctx.dtype != F32:
        scores = op.Cast(scores, to=F32)
    probs = op.Softmax(op.Add(scores, bias), axis=-1)
    if ctx.dtype != F32:
        probs = op.Cast(probs, to=ctx.dtype)
    out = op.MatMul(probs, value)  # [1, kv, G*N, D]
    return op.Reshape(out, ctx.ints([0, heads, -1, v.head_dim]))


class VisionMLP(Module):
    """``down(act(gate(x)) * up(x))`` with clippable linears."""

    def __init__(self, v: VisionSpec) -> None:
        h, inter, clipped = v.hidden_size, v.intermediate_size, v.use_clipped_linears
        self._activation = v.activation
        self.gate_proj = ClippableLinear(h, inter, clipped=clipped)
        self.up_proj = ClippableLinear(h, inter, clipped=clipped)
        self.down_proj = ClippableLinear(inter, h, clipped=clipped)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        gate = activation(ctx, self.gate_proj(ctx, x), self._activation)
        return self.down_proj(ctx, ctx.op.Mul(gate, self.up_proj(ctx, x)))


class VisionEncoderLayer(Module):
    """Attention and MLP, each between a pre- and a post-norm, with residuals."""

    def __init__(self, v: VisionSpec) -> None:
        h, eps = v.hidden_size, v.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps=eps)
        self.self_attn = VisionAttention(v)
        self.post_attention_layernorm = RMSNorm(h, eps=eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps=eps)
        self.mlp = VisionMLP(v)
        self.post_feedforward_layernorm = RMSNorm(h, eps=eps)

    def __call__(self, ctx: BuildContext, x: ir.Value, state: _EncoderState) -> ir.Value:
        op = ctx.op
        attended = self.self_attn(ctx, self.input_layernorm(ctx, x), state)
        x = op.Add(x, self.post_attention_layernorm(ctx, attended))
        out = self.mlp(ctx, self.pre_feedforward_layernorm(ctx, x))
        return op.Add(x, self.post_feedforward_layernorm(ctx, out))


class VisionEncoder(Module):
    def __init__(self, v: VisionSpec) -> None:
        self.layers = [VisionEncoderLayer(v) for _ in range(v.num_layers)]


class PatchEmbedder(Module):
    """A linear projection of each patch's pixels plus the sum of its x and y rows of a
    [2, positions, hidden] table (zero for padding patches)."""

    def __init__(self, v: VisionSpec) -> None:
        self._spec = v
        self.input_proj = Linear(v.patch_pixels, v.hidden_size)
        self.position_embedding_table = Param(
            (2, v.position_embedding_size, v.hidden_size), "table"
        )

    def __call__(self, ctx: BuildContext, pixels: ir.Value, pos: _Positions) -> ir.Value:
        op, v = ctx.op, self._spec
        # transformers scales in the input's dtype, then casts to the weights' dtype.
        scaled = op.Mul(op.Sub(pixels, _f32(ctx, 0.5)), _f32(ctx, 2.0))
        if ctx.dtype != F32:
            scaled = op.Cast(scaled, to=ctx.dtype)
        hidden = self.input_proj(ctx, scaled)
        table = op.Reshape(
            ctx.param(self.position_embedding_table.name), ctx.ints([-1, v.hidden_size])
        )
        y_rows = op.Add(pos.y, _i32(ctx, v.position_embedding_size))
        rows = op.Add(op.Gather(table, pos.x, axis=0), op.Gather(table, y_rows, axis=0))
        rows = op.Where(pos.padding_3d, ctx.scalar(0.0), rows)
        return op.Add(hidden, rows)


class VisionModel(Module):
    """transformers' ``Gemma4VisionModel``: patch embedder, encoder, pooler, standardize."""

    def __init__(self, v: VisionSpec) -> None:
        self._spec = v
        self.patch_embedder = PatchEmbedder(v)
        self.encoder = VisionEncoder(v)
        if v.standardize:
            self.std_bias = Param((v.hidden_size,), "bias")
            self.std_scale = Param((v.hidden_size,), "norm")

    def __call__(self, ctx: BuildContext, pixels: ir.Value, pos: _Positions) -> ir.Value:
        """Pooled, scaled (and standardized) soft tokens of one image, [tokens, hidden]."""
        op = ctx.op
        hidden = self.patch_embedder(ctx, pixels, pos)
        state = _EncoderState(ctx, pos)
        for layer in self.encoder.layers:
            hidden = layer(ctx, hidden, state)
        hidden = op.Where(pos.padding_3d, ctx.scalar(0.0), hidden)
        tokens = _pool(ctx, self._spec, hidden, pos)  # float32
        tokens = op.Mul(tokens, _f32(ctx, self._spec.hidden_size**0.5))
        if self._spec.standardize:
            bias = op.Cast(ctx.param(self.std_bias.name), to=F32)
            scale = op.Cast(ctx.param(self.std_scale.name), to=F32)
            tokens = op.Mul(op.Sub(tokens, bias), scale)
        return op.Cast(tokens, to=ctx.dtype) if ctx.dtype != F32 else tokens


class MultimodalEmbedder(Module):
    """``embed_vision``: RMSNorm without scale, then a bias-free projection into the text
    model's hidden size."""

    def __init__(self, v: VisionSpec, text_hidden: int) -> None:
        self.embedding_pre_projection_norm = RMSNorm(v.hidden_size, scale=False, eps=v.rms_norm_eps)
        self.embedding_projection = Linear(v.hidden_size, text_hidden)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        return self.embedding_projection(ctx, self.embedding_pre_projection_norm(ctx, x))


class VisionTower(Module):
    """The vision session's weight tree, bound at the checkpoint's ``model.`` level."""

    def __init__(self, spec: ModelSpec) -> None:
        v = spec.vision
        if v is None:
            raise SpecError(f"{spec.name} has no vision tower")
        if v.pooling_kernel_size < 2:
            # transformers skips pooling then and keeps the *padding* rows: no sane contract.
            raise SpecError(
                f"{spec.name}: vision pooling_kernel_size {v.pooling_kernel_size} is not "
                "supported (the public models use 3)"
            )
        self.vision_tower = VisionModel(v)
        self.embed_vision = MultimodalEmbedder(v, spec.hidden_size)

    def build(self, ctx: BuildContext) -> None:
        v = ctx.spec.vision
        assert v is not None
        patches: list[int | str] = [1, "num_patches"]
        pixels = ctx.input("pixel_values", F32, [*patches, v.patch_pixels])
        position_dtype = I64 if ctx.caps.int64_on_device else I32
        positions = ctx.input("pixel_position_ids", position_dtype, [*patches, 2])
        tokens = self.vision_tower(ctx, pixels, _Positions(ctx, positions))
        features = self.embed_vision(ctx, tokens)
        ctx.output(
            features, "image_features", ctx.dtype, ["num_image_tokens", ctx.spec.hidden_size]
        )


# ------------------------------------------------------------------------------ helpers


def _f32(ctx: BuildContext, value: float) -> ir.Value:
    return ctx.const(np.array(value, dtype=np.float32))


def _i32(ctx: BuildContext, value: int) -> ir.Value:
    return ctx.const(np.array(value, dtype=np.int32))


class _Positions:
    """Patch positions as int32 (the device-friendly index type), computed once."""

    def __init__(self, ctx: BuildContext, positions: ir.Value) -> None:
        op = ctx.op
        if positions.dtype != I32:
            positions = op.Cast(positions, to=I32)
        x = op.Gather(positions, _index(ctx, 0), axis=2)  # [1, N]
        y = op.Gather(positions, _index(ctx, 1), axis=2)
        minus_one = _i32(ctx, -1)
        self.padding = op.And(op.Equal(x, minus_one), op.Equal(y, minus_one))  # [1, N]
        self.padding_3d = op.Unsqueeze(self.padding, ctx.ints([-1]))
        # clamp(min=0) without Max (onnxruntime-webgpu 1.27 has no Max / Min kernel).
        zero = _i32(ctx, 0)
        self.clamped = op.Where(op.Less(positions, zero), zero, positions)  # [1, N, 2]
        self.x = op.Gather(self.clamped, _index(ctx, 0), axis=2)
        self.y = op.Gather(self.clamped, _index(ctx, 1), axis=2)


def _index(ctx: BuildContext, i: int) -> ir.Value:
    return ctx.const(np.array(i, dtype=np.int64), name=f"index_{i}")


class _EncoderState:
    """What every encoder layer reads: the key-padding bias, RoPE cos / sin, and how many
    KV-head chunks the attention scores are computed in."""

    def __init__(self, ctx: BuildContext, pos: _Positions) -> None:
        op, v = ctx.op, ctx.spec.vision
        assert v is not None
        # Padding keys get float32 min: softmax gives them exactly zero weight.
        bias = op.Where(pos.padding, _f32(ctx, float(np.finfo(np.float32).min)), _f32(ctx, 0.0))
        self.bias = op.Unsqueeze(bias, ctx.ints([1, 2]))  # [1, 1, 1, N]
        # transformers turns padding patches by position -1; their rows never reach a
        # valid token (masked as keys, zeroed before pooling), so clamped positions do.
        inv_freq = axial_rope.axial_inv_freq(v.head_dim, v.rope_theta)
        self.cos, self.sin = axial_rope.cos_sin(
            ctx, pos.clamped, inv_freq, v.position_embedding_size
        )
        self._head_dim = v.head_dim
        self.kv_chunks = kv_chunks(ctx, v)

    def rotate(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        return axial_rope.rotate(ctx, x, self.cos, self.sin, self._head_dim)


def kv_chunks(ctx: BuildContext, v: VisionSpec) -> int:
    """How many pieces the KV heads are split into so that one piece's float32 attention
    scores at the processor's largest image fit the EP's buffer limits (1 without limits)."""
    limits = [
        limit
        for limit in (ctx.options.max_buffer_size, ctx.caps.max_storage_binding_size)
        if limit is not None
    ]
    if not limits:
        return 1
    patches = v.max_soft_tokens * v.pooling_kernel_size**2
    per_kv_head = (v.num_heads // v.num_kv_heads) * patches * patches * 4
    fits = max(1, min(limits) // per_kv_head)
    per_chunk = max(
        d for d in range(1, v.num_kv_heads + 1) if v.num_kv_heads % d == 0 and d <= fits
    )
    return v.num_kv_heads // per_chunk


def _pool(ctx: BuildContext, v: VisionSpec, hidden: ir.Value, pos: _Positions) -> ir.Value:
    """transformers' ``Gemma4VisionPooler`` then ``hidden_states[pooler_mask]``: the mean of
    each k x k block of patches, by position, into N / k^2 slots, keeping the slots some
    patch falls into, in order. Returns float32 [tokens, hidden].

    Patch n goes to slot ``x // k + (max_x // k) * (y // k)`` (positions clamped at 0, so
    padding patches, whose states are zero, count towards slot 0); a one-hot [N/k^2, N]
    matrix averages them. The slot count comes from the input's length without Shape.
    """
    op = ctx.op
    k = v.pooling_kernel_size
    kk = _i32(ctx, k)
    width = op.Add(op.ReduceMax(pos.x, ctx.ints([1]), keepdims=1), _i32(ctx, 1))  # [1, 1]
    slot = op.Add(op.Div(pos.x, kk), op.Mul(op.Div(width, kk), op.Div(pos.y, kk)))  # [1, N]
    # 0 .. N/k^2 - 1: one entry per k^2 patches (Reshape fails, as transformers does,
    # when N is not a multiple of k^2).
    ones = op.Add(op.Mul(slot, _i32(ctx, 0)), _i32(ctx, 1))
    per_slot = op.Gather(op.Reshape(ones, ctx.ints([-1, k * k])), _index(ctx, 0), axis=1)
    slots = op.Sub(op.CumSum(op.Cast(per_slot, to=F32), _axis(ctx, 0)), _f32(ctx, 1.0))
    slots = op.Cast(slots, to=I32)  # [L]
    one_hot = op.Cast(
        op.Equal(op.Unsqueeze(slots, ctx.ints([0, 2])), op.Unsqueeze(slot, ctx.ints([1]))),
        to=F32,
    )  # [1, L, N]
    states = hidden if ctx.dtype == F32 else op.Cast(hidden, to=F32)
    pooled = op.MatMul(op.Mul(one_hot, _f32(ctx, 1.0 / (k * k))), states)  # [1, L, H]
    if ctx.dtype != F32:
        # transformers returns the pooled states in the activation dtype, then rescales
        # them in float32.
        pooled = op.Cast(op.Cast(pooled, to=ctx.dtype), to=F32)
    pooled = op.Reshape(pooled, ctx.ints([-1, v.hidden_size]))  # [L, H]
    # Keep the slots some patch fell into, in order: the j-th kept slot is the number of
    # slots whose running count of kept slots is <= j (the identity when, as for every
    # image grid, the kept slots are a prefix). Float index arithmetic, exact below 2^24,
    # and a float Slice: the ops onnxruntime-webgpu 1.27 runs on the device.
    kept = op.Reshape(op.ReduceMax(one_hot, ctx.ints([2]), keepdims=0), ctx.ints([-1]))  # [L]
    running = op.CumSum(kept, _axis(ctx, 0))
    slots_f = op.Cast(slots, to=F32)
    before = op.LessOrEqual(
        op.Unsqueeze(running, ctx.ints([0])), op.Unsqueeze(slots_f, ctx.ints([1]))
    )  # [j, slot]
    source = op.ReduceSum(op.Cast(before, to=F32), ctx.ints([1]), keepdims=0)
    # Rows past the kept count point one past the end; send them to the last row (they
    # are sliced off below).
    last = op.ReduceMax(slots_f, ctx.ints([0]), keepdims=0)
    source = op.Cast(op.Where(op.Greater(source, last), last, source), to=I32)
    ordered = op.Gather(pooled, source, axis=0)  # [L, H]
    count = op.Cast(op.ReduceSum(kept, ctx.ints([0]), keepdims=1), to=I32)  # [1]
    return op.Slice(ordered, _i32_1d(ctx, 0), count, _i32_1d(ctx, 0))


def _axis(ctx: BuildContext, axis: int) -> ir.Value:
    return ctx.const(np.array(axis, dtype=np.int32), name=f"axis_{axis}_i32")


def _i32_1d(ctx: BuildContext, value: int) -> ir.Value:
    return ctx.const(np.array([value], dtype=np.int32), name=f"i32_1d_{value}")
