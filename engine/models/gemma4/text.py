"""The Gemma 4 text decoder: its weight tree and its graph.

Session I/O follows onnxruntime-genai's names: ``input_ids`` (or ``inputs_embeds`` and
``per_layer_inputs`` when an embedding session computes them), ``attention_mask``,
``past_key_values.N.key/value`` -> ``logits``, ``present.N.key/value``, with one KV pair
per layer that owns a cache (KV-shared layers read their producer's).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from engine.graph import attention as attn
from engine.graph import static_attention as sattn
from engine.graph.components import (
    activation,
    embedding,
    gather_rows,
    lm_head,
    scale_rows,
    skip_rms_norm,
    softcap,
    split_even,
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
from engine.logical import RopeTable
from engine.models.gemma4.moe import MoeBlock
from engine.options import ExportOptions
from engine.spec import AttentionKind, LayerSpec, ModelSpec, RopeSpec


class Attention(Module):
    """Self-attention of one layer: q/k/v projections with their norms, o_proj.

    ``static``: the static-buffer lowering (:mod:`engine.graph.static_attention`); a
    KV-owning layer then projects q, k and v as one MatMul (``qkv_proj``) and norms all
    their heads at once (``qkv_norm``), in the fp32 of the attention core.
    """

    def __init__(self, spec: ModelSpec, layer: LayerSpec, *, static: bool = False) -> None:
        h, heads, dim = spec.hidden_size, spec.num_attention_heads, layer.head_dim
        kv, kv_width = layer.num_kv_heads, layer.num_kv_heads * dim
        self._layer = layer
        self._static = static
        if static and layer.owns_kv:
            value = "k_proj" if layer.k_eq_v else "v_proj"
            self.qkv_proj = FusedLinear(
                h, [("q_proj", heads * dim), ("k_proj", kv_width), (value, kv_width)]
            )
            self.qkv_norm = HeadNorm(
                dim, [("q_norm", heads), ("k_norm", kv), (None, kv)], dtype=sattn.CORE_DTYPE
            )
        elif static:
            self.q_proj = Linear(h, heads * dim)
            self.q_norm = RMSNorm(dim, dtype=sattn.CORE_DTYPE)
        else:
            self.q_proj = Linear(h, heads * dim)
            self.q_norm = RMSNorm(dim)
            if layer.owns_kv:
                self.k_proj = Linear(h, kv_width)
                self.v_proj = None if layer.k_eq_v else Linear(h, kv_width)
                self.k_norm = RMSNorm(dim)
            self.v_norm = RMSNorm(dim, scale=False)
        self.o_proj = Linear(heads * dim, h)

    def __call__(self, ctx: BuildContext, x: ir.Value, state: _DecoderState) -> ir.Value:
        if self._static:
            return self.o_proj(ctx, self._static_attention(ctx, x, state))
        op, spec, layer = ctx.op, ctx.spec, self._layer
        heads, kv_heads, dim = spec.num_attention_heads, layer.num_kv_heads, layer.head_dim

        def per_head(value: ir.Value, count: int) -> ir.Value:
            return op.Reshape(value, ctx.ints([0, 0, count, dim]))

        def flat(value: ir.Value, count: int) -> ir.Value:
            return op.Reshape(value, ctx.ints([0, 0, count * dim]))

        query = flat(self.q_norm(ctx, per_head(self.q_proj(ctx, x), heads)), heads)
        key = value = None
        if layer.owns_kv:
            key_raw = per_head(self.k_proj(ctx, x), kv_heads)
            value_raw = key_raw if self.v_proj is None else per_head(self.v_proj(ctx, x), kv_heads)
            key = flat(self.k_norm(ctx, key_raw), kv_heads)
            value = flat(self.v_norm(ctx, value_raw), kv_heads)
            past_key, past_value = state.past[spec.kv_cache_index(layer.index)]
        else:
            # Attend to the producer's full present KV; this layer adds nothing to it.
            past_key, past_value = state.presents[layer.kv_source]
        lower = attn.gqa if state.use_gqa else attn.standard
        out, present_key, present_value = lower(
            ctx, layer, state.inputs, query, key, value, past_key, past_value
        )
        if layer.owns_kv:
            state.presents[layer.index] = (present_key, present_value)
        return self.o_proj(ctx, out)

    def _static_attention(self, ctx: BuildContext, x: ir.Value, state: _DecoderState) -> ir.Value:
        op, layer = ctx.op, self._layer
        inputs = state.static
        assert inputs is not None
        if layer.owns_kv:
            heads = ctx.spec.num_attention_heads + 2 * layer.num_kv_heads
            qkv = op.Reshape(self.qkv_proj(ctx, x), ctx.ints([0, 0, heads, layer.head_dim]))
            normed = self.qkv_norm(ctx, sattn.to_core(ctx, qkv))
            past_key, past_value = state.past[ctx.spec.kv_cache_index(layer.index)]
            out, present_key, present_value = sattn.owner(
                ctx, layer, inputs, normed, past_key, past_value
            )
            state.presents[layer.index] = (present_key, present_value)
            return out
        heads = ctx.spec.num_attention_heads
        query = op.Reshape(self.q_proj(ctx, x), ctx.ints([0, 0, heads, layer.head_dim]))
        query = sattn.shared_query(ctx, layer, inputs, self.q_norm(ctx, sattn.to_core(ctx, query)))
        return sattn.attend(ctx, layer, inputs, query, layer.kv_source)


class DecoderLayer(Module):
    """One Gemma 4 decoder layer (attention, MLP and the experts beside it, per-layer input
    gate, layer scalar)."""

    def __init__(
        self, spec: ModelSpec, layer: LayerSpec, *, static: bool = False, fuse: bool = False
    ) -> None:
        h = spec.hidden_size
        self._index = layer.index
        self.input_layernorm = RMSNorm(h)
        self.self_attn = Attention(spec, layer, static=static)
        self.post_attention_layernorm = RMSNorm(h)
        self.pre_feedforward_layernorm = RMSNorm(h)
        self.mlp = GatedMLP(h, layer.intermediate_size, spec.hidden_activation, fused=fuse)
        self.moe = MoeBlock(spec, layer) if layer.moe is not None else None
        self.post_feedforward_layernorm = RMSNorm(h)
        if spec.has_ple:
            self.per_layer_input_gate = Linear(h, spec.ple_dim)
            self.per_layer_projection = Linear(spec.ple_dim, h)
            self.post_per_layer_input_norm = RMSNorm(h)
        self.layer_scalar = Param((1,), "scalar", fill=1.0)

    def __call__(
        self,
        ctx: BuildContext,
        hidden: ir.Value,
        per_layer_input: ir.Value | None,
        state: _DecoderState,
    ) -> ir.Value:
        op = ctx.op
        out = self.self_attn(ctx, self.input_layernorm(ctx, hidden), state)
        out = self.post_attention_layernorm(ctx, out)
        norm = self.pre_feedforward_layernorm
        assert norm.weight is not None
        x, hidden = skip_rms_norm(ctx, out, hidden, norm.weight.name, norm.width)
        ffn = self.mlp(ctx, x)
        if self.moe is not None:
            ffn = self.moe(ctx, ffn, hidden)
        hidden = op.Add(hidden, self.post_feedforward_layernorm(ctx, ffn))
        if per_layer_input is not None:
            gate = activation(
                ctx, self.per_layer_input_gate(ctx, hidden), ctx.spec.hidden_activation
            )
            gated = self.per_layer_projection(ctx, op.Mul(gate, per_layer_input))
            hidden = op.Add(hidden, self.post_per_layer_input_norm(ctx, gated))
        return op.Mul(hidden, ctx.param(self.layer_scalar.name))


class PerLayerInputs(Module):
    """Gemma 4's per-layer embeddings: a token table plus a projection of the embeddings.

    (norm(reshape(proj(h) * H^-0.5)) + table[ids] * sqrt(D)) * 2^-0.5, one [B, S, D]
    slice per layer. The tensors live at the text model's top level in the checkpoint,
    so this module is bound there (its attributes are those names).
    """

    _inline = True

    def __init__(self, spec: ModelSpec) -> None:
        layers, dim = spec.num_layers, spec.ple_dim
        self.embed_tokens_per_layer = Embedding(
            spec.ple_vocab_size, layers * dim, role="ple_table", scale=dim**0.5
        )
        self.per_layer_model_projection = Linear(spec.hidden_size, layers * dim)
        self.per_layer_projection_norm = RMSNorm(dim)

    def combined(self, ctx: BuildContext, ids: ir.Value, embeds: ir.Value) -> ir.Value:
        """All layers' inputs as one [B, S, L, D] tensor (what an embedding session outputs)."""
        op, spec = ctx.op, ctx.spec
        rows = embedding(ctx, ids, self.embed_tokens_per_layer.weight.name)
        rows = op.Reshape(rows, ctx.ints([0, 0, spec.num_layers, spec.ple_dim]))
        return op.Mul(op.Add(self._projected(ctx, embeds), rows), ctx.scalar(0.5**0.5))

    def per_layer(self, ctx: BuildContext, ids: ir.Value, embeds: ir.Value) -> list[ir.Value]:
        """One [B, S, D] input per layer. A table split into per-layer pieces is gathered
        piece by piece and the rows concatenated, so the arithmetic runs once over all
        layers; the result is split per layer without Slice / Squeeze (graph capture)."""
        op, spec = ctx.op, ctx.spec
        table = ctx.weight(self.embed_tokens_per_layer.weight.name)
        if table.split_axis == 1 and len(table.pieces) == spec.num_layers:
            width = spec.num_layers * spec.ple_dim
            pieces = [gather_rows(ctx, table, ids, i) for i in range(spec.num_layers)]
            rows = scale_rows(ctx, op.Concat(*pieces, axis=-1), table)
            projected = op.Reshape(self._projected(ctx, embeds), ctx.ints([0, 0, width]))
            combined = op.Mul(op.Add(projected, rows), ctx.scalar(0.5**0.5))
            return split_even(ctx, combined, spec.num_layers, spec.ple_dim)
        return split_layers(ctx, self.combined(ctx, ids, embeds))

    def _projected(self, ctx: BuildContext, embeds: ir.Value) -> ir.Value:
        op, spec = ctx.op, ctx.spec
        projected = self.per_layer_model_projection(ctx, embeds)
        projected = op.Mul(projected, ctx.scalar(spec.hidden_size**-0.5))
        projected = op.Reshape(projected, ctx.ints([0, 0, spec.num_layers, spec.ple_dim]))
        return self.per_layer_projection_norm(ctx, projected)


def split_layers(ctx: BuildContext, combined: ir.Value) -> list[ir.Value]:
    """[B, S, L, D] -> L values of [B, S, D]."""
    spec = ctx.spec
    flat = ctx.op.Reshape(combined, ctx.ints([0, 0, spec.num_layers * spec.ple_dim]))
    return split_even(ctx, flat, spec.num_layers, spec.ple_dim)


class RopeCaches(Module):
    """cos / sin caches per attention kind: computed, not read; ``dtype`` as :class:`Param`.

    ``rotated_only``: keep just the columns of the frequency pairs that rotate (a quarter
    of a proportional-RoPE full layer's); the graph pads the rows it gathers.
    """

    def __init__(
        self,
        spec: ModelSpec,
        max_length: int,
        dtype: str | None = None,
        *,
        rotated_only: bool = False,
    ) -> None:
        for kind in attention_kinds(spec):
            head_dim = next(layer.head_dim for layer in spec.layers if layer.attention == kind)
            rope = spec.rope[kind]
            cols = rope.rotated_pairs(head_dim) if rotated_only else head_dim // 2
            setattr(self, kind, _CosSin(rope, head_dim, max_length, cols, dtype))


class _CosSin(Module):
    def __init__(
        self, rope: RopeSpec, head_dim: int, rows: int, cols: int, dtype: str | None
    ) -> None:
        shape = (rows, cols)
        cos, sin = (RopeTable(rope, head_dim, part) for part in ("cos", "sin"))
        self.cos_cache = Param(shape, "rope_cache", computed=cos, dtype=dtype)
        self.sin_cache = Param(shape, "rope_cache", computed=sin, dtype=dtype)


def attention_kinds(spec: ModelSpec) -> list[AttentionKind]:
    """The attention kinds present, in first-use order."""
    kinds: list[AttentionKind] = []
    for layer in spec.layers:
        if layer.attention not in kinds:
            kinds.append(layer.attention)
    return kinds


class TextDecoder(Module):
    """The decoder session's weight tree, laid out as ``Gemma4ForCausalLM`` stores it.

    ``embeds_in=True`` is the multimodal decoder: it takes ``inputs_embeds`` (and the
    per-layer inputs) from the embedding session; it keeps the token table only when the
    LM head is tied to it. ``options`` choose the attention lowering and fused
    projections (the EP's flags); None = the engine's defaults.
    """

    def __init__(
        self,
        spec: ModelSpec,
        max_length: int,
        *,
        embeds_in: bool = False,
        options: ExportOptions | None = None,
    ) -> None:
        h = spec.hidden_size
        options = (options or ExportOptions()).resolve()
        static_kv = attn.uses_static_buffers(spec, options)
        fuse = options.caps.fuse_projections
        self._embeds_in = embeds_in
        if not embeds_in or spec.tie_word_embeddings:
            self.embed_tokens = Embedding(spec.vocab_size, h, scale=h**0.5)
        if spec.has_ple and not embeds_in:
            self.per_layer = PerLayerInputs(spec)
        self.layers = [
            DecoderLayer(spec, layer, static=static_kv, fuse=fuse) for layer in spec.layers
        ]
        self.norm = RMSNorm(h)
        if not spec.tie_word_embeddings:
            self.lm_head = Embedding(spec.vocab_size, h, role="lm_head").at("lm_head.")
        if static_kv:  # fp32 and only the rotated columns: fp16's bytes, fp32's precision
            self.rope = RopeCaches(spec, max_length, sattn.CORE_DTYPE, rotated_only=True)
        else:
            self.rope = RopeCaches(spec, max_length)

    def build(self, ctx: BuildContext) -> None:
        """Inputs, layers and outputs of the decoder graph."""
        spec = ctx.spec
        index_dtype = ir.DataType.INT64 if ctx.caps.int64_on_device else ir.DataType.INT32
        ids: ir.Value | None = None
        per_layer: list[ir.Value] | None = None
        if self._embeds_in:
            rows: list[int | str] = ["batch_size", "sequence_length"]
            hidden = ctx.input("inputs_embeds", ctx.dtype, [*rows, spec.hidden_size])
            tokens = attn.token_row(ctx, hidden)
            if spec.has_ple:
                # [B, S, L * D] as onnxruntime-genai hands it on from the embedding session.
                width = spec.num_layers * spec.ple_dim
                flat = ctx.input("per_layer_inputs", ctx.dtype, [*rows, width])
                layers = ctx.ints([0, 0, spec.num_layers, spec.ple_dim])
                per_layer = split_layers(ctx, ctx.op.Reshape(flat, layers))
        else:
            ids = ctx.input("input_ids", index_dtype, ["batch_size", "sequence_length"])
            tokens = ids
            hidden = embedding(ctx, ids, self.embed_tokens.weight.name)
            if spec.has_ple:
                per_layer = self.per_layer.per_layer(ctx, ids, hidden)
        attention_mask = ctx.input(
            "attention_mask", index_dtype, ["batch_size", "total_sequence_length"]
        )
        state = _DecoderState(ctx, attention_mask, tokens)
        for layer in self.layers:
            layer_input = per_layer[layer._index] if per_layer is not None else None
            hidden = layer(ctx, hidden, layer_input, state)
        logits = lm_head(ctx, self.norm(ctx, hidden))
        if spec.final_logit_softcapping:
            logits = softcap(ctx, logits, spec.final_logit_softcapping)
        ctx.output(logits, "logits", ctx.dtype, ["batch_size", "sequence_length", spec.vocab_size])
        for cache, layer_spec in enumerate(spec.kv_layers):
            key, value = state.presents[layer_spec.index]
            kv_shape: list[int | str] = [
                "batch_size",
                layer_spec.num_kv_heads,
                "total_sequence_length",
                layer_spec.head_dim,
            ]
            ctx.output(key, f"present.{cache}.key", state.kv_dtype, kv_shape)
            ctx.output(value, f"present.{cache}.value", state.kv_dtype, kv_shape)


@dataclass
class _DecoderState:
    """What the layers share while the decoder graph is built: attention inputs, the
    past KV inputs and the present KV each owning layer produced."""

    inputs: attn.AttentionInputs
    past: list[tuple[ir.Value, ir.Value]]
    presents: dict[int, tuple[ir.Value, ir.Value]]
    use_gqa: bool
    static: sattn.StaticInputs | None
    kv_dtype: ir.DataType

    def __init__(self, ctx: BuildContext, attention_mask: ir.Value, tokens: ir.Value) -> None:
        spec = ctx.spec
        self.use_gqa = ctx.plan.uses_gqa
        static_kv = self.use_gqa and ctx.caps.explicit_attention_over_cache
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
        self.static = None
        if static_kv:
            self.inputs = attn.AttentionInputs(input_ids=tokens)
            rope = {kind: attn.rope_caches(ctx, kind) for kind in attention_kinds(spec)}
            positions = attn.query_positions(ctx, tokens, attention_mask)
            self.static = sattn.static_inputs(ctx, positions, rope)
            return
        make_inputs = attn.gqa_inputs if self.use_gqa else attn.standard_inputs
        self.inputs = make_inputs(ctx, tokens, attention_mask)
