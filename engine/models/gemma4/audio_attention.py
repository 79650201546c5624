"""The audio conformer's chunked local attention, as full attention over the clip.

transformers (``Gemma4AudioAttention``) cuts the queries into blocks of ``chunk`` frames
and gives each block a context window of ``C = chunk + left - 1 + right`` keys; its mask
(``_convert_4d_mask_to_blocked_5d`` over a bidirectional mask with
``sliding_window_mask_function((left - 1, right))``) then allows key k for query q when k
is a valid frame and ``0 <= q - k < left - 1`` or ``0 < k - q < right``. Every allowed key
lies inside the query's window, so attention over all S frames with that mask gives the
same weights (masked logits are -1e9 in both; their exp is exactly 0).

The relative-position term of an allowed (q, k) is ``q . relk[p]`` with
``p = left - 1 - (q - k)`` where ``p`` is below the table's ``C // 2 + 1`` rows, else 0
(the zero column ``_rel_shift`` pads in): a Gather from the [S, rows] products. A row
with no allowed key (a padding frame far from any valid one) gets the uniform weights
1/C over its window, as the softmax of C equal logits does there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from engine.graph.context import BuildContext
from engine.graph.modules import ClippableLinear, Linear, Module, Param
from engine.spec import AudioSpec

F32 = ir.DataType.FLOAT


def to_float32(ctx: BuildContext, x: ir.Value) -> ir.Value:
    return x if ctx.dtype == F32 else ctx.op.Cast(x, to=F32)


def f32(ctx: BuildContext, value: float) -> ir.Value:
    """A float32 scalar constant (shared by value)."""
    return ctx.const(np.array(value, dtype=np.float32), name=f"f32_{value!r}")


@dataclass(frozen=True)
class AudioMasks:
    """What every layer's attention shares, computed once from the frame mask."""

    positions: ir.Value
    """[1, S] float32 0..S-1."""
    position_embeddings: ir.Value
    """[rows, hidden] sinusoids of relative distances C//2 .. 0, activation dtype."""
    allowed: ir.Value
    """[S, S] bool: key k may be attended from query q."""
    any_allowed: ir.Value
    """[S, 1] bool: the query has at least one allowed key."""
    fallback: ir.Value
    """[S, S] float32: 1/C over the query's block window (rows without allowed keys)."""
    rel_index: ir.Value
    """[S, S] int32: index of the (q, p) product in the flattened [S * rows] products."""
    rel_in_range: ir.Value | None
    """[S, S] bool: p < rows; None when every allowed key has it."""


def context_size(audio: AudioSpec) -> int:
    return audio.chunk_size + audio.context_left - 1 + audio.context_right


def audio_masks(ctx: BuildContext, audio: AudioSpec, valid: ir.Value) -> AudioMasks:
    """Masks and relative indices for frames ``valid`` [1, S] (float32 0/1)."""
    op = ctx.op
    left, right, chunk = audio.context_left, audio.context_right, audio.chunk_size
    window = context_size(audio)
    rows = window // 2 + 1
    axis_1 = ctx.const(np.array(1, np.int32))
    ones = op.Add(op.Mul(valid, f32(ctx, 0)), f32(ctx, 1))
    positions = op.Sub(op.CumSum(ones, axis_1), f32(ctx, 1))  # [1, S]
    query = op.Transpose(positions, perm=[1, 0])  # [S, 1]
    distance = op.Sub(query, positions)  # q - k, [S, S]
    # Allowed distances form one interval: past 0..left-2, future -(right-1)..-1.
    lowest, highest = -max(right - 1, 0), left - 2
    in_window = op.And(
        op.GreaterOrEqual(distance, f32(ctx, lowest)), op.LessOrEqual(distance, f32(ctx, highest))
    )
    allowed = op.And(in_window, op.Cast(valid, to=ir.DataType.BOOL))
    count = op.ReduceSum(op.Cast(allowed, to=F32), ctx.ints([1]), keepdims=1)
    any_allowed = op.Greater(count, f32(ctx, 0))
    block_start = op.Sub(
        op.Mul(op.Floor(op.Div(query, f32(ctx, chunk))), f32(ctx, chunk)), f32(ctx, left - 1)
    )
    in_block = op.And(
        op.GreaterOrEqual(positions, block_start),
        op.Less(positions, op.Add(block_start, f32(ctx, window))),
    )
    fallback = op.Mul(op.Cast(in_block, to=F32), f32(ctx, 1.0 / window))
    rel = op.Sub(f32(ctx, left - 1), distance)  # p
    flat = op.Add(op.Mul(query, f32(ctx, rows)), op.Clip(rel, f32(ctx, 0), f32(ctx, rows - 1)))
    in_range = op.Less(rel, f32(ctx, rows)) if left - 1 - lowest >= rows else None
    return AudioMasks(
        positions=positions,
        position_embeddings=_position_embeddings(ctx, audio.hidden_size, rows),
        allowed=allowed,
        any_allowed=any_allowed,
        fallback=fallback,
        rel_index=op.Cast(flat, to=ir.DataType.INT32),
        rel_in_range=in_range,
    )


def _position_embeddings(ctx: BuildContext, hidden: int, rows: int) -> ir.Value:
    """``Gemma4AudioRelPositionalEncoding``: [sin | cos] of distances rows-1 .. 0 times
    ``exp(-i * log(1e4) / (hidden/2 - 1))``, computed in the graph from scalars (ORT
    folds it into a constant when the session loads)."""
    op = ctx.op
    timescales = hidden // 2
    increment = math.log(10_000.0) / max(timescales - 1, 1)
    index = op.Range(f32(ctx, 0), f32(ctx, timescales), f32(ctx, 1))
    inverse = op.Exp(op.Mul(index, f32(ctx, -increment)))  # [hidden/2]
    distances = ctx.const(np.arange(rows - 1, -1, -1, dtype=np.float32).reshape(rows, 1))
    scaled = op.Mul(distances, inverse)  # [rows, hidden/2]
    table = op.Concat(op.Sin(scaled), op.Cos(scaled), axis=-1)
    return table if ctx.dtype == F32 else op.Cast(table, to=ctx.dtype)


class AudioAttention(Module):
    """``Gemma4AudioAttention``: clipped q/k/v/post projections, per-dim query scale,
    relative-position keys, logit soft cap, invalid-logit fill; float32 inside, as
    transformers computes it."""

    def __init__(self, audio: AudioSpec) -> None:
        h, clipped = audio.hidden_size, audio.use_clipped_linears
        self._audio = audio
        self.q_proj = ClippableLinear(h, h, clipped=clipped)
        self.k_proj = ClippableLinear(h, h, clipped=clipped)
        self.v_proj = ClippableLinear(h, h, clipped=clipped)
        self.post = ClippableLinear(h, h, clipped=clipped)
        self.relative_k_proj = Linear(h, h)
        self.per_dim_scale = Param((audio.head_dim,), "scalar")

    def __call__(self, ctx: BuildContext, x: ir.Value, masks: AudioMasks) -> ir.Value:
        op, audio = ctx.op, self._audio
        heads, dim = audio.num_heads, audio.head_dim
        split = ctx.ints([0, 0, heads, dim])

        def project(linear: ClippableLinear) -> ir.Value:
            return op.Reshape(to_float32(ctx, linear(ctx, x)), split)  # [1, S, N, D]

        q_scale = dim**-0.5 / math.log(2)
        k_scale = math.log(1 + math.e) / math.log(2)
        per_dim = op.Softplus(to_float32(ctx, ctx.param(self.per_dim_scale.name)))
        query = op.Mul(op.Mul(project(self.q_proj), f32(ctx, q_scale)), per_dim)
        query = op.Transpose(query, perm=[0, 2, 1, 3])  # [1, N, S, D]
        key = op.Transpose(op.Mul(project(self.k_proj), f32(ctx, k_scale)), perm=[0, 2, 3, 1])
        value = op.Transpose(project(self.v_proj), perm=[0, 2, 1, 3])

        rel_key = to_float32(ctx, self.relative_k_proj(ctx, masks.position_embeddings))
        rel_key = op.Transpose(op.Reshape(rel_key, ctx.ints([-1, heads, dim])), perm=[1, 2, 0])
        by_distance = op.Reshape(op.MatMul(query, rel_key), ctx.ints([0, 0, -1]))
        relative = op.Gather(by_distance, masks.rel_index, axis=2)  # [1, N, S, S]
        if masks.rel_in_range is not None:
            relative = op.Where(masks.rel_in_range, relative, f32(ctx, 0))

        cap = f32(ctx, audio.logit_cap)
        logits = op.Add(op.MatMul(query, key), relative)
        logits = op.Mul(op.Tanh(op.Div(logits, cap)), cap)
        logits = op.Where(masks.allowed, logits, f32(ctx, audio.invalid_logits_value))
        weights = op.Where(masks.any_allowed, op.Softmax(logits, axis=-1), masks.fallback)
        out = op.Transpose(op.MatMul(weights, value), perm=[0, 2, 1, 3])
        out = op.Reshape(out, ctx.ints([0, 0, heads * dim]))
        if ctx.dtype != F32:
            out = op.Cast(out, to=ctx.dtype)
        return self.post(ctx, out)
