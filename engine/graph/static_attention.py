"""The capture-safe attention lowering over static KV buffers, for EPs with
``explicit_attention_over_cache`` (WebGPU), and for the layers wider than
``gqa_max_head_dim`` on EPs whose GroupQueryAttention serves narrower heads only (CUDA:
Gemma 4's 512-wide full layers; there the buffers keep the package's dtype, shared with
the GQA layers, and batches may be larger than 1).

What onnxruntime-webgpu 1.27 allows, measured on lavapipe with one-op models
(tests/webgpu/gqa_cases.py, tests/webgpu/README.md): under graph capture
GroupQueryAttention is right only as a KV owner with neither window nor bias
(``local_window_size`` gives wrong outputs, a static ``attention_bias`` is refused, a
KV-shared node fails to dispatch); its fp16 attention keeps scores in fp16, which Gemma
4's scale 1.0 over RMS-normed q/k makes large (0.02-0.04 output error where fp32 is at
1e-6); its fp32 prefill cannot build a pipeline at head size 512 (64 KiB of workgroup
storage) and its non-flash path refuses capture. fp16 MatMul accumulates in fp16. So this
lowering uses no GroupQueryAttention and keeps attention in fp32:

* the new tokens' positions come from the mask's values (no Shape); RotaryEmbedding gets
  their rows of fp32 cos / sin caches and int64 ids 0..S-1 into them from an ArgMax
  (the device has no other int64 producer);
* a KV-owning layer projects Q/K/V as one MatMul and norms every head at once (the
  caller does both), rotates q and k together, and writes k and v into the shared
  ``[B, kv, L, D]`` buffers with ScatterElements, in place (present is bound to past's
  buffer, as onnxruntime-genai does with ``past_present_share_buffer``). The buffers hold
  fp32 whatever the package's dtype: no casts in or out, K and V never rounded to half
  (onnxruntime-genai allocates every cache in the type of the first past input);
* attention is explicit in fp32 (but for half CUDA packages' ``P @ V``: see
  :func:`_weighted`): ``softmax(q K^T + bias) V`` (batch 1 under capture: with
  one KV head the scores are a Gemm with K transposed in the kernel and the mask as its C,
  with several an Einsum over the head dimension, K never transposed in memory; batched
  (CUDA): q grouped per KV head, ``[B, kv, S * G, D]``, a FusedMatMul over K as stored
  (transposed in the GEMM) and a batched MatMul) over a gathered window of ``W + S - 1``
  slots for sliding layers (their cost never depends on the buffer) and over the whole
  buffer for full layers;
* the K / V a KV owner prepares (a window gathered, read back as fp32, shaped for the
  GEMMs) are reused by every KV-shared layer reading its cache.

Shapes are static under capture (batch 1), every op stays on the device (on CUDA the full
layers' key positions are a Range over the buffer's length, read on the host). The
buffers' unwritten slots must be finite (WebGPU zero-initializes buffers): probabilities
of 0 multiply them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from engine.graph import attention as attn
from engine.graph.components import scaled
from engine.graph.context import BuildContext
from engine.spec import AttentionKind, LayerSpec

F32 = ir.DataType.FLOAT
I32 = ir.DataType.INT32
HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
CORE_DTYPE = "fp32"
"""Dtype of the attention core (q/k norms, rotation, scores, softmax, P @ V; fp16 and bf16
CUDA packages run their P @ V in the half type: :func:`_weighted`)."""
KV_DTYPE = F32
"""Dtype of the KV buffers (the core's)."""


@dataclass
class StaticInputs:
    """Values every layer reads, computed once per graph."""

    positions: ir.Value
    """float32 [B, S]: positions of the new tokens (batch 1 under capture)."""
    slots: ir.Value
    """int32 [B, S]: the same, as KV buffer slots."""
    position_ids: ir.Value
    """int64 [B, S]: 0..S-1, the new tokens' rows in ``rope``, for RotaryEmbedding."""
    rope: dict[AttentionKind, tuple[ir.Value, ir.Value]] = field(default_factory=dict)
    """fp32 cos / sin rows [S, D / 2] of the new tokens, per attention kind."""
    scatter_index: dict[tuple[int, int], ir.Value] = field(default_factory=dict)
    window: tuple[ir.Value, ir.Value] | None = None
    """Sliding layers: the window's buffer slots (int32 [n]) and key positions ([B, n])."""
    buffer_positions: ir.Value | None = None
    """Full layers: key positions 0..L-1 of the KV buffer, [B, L] or [1, L]."""
    bias: dict[tuple[AttentionKind, int, int], ir.Value] = field(default_factory=dict)
    prepared: dict[int, tuple[ir.Value, ir.Value]] = field(default_factory=dict)
    """KV owner's layer index -> (K, V), ready for the scores and the value MatMul."""
    kv_dtype: ir.DataType = KV_DTYPE
    """Dtype of the KV buffers: the core's fp32, or the package's where these layers share
    the one cache dtype genai allocates with GroupQueryAttention layers (K / V are rounded
    to it as written and read back as fp32, V of half CUDA packages excepted)."""
    kind_ids: dict[AttentionKind, ir.Value] = field(default_factory=dict)
    """Per kind, position ids that differ from ``position_ids`` (longrope's long set)."""
    batch_one: bool = True
    """Batch 1 (static shapes under capture): one KV head's scores are a 2-D Gemm over
    ``[S * N, D]`` rows. Else a batched MatMul per batch row."""


def _const(ctx: BuildContext, value: float | int, dtype: type, name: str) -> ir.Value:
    return ctx.const(np.array(value, dtype=dtype), name=name)


def to_core(ctx: BuildContext, x: ir.Value) -> ir.Value:
    """``x`` in the core's fp32 (no node in an fp32 package)."""
    return x if ctx.dtype == F32 else ctx.op.Cast(x, to=F32)


def static_inputs(
    ctx: BuildContext,
    positions: ir.Value,
    caches: dict[AttentionKind, tuple[ir.Value, ir.Value]],
    kv_dtype: ir.DataType = KV_DTYPE,
) -> StaticInputs:
    """Position ids and RoPE rows; ``positions`` are float32 [B, S] from the mask.

    The caches are fp32 and hold only the frequency pairs that rotate (fp16 caches cost
    the fp16 graph 0.0988 -> 0.104 mean max |logit diff| and 94 -> 89 of 100 top-1 at
    E2B's head sizes; trimmed fp32 ones take fp16's full-width bytes). RotaryEmbedding gets
    the new tokens' rows, padded with cos 1 / sin 0 to the full width, and ids 0..S-1 into
    them (batch 1). The ids are int64, which only ArgMax makes on the device:
    ``ArgMax(Equal(p_i, p_j))`` over the S new positions, so a decode step costs one
    element, not one per position of the context.
    """
    op = ctx.op
    slots = op.Cast(positions, to=ir.DataType.INT32)  # [B, S]
    if not ctx.caps.capture_needs_static_graph:
        return _batched_inputs(ctx, positions, slots, caches, kv_dtype)
    hits = op.Equal(op.Unsqueeze(positions, ctx.ints([2])), op.Unsqueeze(positions, ctx.ints([1])))
    ids = op.ArgMax(op.Cast(hits, to=F32), axis=-1, keepdims=0)  # [B, S]: 0..S-1
    rows = op.Gather(slots, _const(ctx, 0, np.int64, "index_0"))  # [S], batch 1
    rope = {}
    for kind, (cos, sin) in caches.items():
        layer = next(layer for layer in ctx.spec.layers if layer.attention == kind)
        missing = layer.head_dim // 2 - ctx.spec.rope[kind].rotated_pairs(layer.head_dim)
        switch = attn.long_rope(ctx, kind)
        kind_rows = rows
        if switch is not None:  # longrope: the long set once the last position is past it
            last = op.ReduceMax(positions, ctx.ints([1]), keepdims=0)  # [B]: batch 1
            last = op.Gather(last, _const(ctx, 0, np.int64, "index_0"))
            offset = op.Cast(attn.long_offset(ctx, last, switch, np.float32, 1), to=I32)
            kind_rows = op.Add(rows, offset)
        pair = []
        for cache, fill, label in ((cos, 1.0, "one_f32"), (sin, 0.0, "zero_f32")):
            picked = op.Gather(cache, kind_rows, axis=0)  # [S, rotated]
            if missing:
                pads = ctx.const(np.array([0, 0, 0, missing], np.int64), name=f"pad_{missing}")
                picked = op.Pad(picked, pads, _const(ctx, fill, np.float32, label))
            pair.append(picked)
        rope[kind] = (pair[0], pair[1])
    return StaticInputs(
        positions=positions, slots=slots, position_ids=ids, rope=rope, kv_dtype=kv_dtype
    )


def _batched_inputs(
    ctx: BuildContext,
    positions: ir.Value,
    slots: ir.Value,
    caches: dict[AttentionKind, tuple[ir.Value, ir.Value]],
    kv_dtype: ir.DataType,
) -> StaticInputs:
    """EPs with int64 on the device and no static-shape need (CUDA): RotaryEmbedding reads
    each row's own positions (int64 [B, S]) from whole full-width fp32 caches, so batches
    may hold rows at different positions."""
    op = ctx.op
    ids = op.Cast(positions, to=ir.DataType.INT64)
    inputs = StaticInputs(
        positions=positions, slots=slots, position_ids=ids, kv_dtype=kv_dtype, batch_one=False
    )
    for kind, (cos, sin) in caches.items():
        inputs.rope[kind] = (cos, sin)
        switch = attn.long_rope(ctx, kind)
        if switch is not None:  # longrope: the long set once the batch's last position is past
            last = op.ReduceMax(positions, ctx.ints([0, 1]), keepdims=1)  # [1, 1], as GQA's
            offset = attn.long_offset(ctx, last, switch, np.float32, 1)
            inputs.kind_ids[kind] = op.Cast(op.Add(positions, offset), to=ir.DataType.INT64)
    return inputs


def _scatter_index(ctx: BuildContext, inputs: StaticInputs, kv: int, dim: int) -> ir.Value:
    """int32 [B, kv, S, D]: every element of a new token's K/V goes to its position's slot."""
    key = (kv, dim)
    if key not in inputs.scatter_index:
        op = ctx.op
        slots = op.Reshape(inputs.slots, ctx.ints([0, 1, -1, 1]))
        zeros = ctx.const(np.zeros((1, kv, 1, dim), np.int32), name=f"zeros_i32_{kv}x{dim}")
        inputs.scatter_index[key] = op.Add(slots, zeros)
    return inputs.scatter_index[key]


def _window(ctx: BuildContext, inputs: StaticInputs) -> tuple[ir.Value, ir.Value]:
    """The slots a sliding layer reads: positions p0 - (W - 1) .. p0 + S - 1, where p0 is the
    first new token's position (W - 1 + S slots; those before 0 are clamped and masked):
    flat under batch 1, else [B, W - 1 + S]."""
    if inputs.window is None:
        op = ctx.op
        width = min(ctx.spec.sliding_window, ctx.plan.context_length) - 1
        first = op.Gather(inputs.positions, ctx.ints([0]), axis=1)  # [B, 1]
        start = op.Sub(first, _const(ctx, float(width), np.float32, f"window_{width}_f32"))
        behind = op.Add(
            ctx.const(np.arange(width, dtype=np.float32)[None], name="window_steps"), start
        )
        key_positions = op.Concat(behind, inputs.positions, axis=1)  # [B, W - 1 + S]
        clamped = op.Clip(key_positions, _const(ctx, 0.0, np.float32, "zero_f32"))
        slots = op.Cast(clamped, to=ir.DataType.INT32)  # [B, W - 1 + S]
        if inputs.batch_one:
            slots = op.Reshape(slots, ctx.ints([-1]))
        inputs.window = (slots, key_positions)
    return inputs.window


def _bias(
    ctx: BuildContext,
    inputs: StaticInputs,
    kind: AttentionKind,
    key_positions: ir.Value,
    rank: int,
    repeats: int = 1,
) -> ir.Value:
    """Additive fp32 mask for the scores, each new token's row ``repeats`` times (once per
    query head that reads it): [S * N, T] for the scores Gemm (rank 2, batch 1), [B, S * N,
    T] for the batched scores MatMul (rank 3), [B, 1, S * G, T] for the grouped batched one
    (rank 4: several KV heads), or [B, S, 1, 1, T] for the Einsum's scores (rank 5)."""
    if (kind, rank, repeats) not in inputs.bias:
        op = ctx.op
        if rank < 5:  # [(B,) S * repeats, 1] query positions against [(B,) 1, T] keys
            ones = ctx.const(np.ones((1, repeats), np.float32), name=f"ones_1x{repeats}_f32")
            if rank == 2:  # batch 1
                column = op.Mul(op.Reshape(inputs.positions, ctx.ints([-1, 1])), ones)
                queries, keys = op.Reshape(column, ctx.ints([-1, 1])), key_positions
            else:
                column = op.Mul(op.Unsqueeze(inputs.positions, ctx.ints([2])), ones)
                queries = op.Reshape(column, ctx.ints([0, -1, 1]))  # [B, S * repeats, 1]
                keys = op.Unsqueeze(key_positions, ctx.ints([1]))
        else:  # [B, S, 1] against [B, 1, T]
            queries = op.Unsqueeze(inputs.positions, ctx.ints([2]))
            keys = op.Unsqueeze(key_positions, ctx.ints([1]))
        bias = _mask(ctx, kind, op.Sub(queries, keys), keys)
        if rank == 4:  # one row set for every KV head
            bias = op.Unsqueeze(bias, ctx.ints([1]))
        elif rank == 5:
            bias = op.Unsqueeze(bias, ctx.ints([2, 3]))
        inputs.bias[(kind, rank, repeats)] = bias
    return inputs.bias[(kind, rank, repeats)]


def _mask(ctx: BuildContext, kind: AttentionKind, distance: ir.Value, keys: ir.Value) -> ir.Value:
    """0 where a query may see a key ``distance`` positions back, else fp32's lowest:
    causal, within the window for sliding layers, never a slot before position 0."""
    op = ctx.op
    zero = _const(ctx, 0.0, np.float32, "zero_f32")
    allowed = op.GreaterOrEqual(distance, zero)
    if kind == "sliding":
        window = _const(ctx, float(ctx.spec.sliding_window), np.float32, "window_f32")
        allowed = op.And(allowed, op.Less(distance, window))
        allowed = op.And(allowed, op.GreaterOrEqual(keys, zero))
    lowest = _const(ctx, float(np.finfo(np.float32).min), np.float32, "min_f32")
    return op.Where(allowed, zero, lowest)


def _buffer_positions(ctx: BuildContext, keys: ir.Value) -> ir.Value:
    """Key positions 0..L-1 of a KV buffer ``keys`` [B, kv, L, D], as float32.

    EPs that may read shapes (CUDA): a Range over the buffer's length, [1, L]; the length
    stays on the host, so the device runs two small kernels (Range, Cast). Under a static
    graph (WebGPU: no Shape) the positions are read from the buffer's values (NaN-safe),
    [B, L]: a CumSum over L ones, which onnxruntime's CUDA kernel computes per element over
    its whole prefix (66 us of an H100 decode step at L = 4096, plus 8 us to gather the row).
    WebGPU's takes 127 us at 4096 and 18 us at 192 on an H100; a tower of dilated 1-D Convs
    takes 57 us at any length (``benchmarks/device/webgpu_ops.py --only positions``), too
    little gain to trade for the loss at short lengths.
    """
    op = ctx.op
    if not ctx.caps.capture_needs_static_graph:
        length = op.Squeeze(op.Shape(keys, start=2, end=3), ctx.ints([0]))
        zero = _const(ctx, 0, np.int64, "zero_i64")
        one = _const(ctx, 1, np.int64, "one_i64")
        row = op.Cast(op.Range(zero, length, one), to=F32)  # [L]
        return op.Unsqueeze(row, ctx.ints([0]))
    index_0 = _const(ctx, 0, np.int64, "index_0")
    row = op.Gather(op.Gather(keys, index_0, axis=1), index_0, axis=2)  # [B, L]
    axis = _const(ctx, 1, np.int32, "axis_1_i32")
    return op.Sub(op.CumSum(attn.ones_of(ctx, row), axis), _const(ctx, 1.0, np.float32, "one_f32"))


# ------------------------------------------------------------------------------ layers


def owner(
    ctx: BuildContext,
    layer: LayerSpec,
    inputs: StaticInputs,
    heads: ir.Value,
    past_key: ir.Value,
    past_value: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """A KV-owning layer. ``heads``: the normed q, k and v heads [B, S, N + 2 kv, D] in fp32.

    Returns the attention output [B, S, N * D] (activation dtype) and the present K / V.
    """
    op = ctx.op
    n, kv, dim = ctx.spec.num_attention_heads, layer.num_kv_heads, layer.head_dim
    qk, value = op.Split(heads, ctx.ints([n + kv, kv]), axis=2, _outputs=2)
    rotated = op.Reshape(qk, ctx.ints([0, 0, (n + kv) * dim]))
    if layer.rope:
        cos, sin = inputs.rope[layer.attention]
        ids = inputs.kind_ids.get(layer.attention, inputs.position_ids)
        rotated = ctx.ms.RotaryEmbedding(rotated, ids, cos, sin, num_heads=n + kv, interleaved=0)
    query, key = op.Split(rotated, ctx.ints([n * dim, kv * dim]), axis=-1, _outputs=2)
    index = _scatter_index(ctx, inputs, kv, dim)
    if inputs.kv_dtype != F32:  # rounded as GroupQueryAttention layers' K / V are
        key, value = op.Cast(key, to=inputs.kv_dtype), op.Cast(value, to=inputs.kv_dtype)
    present_key = op.ScatterElements(past_key, index, _cache_layout(ctx, key, kv, dim), axis=2)
    present_value = op.ScatterElements(
        past_value, index, _cache_layout(ctx, value, kv, dim), axis=2
    )
    _prepare(ctx, layer, inputs, present_key, present_value)
    return attend(ctx, layer, inputs, query, layer.index), present_key, present_value


def shared_query(
    ctx: BuildContext, layer: LayerSpec, inputs: StaticInputs, query: ir.Value
) -> ir.Value:
    """A KV-shared layer's normed q heads [B, S, N, D] (fp32), rotated: [B, S, N * D]."""
    n, dim = ctx.spec.num_attention_heads, layer.head_dim
    flat = ctx.op.Reshape(query, ctx.ints([0, 0, n * dim]))
    if not layer.rope:
        return flat
    cos, sin = inputs.rope[layer.attention]
    ids = inputs.kind_ids.get(layer.attention, inputs.position_ids)
    return ctx.ms.RotaryEmbedding(flat, ids, cos, sin, num_heads=n, interleaved=0)


def _cache_layout(ctx: BuildContext, x: ir.Value, kv: int, dim: int) -> ir.Value:
    """New K or V ([B, S, kv * D] or [B, S, kv, D]) as the cache stores it: [B, kv, S, D]."""
    op = ctx.op
    if kv == 1:  # [B, S, 1, D] and [B, 1, S, D] have one memory layout
        return op.Reshape(x, ctx.ints([0, 1, -1, dim]))
    return op.Transpose(op.Reshape(x, ctx.ints([0, 0, kv, dim])), perm=[0, 2, 1, 3])


def _prepare(
    ctx: BuildContext,
    layer: LayerSpec,
    inputs: StaticInputs,
    keys: ir.Value,
    values: ir.Value,
) -> None:
    """Sets ``inputs.prepared[layer.index]`` for KV owner ``layer``: the K and V a layer
    attends over, the sliding window's slots (not batch 1: each row's own) or the
    whole buffer, shaped once for every layer that reads them. One KV head: K and V
    [T, D] (batch 1) for the scores Gemm and P @ V; not batch 1, K and V [B, T, D] for
    batched GEMMs. Several, batch 1: K [B, kv, T, D] as stored for the scores Einsum, V
    [B, 1, kv, T, D] against probabilities [B, S, kv, G, T]; not batch 1: K and V as stored
    [B, kv, T, D] for batched GEMMs over [B, kv, S * G, ...]. K is never transposed in
    memory. Buffers of another dtype are read back as fp32 here, once for every layer that
    reads them (V of half CUDA packages excepted: :func:`_weighted`)."""
    op = ctx.op
    kv, dim = layer.num_kv_heads, layer.head_dim
    if layer.attention == "sliding" and inputs.batch_one:
        slots, _ = _window(ctx, inputs)
        keys = op.Gather(keys, slots, axis=2)
        values = op.Gather(values, slots, axis=2)
    elif layer.attention == "sliding":  # [B, T] slots, as [B, kv, T, D] element indices
        slots, _ = _window(ctx, inputs)
        zeros = ctx.const(np.zeros((1, kv, 1, dim), np.int32), name=f"zeros_i32_{kv}x{dim}")
        index = op.Add(op.Reshape(slots, ctx.ints([0, 1, -1, 1])), zeros)
        keys = op.GatherElements(keys, index, axis=2)
        values = op.GatherElements(values, index, axis=2)
    if inputs.kv_dtype != F32:
        keys = op.Cast(keys, to=F32)
        if not _half_weights(inputs):  # else V stays as the buffers hold it (_weighted)
            values = op.Cast(values, to=F32)
    if layer.attention == "full" and inputs.buffer_positions is None:
        inputs.buffer_positions = _buffer_positions(ctx, keys)
    if kv == 1 and inputs.batch_one:
        keys = op.Reshape(keys, ctx.ints([-1, dim]))
        values = op.Reshape(values, ctx.ints([-1, dim]))
    elif kv == 1:
        keys = op.Reshape(keys, ctx.ints([0, -1, dim]))
        values = op.Reshape(values, ctx.ints([0, -1, dim]))
    elif inputs.batch_one:
        values = op.Reshape(values, ctx.ints([0, 1, kv, -1, dim]))
    inputs.prepared[layer.index] = (keys, values)


def attend(
    ctx: BuildContext, layer: LayerSpec, inputs: StaticInputs, query: ir.Value, source: int
) -> ir.Value:
    """``softmax(q K^T + bias) V`` in fp32 (:func:`_weighted` excepted) for rotated q
    [B, S, N * D] over the K / V that layer ``source`` prepared. Returns [B, S, N * D] in
    the activation dtype.

    One KV head (batch 1): the scores are ``Gemm(q [S * N, D], K [T, D], transB, C=bias)``,
    the mask added in the same kernel, and ``P @ V`` a 2-D MatMul. On the H200 under
    capture one decode step of that block costs 40 / 144 / 161 us at (T, D) = (512, 256),
    (4096, 256), (4096, 512) against 71 / 182 / 229 us as Einsum + Add
    (benchmarks/device/webgpu_ops.py). Several KV heads, batch 1: q grouped per KV head,
    [B, S, kv, G, D], against K as stored in an Einsum over D (K is never transposed).
    Several, batched (CUDA): q as [B, kv, S * G, D] rows against K [B, kv, T, D], each a
    strided batched GEMM over B * kv. The Einsum form there ran ``P @ V`` as S * kv GEMMs of
    G rows (batch dims [B, S, kv] against [B, 1, kv]): on an H100 E4B's 1,024-token fp16
    prefill went 11,854 -> 28,628 tok/s and its decode 140.4 -> 144.4 tok/s at 4,096
    (benchmarks/results/cuda_profile-2026-12-07-h100-e4b-grouped-attention-before-after.json)."""
    op = ctx.op
    n, kv, dim = ctx.spec.num_attention_heads, layer.num_kv_heads, layer.head_dim
    keys, values = inputs.prepared[source]
    if layer.attention == "sliding":
        _, key_positions = _window(ctx, inputs)
    else:
        assert inputs.buffer_positions is not None
        key_positions = inputs.buffer_positions
    if kv == 1 and not inputs.batch_one:  # [B, S * N, D] @ [B, T, D]^T, batched
        bias = _bias(ctx, inputs, layer.attention, key_positions, 3, n)
        rows = op.Reshape(query, ctx.ints([0, -1, dim]))
        scores = _scores(ctx, rows, keys, layer.attention_scale)
        probs = op.Softmax(op.Add(scores, bias), axis=-1)
        out = op.Reshape(_weighted(ctx, inputs, probs, values), ctx.ints([0, -1, n * dim]))
    elif kv == 1:
        bias = _bias(ctx, inputs, layer.attention, key_positions, 2, n)
        rows = op.Reshape(query, ctx.ints([-1, dim]))  # [S * N, D], batch 1
        scale = layer.attention_scale
        # alpha is Gemm's own factor on A @ B^T (before the bias): the scale costs no node.
        scores = (
            op.Gemm(rows, keys, bias, transB=1)
            if scale == 1.0
            else op.Gemm(rows, keys, bias, transB=1, alpha=scale)
        )
        probs = op.Softmax(scores, axis=-1)
        out = op.MatMul(probs, values)
        out = op.Reshape(out, ctx.ints([1, -1, n * dim]))
    elif not inputs.batch_one:  # q per KV head [B, kv, S * G, D] @ [B, kv, T, D]^T
        group = n // kv
        bias = _bias(ctx, inputs, layer.attention, key_positions, 4, group)
        grouped = op.Transpose(
            op.Reshape(query, ctx.ints([0, 0, kv, group * dim])), perm=[0, 2, 1, 3]
        )
        rows = op.Reshape(grouped, ctx.ints([0, kv, -1, dim]))
        scores = _scores(ctx, rows, keys, layer.attention_scale)
        probs = op.Softmax(op.Add(scores, bias), axis=-1)
        out = _weighted(ctx, inputs, probs, values)
        out = op.Reshape(out, ctx.ints([0, kv, -1, group * dim]))
        out = op.Reshape(op.Transpose(out, perm=[0, 2, 1, 3]), ctx.ints([0, 0, n * dim]))
    else:
        shape = [0, 0, kv, n // kv, dim]
        bias = _bias(ctx, inputs, layer.attention, key_positions, len(shape))
        grouped = op.Reshape(query, ctx.ints(shape))
        scores = op.Einsum(grouped, keys, equation="bskgd,bkld->bskgl")
        scores = scaled(ctx, scores, layer.attention_scale, F32)
        probs = op.Softmax(op.Add(scores, bias), axis=-1)
        out = op.Reshape(op.MatMul(probs, values), ctx.ints([0, 0, n * dim]))
    made = inputs.kv_dtype if _half_weights(inputs) else F32  # as _weighted leaves it
    return out if made == ctx.dtype else op.Cast(out, to=ctx.dtype)


def _half_weights(inputs: StaticInputs) -> bool:
    """Whether :func:`_weighted` runs in the buffers' half type: batched (CUDA) over fp16
    or bf16 buffers."""
    return not inputs.batch_one and inputs.kv_dtype in HALF


def _weighted(
    ctx: BuildContext, inputs: StaticInputs, probs: ir.Value, values: ir.Value
) -> ir.Value:
    """Batched ``P @ V``. Over half buffers (fp16 and bf16 CUDA packages) the normalized
    probabilities are rounded to the buffers' type and V is read as stored, no fp32 copy
    of it. onnxruntime's half GEMM computes in fp32 (cuBLAS' default math may still reduce
    split-K partial sums in half); rounding P costs up to 2^-11 of each probability in
    fp16 (~4.9e-4 max |V| in the sum) and 2^-8 in bf16 (~3.9e-3 max |V|), as the package's
    activations cost elsewhere. In fp32 with TF32 off, this
    GEMM read E4B's 4,096-slot V (two KV heads, M = 4 rows each) on 16 blocks: 104 us a
    full layer on an H100, 11% of a decode step. Elsewhere: fp32."""
    if not _half_weights(inputs):
        return ctx.op.MatMul(probs, values)
    return ctx.op.MatMul(ctx.op.Cast(probs, to=inputs.kv_dtype), values)


def _scores(ctx: BuildContext, rows: ir.Value, keys: ir.Value, scale: float) -> ir.Value:
    """Batched fp32 scores ``scale * rows @ keys^T`` over K as stored ([..., T, D]): one
    FusedMatMul with K transposed in the GEMM and the scale its alpha. What onnxruntime's
    optimizer made of the K owner's Transpose + MatMul anyway: the same kernels and decode
    rate on an H100 (E2B fp16 243.7 / 248.7 tok/s, E4B 145.4 / 145.7, benchmarks/results/
    cuda_profile-2026-12-07b-*-scores-transb-before-after.json), one node less to read."""
    if scale == 1.0:
        return ctx.ms.FusedMatMul(rows, keys, transB=1)
    return ctx.ms.FusedMatMul(rows, keys, transB=1, alpha=scale)
