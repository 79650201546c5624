"""Attention lowerings, chosen by EP flags.

* ``gqa``: com.microsoft GroupQueryAttention does RoPE, the KV-cache update (growing or
  in a shared past/present buffer) and attention, with ``local_window_size`` for sliding
  layers. KV-shared layers call it with empty keys/values and the producer's present KV.
  On EPs whose GroupQueryAttention cannot be trusted under graph capture
  (``explicit_attention_over_cache``) the same plan path is lowered without it, over
  static shared buffers: :mod:`engine.graph.static_attention`. On EPs whose GQA kernels
  serve heads only up to ``gqa_max_head_dim`` (CUDA: 256), the kinds with wider heads
  (Gemma 4's full layers) take that lowering and the others keep GQA, one buffer dtype.
* ``standard``: plain ONNX ops with a Concat-grown cache, for EPs without GQA.

Queries, keys and values arrive already normed (Gemma 4 norms them before RoPE), as
[B, S, heads * head_dim]; caches are BNSH.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx_ir as ir

from engine.errors import OptionsError, option
from engine.graph.components import scaled
from engine.graph.context import BuildContext
from engine.options import ExportOptions
from engine.spec import AttentionKind, LayerSpec, ModelSpec

F32 = ir.DataType.FLOAT

GQA_HEAD_MULTIPLE = 16
"""GroupQueryAttention kernels need head sizes that are multiples of 16."""


def attention_path(spec: ModelSpec, options: ExportOptions) -> Literal["gqa", "standard"]:
    """GroupQueryAttention where the EP, dtype and head sizes allow it, else standard ONNX."""
    bad = sorted({layer.head_dim for layer in spec.layers if layer.head_dim % GQA_HEAD_MULTIPLE})
    if options.attention == "standard":
        return "standard"
    if options.attention == "gqa":
        if bad:
            raise OptionsError(
                f"GroupQueryAttention needs head sizes that are multiples of {GQA_HEAD_MULTIPLE}; "
                f"this model has {bad}. Use {option('attention', 'standard')} (or auto)"
            )
        return "gqa"
    return "gqa" if options.uses_gqa and not bad else "standard"


def uses_static_buffers(spec: ModelSpec, options: ExportOptions) -> bool:
    """The capture-safe lowering over static shared KV buffers (no GroupQueryAttention):
    the ``gqa`` path on an EP with ``explicit_attention_over_cache``."""
    return options.caps.explicit_attention_over_cache and attention_path(spec, options) == "gqa"


def static_kinds(spec: ModelSpec, options: ExportOptions) -> frozenset[AttentionKind]:
    """Attention kinds lowered over static shared buffers (:mod:`engine.graph.static_attention`):
    every kind where :func:`uses_static_buffers`; on the ``gqa`` path, the kinds with a
    layer wider than :attr:`EpCapabilities.gqa_max_head_dim`; else none."""
    if attention_path(spec, options) != "gqa":
        return frozenset()
    if options.caps.explicit_attention_over_cache:
        return frozenset(layer.attention for layer in spec.layers)
    limit = options.caps.gqa_max_head_dim
    if limit is None:
        return frozenset()
    return frozenset(layer.attention for layer in spec.layers if layer.head_dim > limit)


def packs_qkv(spec: ModelSpec, options: ExportOptions) -> bool:
    """q, k and v as one projection for GroupQueryAttention
    (:attr:`EpCapabilities.packed_qkv`; packed, or split where q and k only are normed):
    the ``gqa`` path without static buffers."""
    caps = options.caps
    return (
        caps.packed_qkv
        and not caps.explicit_attention_over_cache
        and attention_path(spec, options) == "gqa"
    )


@dataclass
class AttentionInputs:
    """Values every attention layer reads, computed once per graph."""

    input_ids: ir.Value
    """[B, S] values, one per new token: the ids, or a float row of the input embeddings."""
    seqlens_k: ir.Value | None = None
    total_length: ir.Value | None = None
    query_positions: ir.Value | None = None
    """Positions of the new tokens, int64 [S] (standard path)."""
    caches: dict[AttentionKind, tuple[ir.Value, ir.Value]] = field(default_factory=dict)
    rope_rows: dict[AttentionKind, tuple[ir.Value, ir.Value]] = field(default_factory=dict)
    """cos / sin rows of the query positions, [1 or B, S, 1, head_dim]."""
    bias: dict[AttentionKind, ir.Value] = field(default_factory=dict)
    """Additive masks [B, 1, S, T] by attention kind (standard path)."""
    empty_kv: dict[int, ir.Value] = field(default_factory=dict)


def _kinds(ctx: BuildContext) -> list[AttentionKind]:
    kinds: list[AttentionKind] = []
    for layer in ctx.spec.layers:
        if layer.attention not in kinds:
            kinds.append(layer.attention)
    return kinds


def rotary_kinds(spec: ModelSpec) -> list[AttentionKind]:
    """The attention kinds some layer rotates q and k in, in first-use order (a kind whose
    layers all skip RoPE has no caches)."""
    kinds: list[AttentionKind] = []
    for layer in spec.layers:
        if layer.rope and layer.attention not in kinds:
            kinds.append(layer.attention)
    return kinds


def rope_caches(ctx: BuildContext, kind: AttentionKind) -> tuple[ir.Value, ir.Value]:
    """The planned cos / sin cache initializers of one attention kind."""
    values = []
    for part in ("cos", "sin"):
        wp = ctx.weight(f"rope.{kind}.{part}_cache")
        values.append(ctx.parts(wp, wp.pieces[0])["weight"])
    return values[0], values[1]


def long_rope(ctx: BuildContext, kind: AttentionKind) -> tuple[int, int] | None:
    """``(rows per set, original length)`` where the kind's caches hold longrope's short
    and long sets (:class:`~engine.logical.RopeTable`), else None. Once the sequence is
    longer than the original length, the new tokens' rows are ``rows per set`` further on,
    as transformers picks ``long_factor`` for a whole forward by its largest position."""
    computed = ctx.weight(f"rope.{kind}.cos_cache").weight.computed
    if computed is None or computed.long_from is None:
        return None
    original = computed.rope.original_max_position_embeddings
    assert original is not None
    return computed.long_from, original


def long_offset(
    ctx: BuildContext, length: ir.Value, switch: tuple[int, int], dtype: type, margin: float = 0
) -> ir.Value:
    """``rows per set`` where ``length`` (a sequence length, or the largest position
    ``margin`` below one) exceeds the original length, else 0, in ``length``'s dtype."""
    rows, original = switch
    op, name = ctx.op, np.dtype(dtype).name
    bound = original - margin
    longer = op.Greater(length, _scalar(ctx, bound, dtype, f"rope_bound_{bound}_{name}"))
    ir_dtype = ir.DataType.from_numpy(np.dtype(dtype))
    rows_value = _scalar(ctx, rows, dtype, f"rope_rows_{rows}_{name}")
    return op.Mul(op.Cast(longer, to=ir_dtype), rows_value)


def _scalar(ctx: BuildContext, value: float | int, dtype: type, name: str) -> ir.Value:
    return ctx.const(np.array(value, dtype=dtype), name=name)


def _ones_like(ctx: BuildContext, x: ir.Value) -> ir.Value:
    """Int32 ones of x's shape by arithmetic: no Shape, so it stays on the device."""
    zero, one = _scalar(ctx, 0, np.int32, "zero_i32"), _scalar(ctx, 1, np.int32, "one_i32")
    return ctx.op.Add(ctx.op.Mul(x, zero), one)


def ones_of(ctx: BuildContext, x: ir.Value, dtype: ir.DataType = F32) -> ir.Value:
    """Ones of a float tensor's shape, whatever its values (NaN and inf included), without
    Shape, so it stays on the device: ``Where(x == x, 1, 1)`` (two kernels; ``x == x`` is
    false only at NaN, and both branches are 1)."""
    np_dtype = dtype.numpy()
    name = f"one_{_SUFFIX.get(np_dtype.name, np_dtype.name)}"
    one = ctx.const(np.array(1, dtype=np_dtype), name=name)
    return ctx.op.Where(ctx.op.Equal(x, x), one, one)


_SUFFIX = {"float32": "f32", "int32": "i32", "int64": "i64"}


def _token_ones(ctx: BuildContext, tokens: ir.Value) -> ir.Value:
    """Float32 ones [B, S], one per new token, from the ids or a float row of embeddings."""
    if tokens.dtype in (ir.DataType.INT32, ir.DataType.INT64):
        ids = (
            tokens
            if tokens.dtype == ir.DataType.INT32
            else ctx.op.Cast(tokens, to=ir.DataType.INT32)
        )
        return ctx.op.Cast(_ones_like(ctx, ids), to=F32)
    return ones_of(ctx, tokens)


def token_row(ctx: BuildContext, embeds: ir.Value) -> ir.Value:
    """[B, S] from inputs_embeds [B, S, H]: stands in for the ids where a session has none."""
    return ctx.op.Gather(embeds, _scalar(ctx, 0, np.int64, "index_0"), axis=2)


def _running_index(ctx: BuildContext, ones: ir.Value) -> ir.Value:
    """0, 1, 2, ... along axis 1 of a float ones tensor (CumSum - 1; exact below 2**24)."""
    axis = _scalar(ctx, 1, np.int32, "axis_1_i32")
    return ctx.op.Sub(ctx.op.CumSum(ones, axis), _scalar(ctx, 1.0, np.float32, "one_f32"))


# ------------------------------------------------------------------------------ inputs


def gqa_inputs(
    ctx: BuildContext,
    input_ids: ir.Value,
    attention_mask: ir.Value,
    skip_kinds: frozenset[AttentionKind] = frozenset(),
) -> AttentionInputs:
    """seqlens_k / total_sequence_length for GroupQueryAttention, from the mask's values,
    and the RoPE caches of every rotary kind but ``skip_kinds`` (lowered without GQA).
    With int32 I/O (EPs whose int64 arithmetic leaves the device) all of it stays int32.
    """
    op = ctx.op
    mask = attention_mask
    if mask.dtype != ir.DataType.INT32:
        mask = op.Cast(mask, to=ir.DataType.INT32)
    lengths = op.ReduceSum(mask, ctx.ints([1]), keepdims=0)  # [B] valid lengths
    seqlens_k = op.Sub(lengths, _scalar(ctx, 1, np.int32, "one_i32"))
    inputs = AttentionInputs(input_ids=input_ids, seqlens_k=seqlens_k)
    # The mask's width: the attended length for every row, also with left padding.
    if ctx.caps.host_total_length:  # from the shape: stays on the host, no copy
        width = op.Gather(op.Shape(attention_mask), _scalar(ctx, 1, np.int64, "index_1"))
        inputs.total_length = op.Cast(width, to=ir.DataType.INT32)
    else:
        widths = op.ReduceSum(_ones_like(ctx, mask), ctx.ints([1]), keepdims=0)
        inputs.total_length = op.Gather(widths, _scalar(ctx, 0, np.int64, "index_0"))
    for kind in rotary_kinds(ctx.spec):
        if kind in skip_kinds:
            continue
        cos, sin = rope_caches(ctx, kind)
        switch = long_rope(ctx, kind)
        if switch is not None:
            cos, sin = _one_set(ctx, cos, sin, seqlens_k, switch)
        inputs.caches[kind] = (cos, sin)
    return inputs


def _one_set(
    ctx: BuildContext,
    cos: ir.Value,
    sin: ir.Value,
    seqlens_k: ir.Value,
    switch: tuple[int, int],
) -> tuple[ir.Value, ir.Value]:
    """GroupQueryAttention reads its caches' rows by position: hand it longrope's short or
    long set whole. The choice comes from the mask's values (the longest valid length, as
    ``seqlens_k`` holds it), not from ``total_sequence_length``, which is the buffer's
    length under graph capture (genai's static mask), and it is a Gather on the device:
    a Slice would need its starts on the host (a copy that breaks CUDA graphs)."""
    op = ctx.op
    rows, original = switch
    last = op.ReduceMax(seqlens_k, ctx.ints([0]), keepdims=0)  # the longest length - 1
    longer = op.Greater(last, _scalar(ctx, original - 1, np.int32, f"rope_last_short_{original}"))
    index = op.Cast(longer, to=ir.DataType.INT32)
    picked = []
    for cache in (cos, sin):
        stacked = op.Reshape(cache, ctx.ints([2, rows, -1]))  # [short; long]
        picked.append(op.Gather(stacked, index, axis=0))
    return picked[0], picked[1]


def query_positions(
    ctx: BuildContext, tokens: ir.Value, attention_mask: ir.Value, *, right_padded: bool = False
) -> ir.Value:
    """float32 [B, S]: positions of the new tokens, ``valid - S + 0..S-1``, from the mask's
    values (no Shape: under graph capture it is a static [1, max_length] of ones then
    zeros) and ``tokens`` (the ids, or a float row of the input embeddings).

    ``right_padded``: ``max(valid - S, 0) + 0..S-1``, GroupQueryAttention's convention
    (and genai's batches: a shorter prompt padded on the right is at 0..S-1, its pads
    after it; one new token at ``valid - 1``), for layers beside GQA ones. Equal to the
    other where no row is padded."""
    op = ctx.op
    mask = attention_mask
    if mask.dtype != ir.DataType.INT32:
        mask = op.Cast(mask, to=ir.DataType.INT32)
    lengths = op.ReduceSum(mask, ctx.ints([1]), keepdims=0)  # [B] valid lengths
    query_ones = _token_ones(ctx, tokens)  # [B, S]
    new_tokens = op.ReduceSum(query_ones, ctx.ints([1]), keepdims=1)
    valid = op.Unsqueeze(op.Cast(lengths, to=F32), ctx.ints([1]))
    first = op.Sub(valid, new_tokens)
    if right_padded:
        first = op.Max(first, _scalar(ctx, 0.0, np.float32, "zero_f32"))
    return op.Add(first, _running_index(ctx, query_ones))


def standard_inputs(
    ctx: BuildContext, input_ids: ir.Value, attention_mask: ir.Value
) -> AttentionInputs:
    """Positions, RoPE rows and additive masks for the standard path, once per graph."""
    op = ctx.op
    total = op.Shape(attention_mask, start=1, end=2)  # [1]
    past = op.Sub(total, op.Shape(input_ids, start=1, end=2))
    one, zero = _scalar(ctx, 1, np.int64, "one_i64"), _scalar(ctx, 0, np.int64, "zero_i64")
    positions = op.Range(op.Squeeze(past), op.Squeeze(total), one)  # [S]
    key_positions = op.Range(zero, op.Squeeze(total), one)  # [T]
    distance = op.Sub(
        op.Unsqueeze(positions, ctx.ints([1])), op.Unsqueeze(key_positions, ctx.ints([0]))
    )  # [S, T]
    mask_one = np.array(
        1, dtype=np.int32 if attention_mask.dtype == ir.DataType.INT32 else np.int64
    )
    keep = op.Unsqueeze(op.Equal(attention_mask, ctx.const(mask_one)), ctx.ints([1, 2]))
    inputs = AttentionInputs(input_ids=input_ids, query_positions=positions)
    rotated = rotary_kinds(ctx.spec)
    for kind in _kinds(ctx):
        allowed = op.GreaterOrEqual(distance, zero)
        if kind == "sliding":
            window = _scalar(ctx, ctx.spec.sliding_window, np.int64, "window_i64")
            allowed = op.And(allowed, op.Less(distance, window))
        allowed = op.And(op.Unsqueeze(allowed, ctx.ints([0, 1])), keep)  # [B, 1, S, T]
        inputs.bias[kind] = _additive(ctx, allowed)
        if kind not in rotated:
            continue
        cos, sin = rope_caches(ctx, kind)
        switch = long_rope(ctx, kind)
        shifted = positions
        if switch is not None:
            shifted = op.Add(positions, long_offset(ctx, total, switch, np.int64))
        rows = op.Unsqueeze(shifted, ctx.ints([0]))  # [1, S]
        inputs.rope_rows[kind] = (_rope_rows(ctx, cos, rows), _rope_rows(ctx, sin, rows))
    return inputs


def _additive(ctx: BuildContext, allowed: ir.Value) -> ir.Value:
    """0 where allowed, float32 min elsewhere (scores are float32 when masked)."""
    return ctx.op.Where(
        allowed,
        _scalar(ctx, 0.0, np.float32, "zero_f32"),
        _scalar(ctx, float(np.finfo(np.float32).min), np.float32, "min_f32"),
    )


def _rope_rows(ctx: BuildContext, cache: ir.Value, rows: ir.Value) -> ir.Value:
    """cos or sin rows for positions ``rows`` [B, S], doubled for rotate_half: [B, S, 1, D]."""
    half = ctx.op.Gather(cache, rows, axis=0)  # [B, S, D/2]
    return ctx.op.Unsqueeze(ctx.op.Concat(half, half, axis=-1), ctx.ints([2]))


def _rotate(ctx: BuildContext, x: ir.Value, rope: tuple[ir.Value, ir.Value]) -> ir.Value:
    """x * cos + rotate_half(x) * sin for x [B, S, heads, D]."""
    op = ctx.op
    cos, sin = rope
    first, second = op.Split(x, axis=-1, num_outputs=2, _outputs=2)
    rotated = op.Concat(op.Neg(second), first, axis=-1)
    return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))


# ------------------------------------------------------------------------------ layers


def _explicit(
    ctx: BuildContext,
    layer: LayerSpec,
    query: ir.Value,
    keys: ir.Value,
    values: ir.Value,
    bias: ir.Value,
) -> ir.Value:
    """softmax(q k^T + bias) v with grouped heads, all 4-D: q [B, S, N, D] already rotated,
    keys / values [B, kvN, T, D], bias [B, 1, S, T]. Returns [B, S, N*D]."""
    op = ctx.op
    heads, kv_heads, dim = ctx.spec.num_attention_heads, layer.num_kv_heads, layer.head_dim
    q = op.Reshape(op.Transpose(query, perm=[0, 2, 1, 3]), ctx.ints([0, kv_heads, -1, dim]))
    scores = op.MatMul(q, op.Transpose(keys, perm=[0, 1, 3, 2]))
    scores = op.Reshape(scores, ctx.ints([0, heads, -1, 0]))  # [B, N, S, T]
    if ctx.dtype != F32:
        scores = op.Cast(scores, to=F32)
    scores = scaled(ctx, scores, layer.attention_scale, F32)
    probs = op.Softmax(op.Add(scores, bias), axis=-1)
    if ctx.dtype != F32:
        probs = op.Cast(probs, to=ctx.dtype)
    out = op.MatMul(op.Reshape(probs, ctx.ints([0, kv_heads, -1, 0])), values)
    out = op.Transpose(op.Reshape(out, ctx.ints([0, heads, -1, dim])), perm=[0, 2, 1, 3])
    return op.Reshape(out, ctx.ints([0, 0, heads * dim]))


def gqa(
    ctx: BuildContext,
    layer: LayerSpec,
    inputs: AttentionInputs,
    query: ir.Value,
    key: ir.Value | None,
    value: ir.Value | None,
    past_key: ir.Value,
    past_value: ir.Value,
    *,
    packed: bool = False,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """GroupQueryAttention (rotary inside); ``key=None`` for a KV-shared layer, whose
    ``past_*`` are then the producer's present KV; ``packed``: ``query`` holds q, k and v
    ([B, S, (heads + 2 * kv_heads) * D]) and the key and value inputs are left out."""
    kv_width = layer.num_kv_heads * layer.head_dim
    window = ctx.spec.sliding_window if layer.attention == "sliding" else -1
    if packed:
        return _gqa_node(ctx, layer, inputs, query, None, None, past_key, past_value, window)
    if key is None or value is None:
        if kv_width not in inputs.empty_kv:
            inputs.empty_kv[kv_width] = (
                _empty_kv(ctx, inputs.input_ids, kv_width)
                if ctx.caps.capture_needs_static_graph
                else _no_rows(ctx, query, kv_width)
            )
        key = value = inputs.empty_kv[kv_width]
    return _gqa_node(ctx, layer, inputs, query, key, value, past_key, past_value, window)


def _gqa_node(
    ctx: BuildContext,
    layer: LayerSpec,
    inputs: AttentionInputs,
    query: ir.Value,
    key: ir.Value | None,
    value: ir.Value | None,
    past_key: ir.Value,
    past_value: ir.Value,
    window: int,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    if not layer.rope:  # no rotation: no caches, do_rotary 0
        out, present_key, present_value = ctx.ms.GroupQueryAttention(
            query, key, value, past_key, past_value, inputs.seqlens_k, inputs.total_length,
            num_heads=ctx.spec.num_attention_heads,
            kv_num_heads=layer.num_kv_heads,
            scale=layer.attention_scale,
            local_window_size=window,
            _outputs=3,
        )  # fmt: skip
        return out, present_key, present_value
    cos, sin = inputs.caches[layer.attention]
    out, present_key, present_value = ctx.ms.GroupQueryAttention(
        query, key, value, past_key, past_value, inputs.seqlens_k, inputs.total_length, cos, sin,
        num_heads=ctx.spec.num_attention_heads,
        kv_num_heads=layer.num_kv_heads,
        scale=layer.attention_scale,
        do_rotary=1,
        rotary_interleaved=0,
        local_window_size=window,
        _outputs=3,
    )  # fmt: skip
    return out, present_key, present_value


def _no_rows(ctx: BuildContext, query: ir.Value, width: int) -> ir.Value:
    """A [B, 0, width] tensor of the activation dtype: no rows of ``query``'s first
    ``width`` columns (``width`` <= its heads * D). One Slice with constant bounds, on the
    device: the Shape -> Concat -> ConstantOfShape form left its shape Concat on the host
    (the CUDA EP places shape arithmetic there; measured on the H200)."""
    return ctx.op.Slice(query, ctx.ints([0, 0]), ctx.ints([0, width]), ctx.ints([1, 2]))


def _empty_kv(ctx: BuildContext, input_ids: ir.Value, width: int) -> ir.Value:
    """A [B, 0, width] tensor of the activation dtype, built from the batch size.

    This dynamic form works for any batch; the static-empty-KV rewrite replaces it with
    a constant for EPs whose capture needs a static graph (batch 1, no Shape on the
    device: WebGPU). Other EPs take :func:`_no_rows`.
    """
    op = ctx.op
    batch = op.Shape(input_ids, start=0, end=1)
    shape = op.Concat(batch, ctx.ints([0, width]), axis=0)
    zeros = op.ConstantOfShape(shape)
    return op.Cast(zeros, to=ctx.dtype)


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
    """Standard ONNX attention with a Concat-grown cache; for a shared layer ``past_*``
    are the producer's present KV."""
    op = ctx.op
    heads, kv_heads, dim = ctx.spec.num_attention_heads, layer.num_kv_heads, layer.head_dim
    rope = inputs.rope_rows[layer.attention] if layer.rope else None

    def rotated(x: ir.Value) -> ir.Value:
        return x if rope is None else _rotate(ctx, x, rope)

    q = rotated(op.Reshape(query, ctx.ints([0, 0, heads, dim])))
    if key is not None and value is not None:
        k = rotated(op.Reshape(key, ctx.ints([0, 0, kv_heads, dim])))
        v = op.Reshape(value, ctx.ints([0, 0, kv_heads, dim]))
        present_key = op.Concat(past_key, op.Transpose(k, perm=[0, 2, 1, 3]), axis=2)
        present_value = op.Concat(past_value, op.Transpose(v, perm=[0, 2, 1, 3]), axis=2)
    else:
        present_key, present_value = past_key, past_value
    out = _explicit(ctx, layer, q, present_key, present_value, inputs.bias[layer.attention])
    return out, present_key, present_value
