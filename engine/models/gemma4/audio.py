"""The speech session of a multimodal Gemma 4 package: the audio tower and ``embed_audio``.

onnxruntime-genai runs it once per clip: ``input_features`` [1, T, 128] log-mel frames
(float32, whatever the package's dtype: the graph casts) and ``input_features_mask``
[1, T] bool in, ``audio_features`` [A, text hidden] out, where A is the number of valid
frames after the two stride-2 convolutions (padding dropped, as transformers'
``get_audio_features`` followed by ``features[mask]``).

The conformer's chunked local attention is computed as full attention over the clip with
a mask that allows exactly the keys transformers' blocked context windows allow
(:mod:`engine.models.gemma4.audio_attention`); rows it leaves without any key get the
uniform weights transformers gives them. Nothing reads a tensor's shape: every index is
derived from the mask with ops WebGPU runs.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.errors import SpecError
from engine.graph.components import activation
from engine.graph.context import BuildContext
from engine.graph.conv import Conv, LayerNorm
from engine.graph.modules import ClippableLinear, Linear, Module, RMSNorm
from engine.models.gemma4.audio_attention import AudioAttention, AudioMasks, audio_masks, f32
from engine.spec import AudioSpec, ModelSpec

TRANSFORMERS_RMS_EPS = 1e-6
"""transformers builds the feed-forward and layer norms with Gemma4RMSNorm's default eps,
not the config's ``rms_norm_eps`` (the light conv and the embedder use the config's)."""
_DTYPE_MAX = {ir.DataType.FLOAT: float(np.finfo(np.float32).max), ir.DataType.FLOAT16: 65504.0}


def subsampled(length: int) -> int:
    """Length after two stride-2, pad-1, 3-wide convolutions: ceil(ceil(n / 2) / 2)."""
    return (length + 3) // 4


def _clip_bound(ctx: BuildContext, audio: AudioSpec) -> float:
    """``min(gradient_clipping, finfo(dtype).max)``, as transformers clamps."""
    return min(audio.gradient_clipping, _DTYPE_MAX[ctx.dtype])


def _clamp(ctx: BuildContext, x: ir.Value, bound: float) -> ir.Value:
    return ctx.op.Clip(x, ctx.scalar(-bound), ctx.scalar(bound))


# ------------------------------------------------------------------ subsampling


class SubsampleLayer(Module):
    """Mask, Conv2d 3x3 stride 2, LayerNorm over channels, ReLU. Works channels-last:
    [1, T, F, C] in and out."""

    def __init__(self, in_channels: int, out_channels: int, eps: float) -> None:
        self.conv = Conv(in_channels, out_channels, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
        self.norm = LayerNorm(out_channels, eps)

    def __call__(self, ctx: BuildContext, x: ir.Value, mask: ir.Value) -> ir.Value:
        op = ctx.op
        x = op.Mul(x, op.Unsqueeze(mask, ctx.ints([2, 3])))  # [1, T, 1, 1]
        x = self.conv(ctx, op.Transpose(x, perm=[0, 3, 1, 2]))
        return op.Relu(self.norm(ctx, op.Transpose(x, perm=[0, 2, 3, 1])))


class SubsampleConvProjection(Module):
    """Two stride-2 convolutions (T -> ceil(ceil(T/2)/2), F -> F/4), then a linear from
    the flattened (frequency, channel) axis into the tower's width."""

    def __init__(self, audio: AudioSpec) -> None:
        c0, c1 = audio.subsampling_conv_channels
        freq = subsampled(audio.feature_size)
        self.layer0 = SubsampleLayer(1, c0, audio.rms_norm_eps)
        self.layer1 = SubsampleLayer(c0, c1, audio.rms_norm_eps)
        self.input_proj_linear = Linear(freq * c1, audio.hidden_size)

    def __call__(
        self, ctx: BuildContext, features: ir.Value, masks: tuple[ir.Value, ir.Value]
    ) -> ir.Value:
        x = ctx.op.Unsqueeze(features, ctx.ints([-1]))  # [1, T, F, 1]
        x = self.layer0(ctx, x, masks[0])
        x = self.layer1(ctx, x, masks[1])
        return self.input_proj_linear(ctx, ctx.op.Reshape(x, ctx.ints([0, 0, -1])))


# ------------------------------------------------------------------ conformer


class FeedForward(Module):
    """Clamp, RMSNorm, Linear x4, SiLU, Linear, clamp, RMSNorm, times residual_weight, +x."""

    def __init__(self, audio: AudioSpec) -> None:
        h, clipped = audio.hidden_size, audio.use_clipped_linears
        self._audio = audio
        self.ffw_layer_1 = ClippableLinear(h, 4 * h, clipped=clipped)
        self.ffw_layer_2 = ClippableLinear(4 * h, h, clipped=clipped)
        self.pre_layer_norm = RMSNorm(h, eps=TRANSFORMERS_RMS_EPS)
        self.post_layer_norm = RMSNorm(h, eps=TRANSFORMERS_RMS_EPS)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        bound = _clip_bound(ctx, self._audio)
        out = self.pre_layer_norm(ctx, _clamp(ctx, x, bound))
        out = self.ffw_layer_2(ctx, activation(ctx, self.ffw_layer_1(ctx, out), "silu"))
        out = self.post_layer_norm(ctx, _clamp(ctx, out, bound))
        return ctx.op.Add(ctx.op.Mul(out, ctx.scalar(self._audio.residual_weight)), x)


class LightConv1d(Module):
    """RMSNorm, Linear x2, GLU, causal depthwise Conv1d, clamp, RMSNorm, SiLU, Linear, +x."""

    def __init__(self, audio: AudioSpec) -> None:
        h, clipped, k = audio.hidden_size, audio.use_clipped_linears, audio.conv_kernel_size
        self._audio = audio
        self.linear_start = ClippableLinear(h, 2 * h, clipped=clipped)
        self.linear_end = ClippableLinear(h, h, clipped=clipped)
        self.depthwise_conv1d = Conv(h, h, (k,), pads=(k - 1, 0), groups=h)
        self.pre_layer_norm = RMSNorm(h, eps=audio.rms_norm_eps)
        self.conv_norm = RMSNorm(h, eps=audio.rms_norm_eps)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        op = ctx.op
        out = self.linear_start(ctx, self.pre_layer_norm(ctx, x))
        value, gate = op.Split(out, axis=-1, num_outputs=2, _outputs=2)
        out = op.Mul(value, op.Sigmoid(gate))
        out = self.depthwise_conv1d(ctx, op.Transpose(out, perm=[0, 2, 1]))
        out = _clamp(ctx, op.Transpose(out, perm=[0, 2, 1]), _clip_bound(ctx, self._audio))
        out = self.linear_end(ctx, activation(ctx, self.conv_norm(ctx, out), "silu"))
        return op.Add(out, x)


class ConformerLayer(Module):
    """Feed-forward, chunked self-attention, light conv, feed-forward, output norm."""

    def __init__(self, audio: AudioSpec) -> None:
        h = audio.hidden_size
        self._audio = audio
        self.feed_forward1 = FeedForward(audio)
        self.feed_forward2 = FeedForward(audio)
        self.self_attn = AudioAttention(audio)
        self.lconv1d = LightConv1d(audio)
        self.norm_pre_attn = RMSNorm(h, eps=TRANSFORMERS_RMS_EPS)
        self.norm_post_attn = RMSNorm(h, eps=TRANSFORMERS_RMS_EPS)
        self.norm_out = RMSNorm(h, eps=TRANSFORMERS_RMS_EPS)

    def __call__(self, ctx: BuildContext, x: ir.Value, masks: AudioMasks) -> ir.Value:
        bound = _clip_bound(ctx, self._audio)
        x = self.feed_forward1(ctx, x)
        out = self.self_attn(ctx, self.norm_pre_attn(ctx, _clamp(ctx, x, bound)), masks)
        x = ctx.op.Add(self.norm_post_attn(ctx, _clamp(ctx, out, bound)), x)
        x = self.feed_forward2(ctx, self.lconv1d(ctx, x))
        return self.norm_out(ctx, _clamp(ctx, x, bound))


class AudioEncoder(Module):
    """``Gemma4AudioModel``: subsampling, conformer layers, ``output_proj`` (with bias)."""

    def __init__(self, audio: AudioSpec) -> None:
        self.subsample_conv_projection = SubsampleConvProjection(audio)
        self.layers = [ConformerLayer(audio) for _ in range(audio.num_layers)]
        self.output_proj = Linear(audio.hidden_size, audio.output_proj_dims, bias=True)


class AudioEmbedder(Module):
    """``embed_audio``: RMSNorm without scale, then a bias-free Linear into the text width."""

    def __init__(self, audio: AudioSpec, text_hidden: int) -> None:
        self.embedding_pre_projection_norm = RMSNorm(
            audio.output_proj_dims, scale=False, eps=audio.rms_norm_eps
        )
        self.embedding_projection = Linear(audio.output_proj_dims, text_hidden)

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        return self.embedding_projection(ctx, self.embedding_pre_projection_norm(ctx, x))


# ------------------------------------------------------------------ session


class AudioTower(Module):
    """The speech session's weight tree (bound at ``model.``) and graph."""

    def __init__(self, spec: ModelSpec) -> None:
        if spec.audio is None:
            raise ValueError("the model has no audio tower")
        audio = spec.audio
        c0 = audio.subsampling_conv_channels[0]
        if c0 // 4 != subsampled(audio.feature_size):
            # transformers sizes input_proj_linear from the channels, the data from the
            # mel bins: they only agree when the two match (128 for the public models).
            raise SpecError(
                f"audio_config: subsampling_conv_channels[0] ({c0}) must match the "
                f"{audio.feature_size} mel bins after two stride-2 convolutions "
                "(128 for Gemma 4's feature extractor)"
            )
        self._audio = audio
        self.audio_tower = AudioEncoder(audio)
        self.embed_audio = AudioEmbedder(audio, spec.hidden_size)

    def build(self, ctx: BuildContext) -> None:
        op, audio = ctx.op, self._audio
        features = ctx.input(
            "input_features", ir.DataType.FLOAT, [1, "num_frames", audio.feature_size]
        )
        mask = ctx.input("input_features_mask", ir.DataType.BOOL, [1, "num_frames"])
        if ctx.dtype != ir.DataType.FLOAT:
            features = op.Cast(features, to=ctx.dtype)
        # Frame masks as float32 0/1 (WebGPU slices and scans float, not bool or int32):
        # mask[:, ::2] after each convolution, as transformers subsamples it.
        frames = [op.Cast(mask, to=ir.DataType.FLOAT)]
        for _ in range(2):
            frames.append(
                op.Slice(frames[-1], ctx.ints([0]), ctx.ints([2**62]), ctx.ints([1]), ctx.ints([2]))
            )
        as_dtype = [
            v if ctx.dtype == ir.DataType.FLOAT else op.Cast(v, to=ctx.dtype) for v in frames
        ]
        encoder = self.audio_tower
        x = encoder.subsample_conv_projection(ctx, features, (as_dtype[0], as_dtype[1]))
        masks = audio_masks(ctx, audio, frames[2])
        for layer in encoder.layers:
            x = layer(ctx, x, masks)
        x = self.embed_audio(ctx, encoder.output_proj(ctx, x))
        out = _drop_padding(ctx, op.Squeeze(x, ctx.ints([0])), masks, frames[2])
        ctx.output(out, "audio_features", ctx.dtype, ["num_audio_tokens", ctx.spec.hidden_size])


def _drop_padding(
    ctx: BuildContext, rows: ir.Value, masks: AudioMasks, valid: ir.Value
) -> ir.Value:
    """The rows [S, H] whose frame is valid, in order: ``rows[valid]`` without NonZero or
    Compress (neither runs on WebGPU).

    Output row i is the (i + 1)-th valid frame: the number of frames j whose running count
    of valid frames is still <= i (clamped to S - 1 past the last one); the first
    ``sum(valid)`` rows are kept.
    """
    op = ctx.op
    seen = op.CumSum(valid, ctx.const(np.array(1, np.int32)))  # [1, S], inclusive
    passed = op.Not(op.Greater(seen, op.Transpose(masks.positions, perm=[1, 0])))  # [S, S]
    source = op.ReduceSum(op.Cast(passed, to=ir.DataType.FLOAT), ctx.ints([1]), keepdims=0)
    last = op.ReduceMax(masks.positions, keepdims=0)
    source = op.Clip(source, f32(ctx, 0), last)
    gathered = op.Gather(rows, op.Cast(source, to=ir.DataType.INT32), axis=0)
    count = op.Cast(op.ReduceSum(valid, ctx.ints([1]), keepdims=0), to=ir.DataType.INT32)
    zero = ctx.const(np.array([0], np.int32))
    return op.Slice(gathered, zero, count, zero)
