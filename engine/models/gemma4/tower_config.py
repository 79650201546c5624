"""Reading the multimodal towers of a ``gemma4`` config: ``vision_config``, ``audio_config``
and the token ids a multimodal prompt uses.

Defaults are transformers 5.24's (``configuration_gemma4.py``), so a config that leaves a
field out means what transformers would make of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config_fields import ConfigFields, positive, section
from engine.errors import SpecError
from engine.spec import AudioSpec, MultimodalTokens, VisionSpec

VISION_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu")
AUDIO_ACTIVATIONS = ("silu", "swish")
DEFAULT_MAX_SOFT_TOKENS = 280
"""Image tokens per image at most, as the public checkpoints' image processors set it."""


def vision_spec(config: Mapping[str, Any], origin: str) -> VisionSpec | None:
    """The vision tower, or None when the config has no ``vision_config``."""
    v = section(config, "vision_config", origin)
    if v is None:
        return None
    hidden = positive(v, "hidden_size", 768)
    heads = positive(v, "num_attention_heads", 12)
    kv_heads = positive(v, "num_key_value_heads", heads)
    head_dim = positive(v, "head_dim", 64)
    if heads % kv_heads:
        raise SpecError(f"{v.origin}: {kv_heads} KV heads do not divide {heads} attention heads")
    if head_dim % 4:
        raise SpecError(
            f"{v.origin}: head_dim {head_dim} must be a multiple of 4 for the 2-D (axial) RoPE"
        )
    activation = v.optional("hidden_activation", "gelu_pytorch_tanh", str)
    if activation not in VISION_ACTIVATIONS:
        raise SpecError(f"{v.origin}: hidden_activation '{activation}' is not supported")
    rope = v.data.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise SpecError(f"{v.origin}: 'rope_parameters' must be an object, got {rope!r}")
    # The released configs say "default"; transformers reads that as its axial 2-D RoPE.
    if rope.get("rope_type", "axial") not in ("axial", "default"):
        raise SpecError(f"{v.origin}: only axial RoPE is supported, got {rope.get('rope_type')!r}")
    return VisionSpec(
        hidden_size=hidden,
        intermediate_size=positive(v, "intermediate_size", 3072),
        num_layers=positive(v, "num_hidden_layers", 16),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        activation=activation,
        rms_norm_eps=v.optional("rms_norm_eps", 1e-6, float),
        patch_size=positive(v, "patch_size", 16),
        pooling_kernel_size=positive(v, "pooling_kernel_size", 3),
        position_embedding_size=positive(v, "position_embedding_size", 10 * 1024),
        rope_theta=float(rope.get("rope_theta", 100.0)),
        use_clipped_linears=v.optional("use_clipped_linears", False, bool),
        standardize=v.optional("standardize", False, bool),
        max_soft_tokens=DEFAULT_MAX_SOFT_TOKENS,
    )


def audio_spec(config: Mapping[str, Any], origin: str) -> AudioSpec | None:
    """The audio tower, or None when the config has no ``audio_config``."""
    a = section(config, "audio_config", origin)
    if a is None:
        return None
    hidden = positive(a, "hidden_size", 1024)
    heads = positive(a, "num_attention_heads", 8)
    if hidden % heads:
        raise SpecError(f"{a.origin}: {heads} heads do not divide hidden_size {hidden}")
    channels = a.data.get("subsampling_conv_channels", [128, 32])
    if (
        not isinstance(channels, list | tuple)
        or len(channels) != 2
        or not all(isinstance(c, int) and c > 0 for c in channels)
    ):
        raise SpecError(
            f"{a.origin}: 'subsampling_conv_channels' must be two positive integers, "
            f"got {channels!r}"
        )
    activation = a.optional("hidden_act", "silu", str)
    if activation not in AUDIO_ACTIVATIONS:
        raise SpecError(f"{a.origin}: hidden_act '{activation}' is not supported (silu)")
    chunk = positive(a, "attention_chunk_size", 12)
    left = positive(a, "attention_context_left", 13)
    return AudioSpec(
        hidden_size=hidden,
        num_layers=positive(a, "num_hidden_layers", 12),
        num_heads=heads,
        activation=activation,
        subsampling_conv_channels=(int(channels[0]), int(channels[1])),
        conv_kernel_size=positive(a, "conv_kernel_size", 5),
        residual_weight=a.optional("residual_weight", 0.5, float),
        chunk_size=chunk,
        context_left=left,
        context_right=a.optional("attention_context_right", 0),
        logit_cap=a.optional("attention_logit_cap", 50.0, float),
        invalid_logits_value=a.optional("attention_invalid_logits_value", -1.0e9, float),
        use_clipped_linears=a.optional("use_clipped_linears", True, bool),
        rms_norm_eps=a.optional("rms_norm_eps", 1e-6, float),
        gradient_clipping=a.optional("gradient_clipping", 1e10, float),
        output_proj_dims=positive(a, "output_proj_dims", 1536),
    )


def multimodal_tokens(config: Mapping[str, Any], origin: str) -> MultimodalTokens:
    """Token ids of the image / audio spans (transformers' defaults where absent)."""
    top = ConfigFields(config, origin)
    return MultimodalTokens(
        image_token_id=top.optional("image_token_id", 258_880),
        audio_token_id=top.optional("audio_token_id", 258_881),
        boi_token_id=top.optional("boi_token_id", 255_999),
        eoi_token_id=top.optional("eoi_token_id", 258_882),
        boa_token_id=top.optional("boa_token_id", 256_000),
        eoa_token_id=top.optional("eoa_token_index", top.optional("eoa_token_id", 258_883)),
        video_token_id=top.optional("video_token_id", 258_884),
    )
