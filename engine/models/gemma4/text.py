"""The Gemma 4 text decoder: its weight tree and its graph (Gemma 3's too: the same
four-norm layer without per-layer inputs and layer scalars, :mod:`engine.models.gemma3`).

Its layers are the shared attention (:mod:`engine.models.decoder`, with q/k norms and
Gemma's scale-free value norm) inside Gemma's own layer: four norms, the experts beside the
MLP, the per-layer input gate and the layer scalar. The decoder takes ``input_ids``, or
``inputs_embeds`` and ``per_layer_inputs`` when an embedding session computes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from engine.graph import attention as attn
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
from engine.graph.modules import Embedding, GatedMLP, Linear, Module, Param, RMSNorm
from engine.models.decoder import (
    Attention,
    DecoderState,
    index_dtype,
    layer_flags,
    outputs,
    rope_caches,
)
from engine.models.gemma4.moe import MoeBlock
from engine.options import ExportOptions
from engine.spec import LayerSpec, ModelSpec


class DecoderLayer(Module):
    """One Gemma 4 decoder layer (attention, MLP and the experts beside it, per-layer input
    gate, layer scalar)."""

    def __init__(
        self,
        spec: ModelSpec,
        layer: LayerSpec,
        *,
        static: bool = False,
        fuse: bool = False,
        packed: bool = False,
        layer_scalar: bool = True,
    ) -> None:
        h = spec.hidden_size
        self._index = layer.index
        self.input_layernorm = RMSNorm(h)
        self.self_attn = Attention(spec, layer, static=static, packed=packed)
        self.post_attention_layernorm = RMSNorm(h)
        self.pre_feedforward_layernorm = RMSNorm(h)
        self.mlp = GatedMLP(h, layer.intermediate_size, spec.hidden_activation, fused=fuse)
        self.moe = MoeBlock(spec, layer) if layer.moe is not None else None
        self.post_feedforward_layernorm = RMSNorm(h)
        if spec.has_ple:
            self.per_layer_input_gate = Linear(h, spec.ple_dim)
            self.per_layer_projection = Linear(spec.ple_dim, h)
            self.post_per_layer_input_norm = RMSNorm(h)
        self.layer_scalar = Param((1,), "scalar", fill=1.0) if layer_scalar else None

    def __call__(
        self,
        ctx: BuildContext,
        stream: ir.Value | Residual,
        per_layer_input: ir.Value | None,
        state: DecoderState,
    ) -> Residual:
        """The layer's output with its last residual add (and the layer scalar) not yet
        done, for the next norm to fuse; ``stream``: the embeddings, or the previous
        layer's :class:`Residual`."""
        op = ctx.op
        if isinstance(stream, Residual):
            x, hidden = stream.normed(ctx, self.input_layernorm)
        else:
            x, hidden = self.input_layernorm(ctx, stream), stream
        out = self.self_attn(ctx, x, state)
        zeros = state.zeros(ctx, "hidden", out)  # [B, S, H], as every norm of the stream
        out = self.post_attention_layernorm(ctx, out, zeros)
        norm = self.pre_feedforward_layernorm
        assert norm.weight is not None
        x, hidden = skip_rms_norm(ctx, out, hidden, norm.weight.name, norm.width)
        ffn = self.mlp(ctx, x)
        if self.moe is not None:
            ffn = self.moe(ctx, ffn, hidden)
        scale = self.layer_scalar.name if self.layer_scalar is not None else None
        ffn = self.post_feedforward_layernorm(ctx, ffn, zeros)
        if per_layer_input is None:
            return Residual(hidden, ffn, scale)
        hidden = op.Add(hidden, ffn)
        gate = activation(ctx, self.per_layer_input_gate(ctx, hidden), ctx.spec.hidden_activation)
        gated = self.per_layer_projection(ctx, op.Mul(gate, per_layer_input))
        return Residual(hidden, self.post_per_layer_input_norm(ctx, gated, zeros), scale)


@dataclass(frozen=True)
class Residual:
    """A layer's last residual add, not yet done: the residual stream is
    ``scalar * (base + addend)`` (``scalar``: the layer scalar's weight, None without one).

    The next norm takes the add as one SkipSimplifiedLayerNormalization: for a scalar
    ``s > 0``, ``norm(s * t) = norm(t)`` with the norm's epsilon divided by ``s^2`` (exact),
    so the scalar's Mul moves after the fused norm onto the stream alone. A scalar that is
    not positive keeps the plain Add, Mul and norm (a graph built without weights assumes
    the fused form)."""

    base: ir.Value
    addend: ir.Value
    scalar: str | None

    def normed(self, ctx: BuildContext, norm: RMSNorm) -> tuple[ir.Value, ir.Value]:
        """``(norm(stream), stream)``."""
        fused = self._fused(ctx, norm)
        if fused is None:
            stream = self._unfused_stream(ctx)
            return norm(ctx, stream), stream
        normed, total = fused
        if self.scalar is None:
            return normed, total
        return normed, ctx.op.Mul(total, ctx.param(self.scalar))

    def norm_only(self, ctx: BuildContext, norm: RMSNorm) -> ir.Value:
        """``norm(stream)`` where the stream itself is not needed (the final norm). With a
        layer scalar the plain Add, Mul and norm: the fused form would leave the scalar's
        initializer, which the plan stores, out of the graph."""
        if self.scalar is not None:
            return norm(ctx, self._unfused_stream(ctx))
        fused = self._fused(ctx, norm)
        assert fused is not None
        return fused[0]

    def _fused(self, ctx: BuildContext, norm: RMSNorm) -> tuple[ir.Value, ir.Value] | None:
        assert norm.weight is not None
        eps = ctx.spec.rms_norm_eps if norm.eps is None else norm.eps
        if self.scalar is not None:
            data = ctx.param_data(self.scalar)
            if data is not None:
                value = float(np.asarray(data, dtype=np.float64).reshape(-1)[0])
                folded = eps / value**2 if value > 0 else 0.0  # NaN is not > 0 either
                if not 0 < folded < FLOAT32_MAX:
                    return None
                eps = folded
        return skip_rms_norm(ctx, self.addend, self.base, norm.weight.name, norm.width, eps)

    def _unfused_stream(self, ctx: BuildContext) -> ir.Value:
        total = ctx.op.Add(self.base, self.addend)
        return total if self.scalar is None else ctx.op.Mul(total, ctx.param(self.scalar))


FLOAT32_MAX = float(np.finfo(np.float32).max)


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
        """One [B, S, D] input per layer. A table split into pieces of whole layers is
        gathered piece by piece and the rows concatenated, so the arithmetic runs once over
        all layers; the result is split per layer without Slice / Squeeze (graph capture)."""
        op, spec = ctx.op, ctx.spec
        table = ctx.weight(self.embed_tokens_per_layer.weight.name)
        if table.split_axis == 1:
            width = spec.num_layers * spec.ple_dim
            pieces = [gather_rows(ctx, table, ids, i) for i in range(len(table.pieces))]
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


class TextDecoder(Module):
    """The decoder session's weight tree, laid out as ``Gemma4ForCausalLM`` stores it.

    ``embeds_in=True`` is the multimodal decoder: it takes ``inputs_embeds`` (and the
    per-layer inputs) from the embedding session; it keeps the token table only when the
    LM head is tied to it. ``options`` choose the attention lowering and fused
    projections (the EP's flags); None = the engine's defaults. ``layer_scalar=False``:
    layers without Gemma 4's scalar (Gemma 3).
    """

    def __init__(
        self,
        spec: ModelSpec,
        max_length: int,
        *,
        embeds_in: bool = False,
        options: ExportOptions | None = None,
        layer_scalar: bool = True,
    ) -> None:
        h = spec.hidden_size
        options = (options or ExportOptions()).resolve()
        self._embeds_in = embeds_in
        if not embeds_in or spec.tie_word_embeddings:
            self.embed_tokens = Embedding(spec.vocab_size, h, scale=h**0.5)
        if spec.has_ple and not embeds_in:
            self.per_layer = PerLayerInputs(spec)
        self.layers = [
            DecoderLayer(spec, layer, layer_scalar=layer_scalar, **flags)
            for layer, flags in zip(spec.layers, layer_flags(spec, options), strict=True)
        ]
        self.norm = RMSNorm(h)
        if not spec.tie_word_embeddings:
            self.lm_head = Embedding(spec.vocab_size, h, role="lm_head").at("lm_head.")
        self.rope = rope_caches(spec, options, max_length)

    def build(self, ctx: BuildContext) -> None:
        """Inputs, layers and outputs of the decoder graph."""
        spec = ctx.spec
        ids_dtype = index_dtype(ctx)
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
            ids = ctx.input("input_ids", ids_dtype, ["batch_size", "sequence_length"])
            tokens = ids
            hidden = embedding(ctx, ids, self.embed_tokens.weight.name)
            if spec.has_ple:
                per_layer = self.per_layer.per_layer(ctx, ids, hidden)
        attention_mask = ctx.input(
            "attention_mask", ids_dtype, ["batch_size", "total_sequence_length"]
        )
        state = DecoderState(ctx, attention_mask, tokens)
        stream: ir.Value | Residual = hidden
        for layer in self.layers:
            layer_input = per_layer[layer._index] if per_layer is not None else None
            stream = layer(ctx, stream, layer_input, state)
        assert isinstance(stream, Residual)
        logits = lm_head(ctx, stream.norm_only(ctx, self.norm))
        if spec.final_logit_softcapping:
            logits = softcap(ctx, logits, spec.final_logit_softcapping)
        outputs(ctx, logits, state)
