"""The embedding session of a multimodal Gemma 4 package.

onnxruntime-genai runs it before the decoder, every step: token ids (and, on the prompt
step, the vision / speech sessions' features) in, ``inputs_embeds`` and the per-layer
inputs out. Features replace the embeddings at their marker tokens, in order, as
transformers' ``masked_scatter`` does; the per-layer token lookup sees the pad id there,
and the per-layer projection sees the merged embeddings.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.graph.attention import ones_of
from engine.graph.context import BuildContext
from engine.graph.modules import Embedding, Module
from engine.models.gemma4.text import PerLayerInputs
from engine.spec import ModelSpec


class EmbeddingSession(Module):
    """Token embedding x sqrt(hidden), features scattered in, per-layer inputs."""

    def __init__(self, spec: ModelSpec, modalities: tuple[str, ...]) -> None:
        h = spec.hidden_size
        self._modalities = modalities
        self.embed_tokens = Embedding(spec.vocab_size, h, scale=h**0.5)
        if spec.has_ple:
            self.per_layer = PerLayerInputs(spec)

    def build(self, ctx: BuildContext) -> None:
        op, spec = ctx.op, ctx.spec
        assert spec.tokens is not None
        h = spec.hidden_size
        index_dtype = ir.DataType.INT64 if ctx.caps.int64_on_device else ir.DataType.INT32
        np_index = np.int64 if index_dtype == ir.DataType.INT64 else np.int32
        ids = ctx.input("input_ids", index_dtype, ["batch_size", "sequence_length"])
        markers = [
            (ctx.input(f"{kind}_features", ctx.dtype, [f"num_{kind}_tokens", h]), token)
            for kind, token, modality in (
                ("image", spec.tokens.image_token_id, "vision"),
                ("audio", spec.tokens.audio_token_id, "audio"),
            )
            if modality in self._modalities
        ]
        pad = ctx.const(np.array(spec.pad_token_id or 0, dtype=np_index), name="pad_id")

        def marks(token: int) -> ir.Value:
            return op.Equal(ids, ctx.const(np.array(token, dtype=np_index), name=f"id_{token}"))

        is_marker = [marks(t) for _, t in markers]
        # Every placeholder id (video too, and a tower's marker the package lacks) reads
        # as the pad token, as transformers does; a placeholder without a feature row for
        # it (a generated one) keeps that embedding.
        text_ids = ids
        for token in spec.tokens.placeholders:
            text_ids = op.Where(marks(token), pad, text_ids)
        embeds = self.embed_tokens(ctx, text_ids)
        for (features, _), mask in zip(markers, is_marker, strict=True):
            embeds = _scatter(ctx, embeds, features, mask, index_dtype)
        ctx.output(embeds, "inputs_embeds", ctx.dtype, ["batch_size", "sequence_length", h])
        if spec.has_ple:
            # onnxruntime-genai hands this on as a rank-3 [B, S, L * D] tensor.
            combined = self.per_layer.combined(ctx, text_ids, embeds)
            per_layer = op.Reshape(combined, ctx.ints([0, 0, -1]))
            width = spec.num_layers * spec.ple_dim
            shape: list[int | str] = ["batch_size", "sequence_length", width]
            ctx.output(per_layer, "per_layer_inputs", ctx.dtype, shape)


def _scatter(
    ctx: BuildContext,
    embeds: ir.Value,
    features: ir.Value,
    mask: ir.Value,
    index_dtype: ir.DataType,
) -> ir.Value:
    """``embeds`` with its marker positions replaced by ``features`` rows, in order.

    The n-th marker (row-major over the batch) takes feature row n: a running count of
    markers indexes the features behind one zero row, so a step with no features
    ([0, hidden] on decode steps) gathers only that row and keeps every embedding.
    The count is kept in the index dtype where the EP has an integer CumSum, else in
    float32 (exact below 2**24 markers) and cast for the Gather.
    """
    op = ctx.op
    h = ctx.spec.hidden_size
    count_dtype = (
        index_dtype if ctx.caps.has_kernel("CumSum", index_dtype.name) else ir.DataType.FLOAT
    )
    zero_row = ctx.const(np.zeros((1, h), dtype=ctx.np_dtype), name="zero_feature_row")
    rows = op.Concat(zero_row, features, axis=0)  # [1 + n, H]
    # n without Shape (which would leave the device): ones along the feature rows.
    first_column = op.Gather(rows, ctx.const(np.array(0, dtype=np.int64), name="index_0"), axis=1)
    available = op.ReduceSum(ones_of(ctx, first_column, count_dtype), keepdims=0)  # 1 + n
    marks = op.Cast(mask, to=count_dtype)  # [B, S]
    axis_0 = ctx.const(np.array(0, dtype=np.int32), name="axis_0_i32")
    axis_1 = ctx.const(np.array(1, dtype=np.int32), name="axis_1_i32")
    # Row-major order over the batch without Shape: markers before each row, plus the
    # running count inside it.
    before = op.CumSum(op.ReduceSum(marks, ctx.ints([1]), keepdims=1), axis_0, exclusive=1)
    index = op.Mul(op.Add(op.CumSum(marks, axis_1), before), marks)  # 1-based, 0 elsewhere
    fed = op.And(mask, op.Less(index, available))  # markers that have a feature row
    index = op.Mul(index, op.Cast(fed, to=count_dtype))
    if count_dtype != index_dtype:
        index = op.Cast(index, to=index_dtype)
    gathered = op.Gather(rows, index, axis=0)  # [B, S, H]
    return op.Where(op.Unsqueeze(fed, ctx.ints([-1])), gathered, embeds)
