"""The decoder pieces every family shares: self-attention over the KV cache (every
lowering), the RoPE caches, the state the layers share while a graph is built, the KV and
logits outputs, and the pre-norm decoder of Llama and the models shaped like it.

A family's decoder is a tree of :class:`~engine.graph.modules.Module` objects laid out as
its checkpoint stores the tensors. What differs between families is data in the spec
(:class:`~engine.spec.ModelSpec`: q/k/v norms, biases, the attention scale, the activation,
RoPE per attention kind); what differs in the layer's shape (Gemma 4's four norms, its
per-layer inputs) is the family's own module, built from these.

Session I/O follows onnxruntime-genai's names: ``input_ids`` (or ``inputs_embeds``),
``attention_mask``, ``past_key_values.N.key/value`` -> ``logits``, ``present.N.key/value``,
with one KV pair per layer that owns a cache (KV-shared layers read their producer's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx_ir as ir

from engine.graph import attention as attn
from engine.graph import static_attention as sattn
from engine.graph.components import (
    embedding,
    lm_head,
    skip_norms,
    skip_rms_norm,
    softcap,
    zero_rows,
)
from engine.graph.context import BuildContext
from engine.graph.modules import (
    Embedding,
    FusedLinear,
    GatedMLP,
    HeadNorm,
    Linear,
    Module,
    Param,
    RMSNorm,
)
from engine.logical import RopeTable, RowOrder
from engine.options import ExportOptions
from engine.spec import AttentionKind, LayerSpec, ModelSpec, RopeSpec


class Attention(Module):
    """Self-attention of one layer: q/k/v projections (with their biases and norms where
    the spec has them), attention over the cache, o_proj.

    ``static``: the static-buffer lowering (:mod:`engine.graph.static_attention`); a
    KV-owning layer then projects q, k and v as one MatMul (``qkv_proj``) and norms their
    heads at once (``qkv_norm``), in the fp32 of the attention core. ``packed``: the same
    one projection (and one norm where q, k and v are all normed) handed to
    GroupQueryAttention packed (:attr:`EpCapabilities.packed_qkv`); where q and k only are
    normed, split into q, k and v for their norms; layers whose values are their keys keep
    their own projections.
    """

    def __init__(
        self, spec: ModelSpec, layer: LayerSpec, *, static: bool = False, packed: bool = False
    ) -> None:
        h, heads, dim = spec.hidden_size, spec.num_attention_heads, layer.head_dim
        kv, kv_width = layer.num_kv_heads, layer.num_kv_heads * dim
        bias = spec.qkv_bias
        self._layer = layer
        self._static = static
        self._qk_norm = spec.qk_norm
        self._value_norm = spec.value_norm
        self._stored_fused = spec.stored_fused
        self._packed = (
            packed
            and not static
            and layer.owns_kv
            and not layer.k_eq_v  # packed, its k rows would be stored twice
            and not (spec.value_norm and not spec.qk_norm)  # not lowered packed
        )
        # q and k normed, v not (Qwen3, Gemma 3): the one projection split, the q and k
        # norms apart, GroupQueryAttention unpacked (its own q/k-norm inputs: CUDA only)
        self._split_qkv = self._packed and spec.qk_norm and not spec.value_norm
        self.qkv_proj: Linear | FusedLinear
        if spec.stored_fused:  # the checkpoint's own qkv_proj: one MatMul on every lowering
            if not layer.owns_kv or layer.k_eq_v or spec.qk_norm or spec.value_norm:
                raise ValueError("a stored qkv_proj is lowered for plain KV-owning layers only")
            self.qkv_proj = Linear(h, heads * dim + 2 * kv_width, bias=bias)
        elif (static or self._packed) and layer.owns_kv:
            value = "k_proj" if layer.k_eq_v else "v_proj"
            self.qkv_proj = FusedLinear(
                h, [("q_proj", heads * dim), ("k_proj", kv_width), (value, kv_width)], bias=bias
            )
            if self._split_qkv:
                self.q_norm = RMSNorm(dim)
                self.k_norm = RMSNorm(dim)
            elif spec.qk_norm:
                groups: list[tuple[str | None, int]] = [("q_norm", heads), ("k_norm", kv)]
                if spec.value_norm:
                    groups.append((None, kv))
                dtype = sattn.CORE_DTYPE if static else None
                self.qkv_norm = HeadNorm(dim, groups, dtype=dtype)
            elif spec.value_norm:
                raise ValueError("a value norm without q/k norms is not lowered")
        elif static:
            self.q_proj = Linear(h, heads * dim, bias=bias)
            if spec.qk_norm:
                self.q_norm = RMSNorm(dim, dtype=sattn.CORE_DTYPE)
        else:
            self.q_proj = Linear(h, heads * dim, bias=bias)
            if spec.qk_norm:
                self.q_norm = RMSNorm(dim)
            if layer.owns_kv:
                self.k_proj = Linear(h, kv_width, bias=bias)
                self.v_proj = None if layer.k_eq_v else Linear(h, kv_width, bias=bias)
                if spec.qk_norm:
                    self.k_norm = RMSNorm(dim)
            if spec.value_norm:
                self.v_norm = RMSNorm(dim, scale=False)
        self.o_proj = Linear(heads * dim, h, bias=spec.o_bias)
        order = spec.rope[layer.attention].channel_order(dim) if layer.rope else None
        if order is not None:
            self._reorder_heads(RowOrder(dim, (heads + kv) * dim, order))

    def _reorder_heads(self, order: RowOrder) -> None:
        """Read the q and k projections' rows (and biases) in the graphs' RoPE layout
        (:meth:`RopeSpec.channel_order`); values keep theirs."""
        if self._qk_norm or self._value_norm or self._layer.k_eq_v:
            raise ValueError("partial RoPE is lowered without q/k/v norms and shared k/v")
        for linear in (getattr(self, name, None) for name in ("qkv_proj", "q_proj", "k_proj")):
            if linear is None:
                continue
            for attr in ("weight", "bias"):
                param = getattr(linear, attr)
                if param is None:
                    continue
                if param.parts:  # q, k (and v) apart: the first two parts, each whole
                    parts = tuple(
                        replace(part, row_order=replace(order, limit=part.shape[0]))
                        if i < 2
                        else part
                        for i, part in enumerate(param.parts)
                    )
                    setattr(linear, attr, replace(param, parts=parts))
                else:  # the stored qkv_proj's q and k rows, or one of q_proj, k_proj whole
                    limit = min(order.limit, param.shape[0])
                    setattr(linear, attr, replace(param, row_order=replace(order, limit=limit)))

    def __call__(self, ctx: BuildContext, x: ir.Value, state: DecoderState) -> ir.Value:
        if self._static:
            return self.o_proj(ctx, self._static_attention(ctx, x, state))
        op, spec, layer = ctx.op, ctx.spec, self._layer
        heads, kv_heads, dim = spec.num_attention_heads, layer.num_kv_heads, layer.head_dim

        def project(linear: Linear, count: int, norm: RMSNorm | None) -> tuple[ir.Value, bool]:
            """The projection, as heads [B, S, count, D] when a norm will take it."""
            out = linear(ctx, x)
            if norm is None:
                return out, False
            return op.Reshape(out, ctx.ints([0, 0, count, dim])), True

        def finish(value: ir.Value, heads: bool, count: int, norm: RMSNorm | None) -> ir.Value:
            """Through the per-head norm (if any), flat again: [B, S, count * D]."""
            if norm is None:
                return op.Reshape(value, ctx.ints([0, 0, count * dim])) if heads else value
            rows, zeros = state.head_rows(ctx, value, heads, count, dim)
            flat = [0, -1 if zeros is not None else 0, count * dim]
            return op.Reshape(norm(ctx, rows, zeros), ctx.ints(flat))

        if self._packed and not self._split_qkv:
            qkv = self.qkv_proj(ctx, x)
            if self._qk_norm:  # q, k and v normed: one norm over all their heads
                count = heads + 2 * kv_heads
                rows, zeros = state.head_rows(ctx, qkv, False, count, dim)
                qkv = op.Reshape(self.qkv_norm(ctx, rows, zeros), ctx.ints([0, 0, count * dim]))
            past_key, past_value = state.past[spec.kv_cache_index(layer.index)]
            out, present_key, present_value = attn.gqa(
                ctx, layer, state.inputs, qkv, None, None, past_key, past_value, packed=True
            )
            state.presents[layer.index] = (present_key, present_value)
            return self.o_proj(ctx, out)
        q_norm = self._norm("q_norm")
        key = value = None
        if self._stored_fused or self._split_qkv:  # one projection, split (and q, k normed)
            widths = ctx.ints([heads * dim, kv_heads * dim, kv_heads * dim])
            query, key, value = op.Split(self.qkv_proj(ctx, x), widths, axis=-1, _outputs=3)
            query = finish(query, False, heads, q_norm)
            key = finish(key, False, kv_heads, self._norm("k_norm"))
            past_key, past_value = state.past[spec.kv_cache_index(layer.index)]
        elif layer.owns_kv:
            query = finish(*project(self.q_proj, heads, q_norm), heads, q_norm)
            k_norm, v_norm = self._norm("k_norm"), self._norm("v_norm")
            key_raw = project(self.k_proj, kv_heads, k_norm)
            value_raw = key_raw if self.v_proj is None else project(self.v_proj, kv_heads, v_norm)
            key = finish(*key_raw, kv_heads, k_norm)
            value = finish(*value_raw, kv_heads, v_norm)
            past_key, past_value = state.past[spec.kv_cache_index(layer.index)]
        else:
            query = finish(*project(self.q_proj, heads, q_norm), heads, q_norm)
            # Attend to the producer's full present KV; this layer adds nothing to it.
            past_key, past_value = state.shared_kv(layer.kv_source)
        lower = attn.gqa if state.use_gqa else attn.standard
        out, present_key, present_value = lower(
            ctx, layer, state.inputs, query, key, value, past_key, past_value
        )
        if layer.owns_kv:
            state.presents[layer.index] = (present_key, present_value)
        elif state.use_gqa and not ctx.caps.untested:
            state.chain[layer.kv_source] = (present_key, present_value)
        return self.o_proj(ctx, out)

    def _norm(self, name: str) -> RMSNorm | None:
        norm = getattr(self, name, None)
        return norm if isinstance(norm, RMSNorm) else None

    def _static_attention(self, ctx: BuildContext, x: ir.Value, state: DecoderState) -> ir.Value:
        op, layer = ctx.op, self._layer
        inputs = state.static
        assert inputs is not None
        heads, kv, dim = ctx.spec.num_attention_heads, layer.num_kv_heads, layer.head_dim
        if layer.owns_kv:
            qkv = op.Reshape(self.qkv_proj(ctx, x), ctx.ints([0, 0, heads + 2 * kv, dim]))
            qkv = sattn.to_core(ctx, qkv)
            if self._qk_norm and self._value_norm:
                qkv = self.qkv_norm(ctx, qkv)
            elif self._qk_norm:  # q and k normed, v as projected
                qk, value = op.Split(qkv, ctx.ints([heads + kv, kv]), axis=2, _outputs=2)
                qkv = op.Concat(self.qkv_norm(ctx, qk), value, axis=2)
            past_key, past_value = state.past[ctx.spec.kv_cache_index(layer.index)]
            out, present_key, present_value = sattn.owner(
                ctx, layer, inputs, qkv, past_key, past_value
            )
            state.presents[layer.index] = (present_key, present_value)
            return out
        query = sattn.to_core(ctx, op.Reshape(self.q_proj(ctx, x), ctx.ints([0, 0, heads, dim])))
        if self._qk_norm:
            query = self.q_norm(ctx, query)
        query = sattn.shared_query(ctx, layer, inputs, query)
        return sattn.attend(ctx, layer, inputs, query, layer.kv_source)


class RopeCaches(Module):
    """cos / sin caches per attention kind that some layer rotates in: computed, not read.

    Kinds in ``fp32`` (lowered over static buffers) are fp32, the others the package's
    dtype; kinds in ``trimmed`` keep just the columns of the frequency pairs that rotate (a
    quarter of a proportional-RoPE full layer's; the graph pads the rows it gathers).
    """

    def __init__(
        self,
        spec: ModelSpec,
        max_length: int,
        *,
        fp32: frozenset[AttentionKind] = frozenset(),
        trimmed: frozenset[AttentionKind] = frozenset(),
    ) -> None:
        for kind in attn.rotary_kinds(spec):
            head_dim = next(layer.head_dim for layer in spec.layers if layer.attention == kind)
            rope = spec.rope[kind]
            cols = rope.rotated_pairs(head_dim) if kind in trimmed else head_dim // 2
            dtype = sattn.CORE_DTYPE if kind in fp32 else None
            setattr(self, kind, _CosSin(rope, head_dim, max_length, cols, dtype))


def rope_caches(spec: ModelSpec, options: ExportOptions, max_length: int) -> RopeCaches:
    """The caches the decoder's attention lowering reads: for kinds on static buffers fp32,
    with only the rotated columns under a static capture graph (fp16's bytes, fp32's
    precision: WebGPU), else full width in the package's dtype."""
    static = attn.static_kinds(spec, options)
    trimmed = static if options.caps.capture_needs_static_graph else frozenset()
    return RopeCaches(spec, max_length, fp32=static, trimmed=trimmed)


class _CosSin(Module):
    """One kind's cos and sin caches: a row per position; twice that for a longrope that
    outgrows its original length (the short set, then the long one)."""

    def __init__(
        self, rope: RopeSpec, head_dim: int, rows: int, cols: int, dtype: str | None
    ) -> None:
        long_from = rows if rope.switches(rows) else None
        shape = (rows if long_from is None else 2 * rows, cols)
        cos, sin = (RopeTable(rope, head_dim, part, long_from) for part in ("cos", "sin"))
        self.cos_cache = Param(shape, "rope_cache", computed=cos, dtype=dtype)
        self.sin_cache = Param(shape, "rope_cache", computed=sin, dtype=dtype)


def index_dtype(ctx: BuildContext) -> ir.DataType:
    """The dtype of ids and masks: int64, or int32 where the EP keeps no int64 on the device."""
    return ir.DataType.INT64 if ctx.caps.int64_on_device else ir.DataType.INT32


def outputs(ctx: BuildContext, logits: ir.Value, state: DecoderState) -> None:
    """The decoder's outputs: ``logits`` and each KV-owning layer's present key and value."""
    spec = ctx.spec
    ctx.output(logits, "logits", ctx.dtype, ["batch_size", "sequence_length", spec.vocab_size])
    # Where some layer writes K / V by position the buffers are shared from the first step:
    # present is past's buffer, which is longer than the mask (declared as the mask's
    # length, onnxruntime's planner let the fp32 mask and a buffer row share memory).
    length = "past_sequence_length" if state.static is not None else "total_sequence_length"
    for cache, layer_spec in enumerate(spec.kv_layers):
        key, value = state.presents[layer_spec.index]
        kv_shape: list[int | str] = [
            "batch_size",
            layer_spec.num_kv_heads,
            length,
            layer_spec.head_dim,
        ]
        ctx.output(key, f"present.{cache}.key", state.kv_dtype, kv_shape)
        ctx.output(value, f"present.{cache}.value", state.kv_dtype, kv_shape)


@dataclass
class DecoderState:
    """What the layers share while the decoder graph is built: attention inputs, the
    past KV inputs and the present KV each owning layer produced."""

    inputs: attn.AttentionInputs
    past: list[tuple[ir.Value, ir.Value]]
    presents: dict[int, tuple[ir.Value, ir.Value]]
    use_gqa: bool
    static: sattn.StaticInputs | None
    kv_dtype: ir.DataType
    chain: dict[int, tuple[ir.Value, ir.Value]]
    """KV producer -> the present of the last KV-shared GroupQueryAttention layer that read
    its cache (the same K / V: such a layer appends nothing). The next one reads that, so
    each present has one reader and onnxruntime may write it in place of its past
    (GroupQueryAttention's MayInplace): past and present then share a buffer, and the CUDA
    kernel no longer copies the whole cache into a present nothing read (E2B on an H100:
    30 copies and 30 memsets a token fewer). Only on EPs whose GQA kernels run here (CPU,
    CUDA): the EPs marked untested keep every KV-shared layer reading the producer."""

    def __init__(self, ctx: BuildContext, attention_mask: ir.Value, tokens: ir.Value) -> None:
        spec = ctx.spec
        self.use_gqa = ctx.plan.uses_gqa
        static_kinds = attn.static_kinds(spec, ctx.plan.options)
        static_kv = self.use_gqa and ctx.caps.explicit_attention_over_cache
        # genai allocates every cache in one dtype: the static lowering's fp32 where it is
        # the only one, else the package's (GQA's) for both
        self.kv_dtype = sattn.KV_DTYPE if static_kv else ctx.dtype
        self.past = []
        for cache, layer in enumerate(spec.kv_layers):
            shape: list[int | str] = [
                "batch_size",
                layer.num_kv_heads,
                "past_sequence_length",
                layer.head_dim,
            ]
            self.past.append(
                (
                    ctx.input(f"past_key_values.{cache}.key", self.kv_dtype, shape),
                    ctx.input(f"past_key_values.{cache}.value", self.kv_dtype, shape),
                )
            )
        self.presents = {}
        self.chain = {}
        self.static = None
        self._zeros: dict[object, ir.Value | None] = {}
        if static_kinds:
            rope = {
                kind: attn.rope_caches(ctx, kind)
                for kind in attn.rotary_kinds(spec)
                if kind in static_kinds
            }
            # batch 1 under a static capture graph; else batches as genai pads them, as the
            # GroupQueryAttention layers beside these read them
            right = not ctx.caps.capture_needs_static_graph
            positions = attn.query_positions(ctx, tokens, attention_mask, right_padded=right)
            self.static = sattn.static_inputs(ctx, positions, rope, self.kv_dtype)
        if static_kv:
            self.inputs = attn.AttentionInputs(input_ids=tokens)
        elif self.use_gqa:
            self.inputs = attn.gqa_inputs(ctx, tokens, attention_mask, static_kinds)
        else:
            self.inputs = attn.standard_inputs(ctx, tokens, attention_mask)

    def zeros(self, ctx: BuildContext, key: object, like: ir.Value) -> ir.Value | None:
        """The zero skip of the norms whose inputs are shaped as ``like``
        (:func:`~engine.graph.components.zero_rows`), made on first use of ``key`` and shared
        by every layer after; None where the EP norms without one."""
        if key not in self._zeros:
            self._zeros[key] = zero_rows(ctx, like)
        return self._zeros[key]

    def shared_kv(self, producer: int) -> tuple[ir.Value, ir.Value]:
        """The K / V a KV-shared layer reads: its producer's present, or the present of the
        last KV-shared layer that read it (:attr:`chain`)."""
        return self.chain.get(producer, self.presents[producer])

    def head_rows(
        self, ctx: BuildContext, x: ir.Value, heads: bool, count: int, dim: int
    ) -> tuple[ir.Value, ir.Value | None]:
        """``x`` ([B, S, count * D], or [B, S, count, D] when ``heads``) as a per-head norm
        takes it: where the EP norms by a zero skip, the heads as rows [B, S * count, D]
        with zeros of that shape (one per head count and width); elsewhere [B, S, count, D]
        and None."""
        if not skip_norms(ctx):
            return (x if heads else ctx.op.Reshape(x, ctx.ints([0, 0, count, dim]))), None
        rows = ctx.op.Reshape(x, ctx.ints([0, -1, dim]))
        return rows, self.zeros(ctx, (count, dim), rows)


def layer_flags(spec: ModelSpec, options: ExportOptions) -> list[dict[str, bool]]:
    """Each layer's lowering flags for the decoder layers' constructors: ``static`` (its
    attention over static KV buffers, :func:`engine.graph.attention.static_kinds`),
    ``fuse`` (gate and up as one projection) and ``packed`` (q, k and v as one)."""
    static = attn.static_kinds(spec, options)
    fuse, packed = options.caps.fuse_projections, attn.packs_qkv(spec, options)
    return [
        {"static": layer.attention in static, "fuse": fuse, "packed": packed}
        for layer in spec.layers
    ]


# ------------------------------------------------------------------------------ pre-norm decoder


class DecoderLayer(Module):
    """A pre-norm decoder layer: ``h += attn(norm(h)); h += mlp(norm(h))`` (Llama,
    Mistral, Qwen2 and Qwen3).

    Each residual add is fused into the norm after it where the EP has
    SkipSimplifiedLayerNormalization: the layer takes the previous layer's MLP output and
    residual apart (``pending``) and hands its own on the same way, so the last add is the
    final norm's."""

    def __init__(
        self,
        spec: ModelSpec,
        layer: LayerSpec,
        *,
        static: bool = False,
        fuse: bool = False,
        packed: bool = False,
    ) -> None:
        h = spec.hidden_size
        self.input_layernorm = RMSNorm(h)
        self.self_attn = Attention(spec, layer, static=static, packed=packed)
        self.post_attention_layernorm = RMSNorm(h)
        self.mlp = GatedMLP(
            h,
            layer.intermediate_size,
            spec.hidden_activation,
            fused=fuse,
            stored_fused=spec.stored_fused,
        )

    def __call__(
        self, ctx: BuildContext, hidden: ir.Value, pending: ir.Value | None, state: DecoderState
    ) -> tuple[ir.Value, ir.Value]:
        """``(mlp output, residual)``, not yet added; ``pending``: the previous layer's MLP
        output to add to ``hidden`` first (None for the first layer)."""
        if pending is None:
            x = self.input_layernorm(ctx, hidden)
        else:
            x, hidden = _skip_norm(ctx, pending, hidden, self.input_layernorm)
        out = self.self_attn(ctx, x, state)
        x, hidden = _skip_norm(ctx, out, hidden, self.post_attention_layernorm)
        return self.mlp(ctx, x), hidden


def _skip_norm(
    ctx: BuildContext, x: ir.Value, residual: ir.Value, norm: RMSNorm
) -> tuple[ir.Value, ir.Value]:
    """``(norm(x + residual), x + residual)``, one node where the EP fuses them."""
    assert norm.weight is not None
    return skip_rms_norm(ctx, x, residual, norm.weight.name, norm.width)


class CausalDecoder(Module):
    """The decoder session of a pre-norm decoder (``LlamaForCausalLM``'s layout): token
    embedding, layers, final norm, LM head (tied to the embedding or its own)."""

    def __init__(
        self, spec: ModelSpec, max_length: int, *, options: ExportOptions | None = None
    ) -> None:
        h = spec.hidden_size
        options = (options or ExportOptions()).resolve()
        self.embed_tokens = Embedding(spec.vocab_size, h)
        self.layers = [
            DecoderLayer(spec, layer, **flags)
            for layer, flags in zip(spec.layers, layer_flags(spec, options), strict=True)
        ]
        self.norm = RMSNorm(h)
        if not spec.tie_word_embeddings:
            self.lm_head = Embedding(spec.vocab_size, h, role="lm_head").at("lm_head.")
        self.rope = rope_caches(spec, options, max_length)

    def build(self, ctx: BuildContext) -> None:
        """Inputs, layers and outputs of the decoder graph."""
        dtype = index_dtype(ctx)
        ids = ctx.input("input_ids", dtype, ["batch_size", "sequence_length"])
        hidden = embedding(ctx, ids, self.embed_tokens.weight.name)
        mask = ctx.input("attention_mask", dtype, ["batch_size", "total_sequence_length"])
        state = DecoderState(ctx, mask, ids)
        pending: ir.Value | None = None
        for layer in self.layers:
            pending, hidden = layer(ctx, hidden, pending, state)
        assert pending is not None
        normed, _ = _skip_norm(ctx, pending, hidden, self.norm)
        logits = lm_head(ctx, normed)
        if ctx.spec.final_logit_softcapping:
            logits = softcap(ctx, logits, ctx.spec.final_logit_softcapping)
        outputs(ctx, logits, state)
