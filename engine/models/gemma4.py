"""The Gemma 4 text decoder graph, assembled from the plan.

Session I/O follows onnxruntime-genai's names: ``input_ids``, ``attention_mask``,
``past_key_values.N.key/value`` -> ``logits``, ``present.N.key/value``, with one KV pair
per layer that owns a cache (KV-shared layers read their producer's).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.graph import attention as attn
from engine.graph.components import (
    embedding,
    gather_rows,
    gelu,
    linear,
    lm_head,
    rms_norm,
    scale_rows,
    skip_rms_norm,
    softcap,
)
from engine.graph.context import BuildContext
from engine.plan import ExportPlan
from engine.spec import LayerSpec
from engine.weights.factory import TensorFactory


def build_decoder(plan: ExportPlan, factory: TensorFactory | None = None) -> ir.Model:
    """The decoder model; initializers are lazy (written later) or empty without a factory."""
    ctx = BuildContext(plan, plan.decoder, factory)
    spec = ctx.spec
    index_dtype = ir.DataType.INT64 if ctx.caps.int64_on_device else ir.DataType.INT32
    input_ids = ctx.input("input_ids", index_dtype, ["batch_size", "sequence_length"])
    attention_mask = ctx.input(
        "attention_mask", index_dtype, ["batch_size", "total_sequence_length"]
    )
    past: list[tuple[ir.Value, ir.Value]] = []
    for cache, layer in enumerate(spec.kv_layers):
        shape: list[int | str] = [
            "batch_size",
            layer.num_kv_heads,
            "past_sequence_length",
            layer.head_dim,
        ]
        past.append(
            (
                ctx.input(f"past_key_values.{cache}.key", ctx.dtype, shape),
                ctx.input(f"past_key_values.{cache}.value", ctx.dtype, shape),
            )
        )

    hidden = embedding(ctx, input_ids, "embed_tokens.weight")
    per_layer = _per_layer_inputs(ctx, input_ids, hidden) if spec.has_ple else None
    use_gqa = plan.uses_gqa
    inputs = (attn.gqa_inputs if use_gqa else attn.standard_inputs)(ctx, input_ids, attention_mask)

    presents: dict[int, tuple[ir.Value, ir.Value]] = {}
    for layer in spec.layers:
        layer_input = per_layer[layer.index] if per_layer is not None else None
        hidden = _decoder_layer(ctx, layer, hidden, layer_input, inputs, past, presents, use_gqa)

    hidden = rms_norm(ctx, hidden, "norm.weight", spec.hidden_size)
    logits = lm_head(ctx, hidden)
    if spec.final_logit_softcapping:
        logits = softcap(ctx, logits, spec.final_logit_softcapping)
    ctx.output(logits, "logits", ctx.dtype, ["batch_size", "sequence_length", spec.vocab_size])
    for cache, layer in enumerate(spec.kv_layers):
        key, value = presents[layer.index]
        shape = ["batch_size", layer.num_kv_heads, "total_sequence_length", layer.head_dim]
        ctx.output(key, f"present.{cache}.key", ctx.dtype, shape)
        ctx.output(value, f"present.{cache}.value", ctx.dtype, shape)
    return ctx.model()


def _per_layer_inputs(ctx: BuildContext, input_ids: ir.Value, embeds: ir.Value) -> list[ir.Value]:
    """Gemma 4's per-layer embeddings: one [B, S, D] input per layer.

    (norm(reshape(proj(h) * H^-0.5)) + table[ids] * sqrt(D)) * 2^-0.5, sliced per layer
    with Gather on a constant index (no Slice / Squeeze, which graph capture dislikes).
    A table split into per-layer pieces is gathered piece by piece.
    """
    op, spec = ctx.op, ctx.spec
    layers, dim = spec.num_layers, spec.ple_dim
    projected = linear(ctx, embeds, "per_layer_model_projection.weight")
    projected = op.Mul(projected, ctx.scalar(spec.hidden_size**-0.5))
    projected = op.Reshape(projected, ctx.ints([0, 0, layers, dim]))
    projected = rms_norm(ctx, projected, "per_layer_projection_norm.weight", dim)
    table = ctx.weight("embed_tokens_per_layer.weight")
    root_half = ctx.scalar(0.5**0.5)
    if table.split_axis == 1 and len(table.pieces) == layers:
        out = []
        for i in range(layers):
            rows = scale_rows(ctx, gather_rows(ctx, table, input_ids, i), table)
            proj_i = op.Gather(projected, _index(ctx, i), axis=2)
            out.append(op.Mul(op.Add(proj_i, rows), root_half))
        return out
    rows = embedding(ctx, input_ids, "embed_tokens_per_layer.weight")
    rows = op.Reshape(rows, ctx.ints([0, 0, layers, dim]))
    combined = op.Mul(op.Add(projected, rows), root_half)
    return [op.Gather(combined, _index(ctx, i), axis=2) for i in range(layers)]


def _index(ctx: BuildContext, i: int) -> ir.Value:
    return ctx.const(np.array(i, dtype=np.int64), name=f"index_{i}")


def _decoder_layer(
    ctx: BuildContext,
    layer: LayerSpec,
    hidden: ir.Value,
    per_layer_input: ir.Value | None,
    inputs: attn.AttentionInputs,
    past: list[tuple[ir.Value, ir.Value]],
    presents: dict[int, tuple[ir.Value, ir.Value]],
    use_gqa: bool,
) -> ir.Value:
    op, spec = ctx.op, ctx.spec
    p = f"layers.{layer.index}."
    width = spec.hidden_size
    x = rms_norm(ctx, hidden, p + "input_layernorm.weight", width)
    heads, kv_heads, dim = spec.num_attention_heads, layer.num_kv_heads, layer.head_dim

    query = linear(ctx, x, p + "self_attn.q_proj.weight")
    query = rms_norm(
        ctx, op.Reshape(query, ctx.ints([0, 0, heads, dim])), p + "self_attn.q_norm.weight", dim
    )
    query = op.Reshape(query, ctx.ints([0, 0, heads * dim]))
    key = value = None
    if layer.owns_kv:
        key_raw = op.Reshape(
            linear(ctx, x, p + "self_attn.k_proj.weight"), ctx.ints([0, 0, kv_heads, dim])
        )
        value_raw = (
            key_raw
            if layer.k_eq_v
            else op.Reshape(
                linear(ctx, x, p + "self_attn.v_proj.weight"), ctx.ints([0, 0, kv_heads, dim])
            )
        )
        key = op.Reshape(
            rms_norm(ctx, key_raw, p + "self_attn.k_norm.weight", dim),
            ctx.ints([0, 0, kv_heads * dim]),
        )
        value = op.Reshape(rms_norm(ctx, value_raw, None, dim), ctx.ints([0, 0, kv_heads * dim]))
        past_key, past_value = past[spec.kv_cache_index(layer.index)]
    else:
        # Attend to the producer's full present KV; this layer adds nothing to it.
        past_key, past_value = presents[layer.kv_source]
    lower = attn.gqa if use_gqa else attn.standard
    out, present_key, present_value = lower(
        ctx, layer, inputs, query, key, value, past_key, past_value
    )
    if layer.owns_kv:
        presents[layer.index] = (present_key, present_value)
    out = linear(ctx, out, p + "self_attn.o_proj.weight")
    out = rms_norm(ctx, out, p + "post_attention_layernorm.weight", width)
    x, hidden = skip_rms_norm(ctx, out, hidden, p + "pre_feedforward_layernorm.weight", width)

    gate = gelu(ctx, linear(ctx, x, p + "mlp.gate_proj.weight"), spec.hidden_activation)
    mlp = linear(
        ctx, op.Mul(gate, linear(ctx, x, p + "mlp.up_proj.weight")), p + "mlp.down_proj.weight"
    )
    mlp = rms_norm(ctx, mlp, p + "post_feedforward_layernorm.weight", width)
    hidden = op.Add(hidden, mlp)

    if per_layer_input is not None:
        gated = gelu(
            ctx, linear(ctx, hidden, p + "per_layer_input_gate.weight"), spec.hidden_activation
        )
        gated = linear(ctx, op.Mul(gated, per_layer_input), p + "per_layer_projection.weight")
        gated = rms_norm(ctx, gated, p + "post_per_layer_input_norm.weight", width)
        hidden = op.Add(hidden, gated)
    scalar_plan = ctx.weight(p + "layer_scalar")
    return op.Mul(hidden, ctx.parts(scalar_plan, scalar_plan.pieces[0])["weight"])
