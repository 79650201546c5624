"""The ``config.json`` of Llama and the decoders shaped like it (Mistral, Qwen2 / Qwen2.5,
Qwen3, SmolLM3, Phi-3) into a :class:`~engine.spec.ModelSpec`.

They share one layer (pre-norm attention and a gated MLP) and differ in data, which each
type's :class:`Variant` says: Qwen2's q/k/v biases, Qwen3's q/k norms, SmolLM3's layers
without RoPE, Phi-3's fused checkpoint tensors, where a sliding window applies. Both RoPE
formats are read: transformers 5's ``rope_parameters`` and the ``rope_theta`` /
``rope_scaling`` pair published checkpoints carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine.config_fields import ConfigFields, source_dtype, token_ids
from engine.errors import SpecError
from engine.graph.components import ACTIVATIONS
from engine.models.layer_types import LAYER_TYPE_NAMES, layer_kinds
from engine.models.rope_config import check_head, read_rope
from engine.spec import AttentionKind, LayerSpec, ModelSpec, RopeKind, RopeSpec

ROPE_TYPES: tuple[RopeKind, ...] = ("default", "linear", "llama3", "yarn", "longrope")
"""The rope types these decoders' checkpoints use that the graphs lower."""

DEFAULT_THETA = 10_000.0
"""transformers' ``rope_theta`` when a config names none."""
PHI3_ORIGINAL_LENGTH = 4096
"""Phi3Config's ``original_max_position_embeddings`` when a config names none."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class Variant:
    """What one ``model_type`` of the family does differently (transformers' defaults)."""

    qkv_bias: Literal["never", "always", "attention_bias"]
    """Biases on q/k/v: Qwen2 always has them; Llama and Qwen3 when ``attention_bias``."""
    o_bias: bool
    """``attention_bias`` also biases o_proj (Llama, Qwen3; not Qwen2)."""
    qk_norm: bool
    sliding: Literal["never", "all", "qwen", "smollm3"]
    """Where ``sliding_window`` applies: nowhere, every layer (Mistral), Qwen's
    ``use_sliding_window`` above ``max_window_layers``, or SmolLM3's ``use_sliding_window``
    on its no-RoPE layers (the last two: or their ``layer_types``)."""
    head_dim: int | None = None
    """The default ``head_dim``; None: hidden_size / num_attention_heads."""
    max_positions: int = 2048
    window: int | None = None
    """The ``sliding_window`` of a config that leaves the field out (``null`` is none)."""
    stored_fused: bool = False
    """The checkpoint keeps ``qkv_proj`` and ``gate_up_proj`` fused (Phi-3)."""
    no_rope: bool = False
    """Some layers skip RoPE (SmolLM3's ``no_rope_layers``: 1 rotates, 0 does not; by
    default every ``no_rope_layer_interval``-th layer does not)."""


VARIANTS: dict[str, Variant] = {
    "llama": Variant("attention_bias", True, False, "never"),
    "mistral": Variant("never", False, False, "all", max_positions=4096 * 32, window=4096),
    "qwen2": Variant("always", False, False, "qwen", max_positions=32_768, window=4096),
    "qwen3": Variant(
        "attention_bias", True, True, "qwen", head_dim=128, max_positions=32_768, window=4096
    ),
    "smollm3": Variant(
        "attention_bias", True, False, "smollm3", max_positions=32_768, no_rope=True
    ),
    "phi3": Variant("never", False, False, "all", max_positions=4096, stored_fused=True),
}
MODEL_TYPES = tuple(VARIANTS)


def read_spec(
    config: Mapping[str, Any], name: str = "model", origin: str = "config.json"
) -> ModelSpec:
    """Read a Llama, Mistral, Qwen2 or Qwen3 config into a :class:`ModelSpec`.

    Called through :func:`engine.models.spec_from_config`: ``config["model_type"]`` is one
    of :data:`MODEL_TYPES`.
    """
    fields = ConfigFields(config, origin)
    model_type = str(config["model_type"])
    variant = VARIANTS[model_type]
    activation = fields.one_of("hidden_act", "silu", ACTIVATIONS)
    if fields.optional("mlp_bias", False, bool):
        raise SpecError(f"{origin}: mlp_bias=true is not supported (no Llama release uses it)")
    num_layers = fields.layer_count()
    hidden = fields.required("hidden_size", least=1)
    num_heads = fields.required("num_attention_heads", least=1)
    num_kv_heads = fields.optional("num_key_value_heads", num_heads, least=1)
    if num_heads % num_kv_heads:
        raise SpecError(
            f"{origin}: num_key_value_heads ({num_kv_heads}) does not divide "
            f"num_attention_heads ({num_heads})"
        )
    default_head = variant.head_dim
    if default_head is None:
        if hidden % num_heads:
            raise SpecError(
                f"{origin}: hidden_size ({hidden}) is not a multiple of num_attention_heads "
                f"({num_heads}); set head_dim"
            )
        default_head = hidden // num_heads
    raw_head = config.get("head_dim")
    head_dim = fields.head_dim("head_dim", default_head if raw_head is None else raw_head)
    intermediate = fields.required("intermediate_size", least=1)
    vocab = fields.required("vocab_size", least=1)
    max_positions = fields.optional("max_position_embeddings", variant.max_positions, least=2)
    rotates = _rotating_layers(fields, variant, num_layers)
    kinds, window = _layer_kinds(fields, variant, num_layers, rotates, max_positions)
    attention_bias = fields.optional("attention_bias", False, bool)
    qkv_bias = variant.qkv_bias == "always" or (
        variant.qkv_bias == "attention_bias" and attention_bias
    )
    layers = tuple(
        LayerSpec(
            index=index,
            attention=kind,
            head_dim=head_dim,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate,
            kv_source=index,
            rope=rotates[index],
        )
        for index, kind in enumerate(kinds)
    )
    rope = _rope(fields, max_positions, model_type)
    check_head(rope, head_dim, origin)
    if rope.channel_order(head_dim) is not None and variant.qk_norm:
        raise SpecError(
            f"{origin}: partial_rotary_factor with q/k norms is not exported yet (no "
            f"{model_type} release has both)"
        )
    bos, eos, pad = token_ids(vocab, fields)
    eps = fields.non_negative("rms_norm_eps", 1e-6)
    return ModelSpec(
        name=name,
        model_type=model_type,
        source_model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        layers=layers,
        rope={kind: rope for kind in dict.fromkeys(kinds)},
        sliding_window=window,
        max_position_embeddings=max_positions,
        rms_norm_eps=eps,
        hidden_activation=activation,
        final_logit_softcapping=None,
        tie_word_embeddings=fields.optional("tie_word_embeddings", False, bool),
        ple_dim=0,
        ple_vocab_size=0,
        bos_token_id=bos,
        eos_token_ids=eos,
        pad_token_id=pad,
        weight_prefix="model.",
        source_dtype=source_dtype(config),
        qk_norm=variant.qk_norm,
        qkv_bias=qkv_bias,
        o_bias=variant.o_bias and attention_bias,
        stored_fused=variant.stored_fused,
        raw=dict(config),
    )


def _rotating_layers(fields: ConfigFields, variant: Variant, num_layers: int) -> list[bool]:
    """Which layers rotate q and k (all but SmolLM3's no-RoPE layers)."""
    if not variant.no_rope:
        return [True] * num_layers
    raw = fields.data.get("no_rope_layers")
    if raw is None:
        interval = fields.optional("no_rope_layer_interval", 4, least=1)
        return [(i + 1) % interval != 0 for i in range(num_layers)]
    if not isinstance(raw, list) or any(v not in (0, 1) or isinstance(v, float) for v in raw):
        raise SpecError(f"{fields.origin}: 'no_rope_layers' must be a list of 0 and 1, got {raw!r}")
    if len(raw) != num_layers:
        raise SpecError(
            f"{fields.origin}: 'no_rope_layers' has {len(raw)} entries "
            f"but num_hidden_layers is {num_layers}"
        )
    return [bool(v) for v in raw]


def _layer_kinds(
    fields: ConfigFields,
    variant: Variant,
    num_layers: int,
    rotates: list[bool],
    max_positions: int,
) -> tuple[list[AttentionKind], int]:
    """Each layer's attention kind and the window of the sliding ones (0 when none is). A
    window no shorter than ``max_position_embeddings`` (Phi-4-mini's 262,144 of 131,072)
    never hides a key: those layers attend in full, as transformers' mask does."""
    window = variant.window
    if "sliding_window" in fields.data:
        window = fields.optional("sliding_window", None, least=1)
    gated = variant.sliding in ("qwen", "smollm3")
    if gated and not fields.optional("use_sliding_window", False, bool):
        window = None  # transformers drops the window unless use_sliding_window
    if window is not None and window >= max_positions:
        window = None
    if variant.sliding == "never" or window is None:
        return ["full"] * num_layers, 0
    if variant.sliding == "all":
        return ["sliding"] * num_layers, window
    raw = fields.data.get("layer_types")
    if raw is None and variant.sliding == "smollm3":
        return ["full" if rotate else "sliding" for rotate in rotates], window
    if raw is None:
        first = fields.optional("max_window_layers", 28)
        return ["sliding" if i >= first else "full" for i in range(num_layers)], window
    return layer_kinds(fields, raw, num_layers), window


def _rope(fields: ConfigFields, max_positions: int, model_type: str) -> RopeSpec:
    """The one rotary embedding every layer uses, from either config format. Phi-3's
    configs call longrope ``su`` (early) or ``yarn``, which transformers reads as longrope,
    and keep its ``original_max_position_embeddings`` beside the rope fields."""
    params = fields.data.get("rope_parameters") or fields.data.get("rope_scaling") or {}
    origin = f"{fields.origin} rope_parameters"
    if not isinstance(params, Mapping):
        raise SpecError(f"{origin} must be an object, got {params!r}")
    nested = [key for key in params if key in LAYER_TYPE_NAMES]
    if nested:
        entries = [params[key] for key in nested]
        if any(entry != entries[0] for entry in entries):
            raise SpecError(
                f"{origin}: a different RoPE per layer type is not supported for this family"
            )
        params, origin = entries[0], f"{origin}['{nested[0]}']"
        if not isinstance(params, Mapping):
            raise SpecError(f"{origin} must be an object, got {params!r}")
    entry = dict(params)
    theta = fields.optional("rope_theta", DEFAULT_THETA, float)
    entry.setdefault("rope_theta", theta)
    if fields.data.get("partial_rotary_factor") is not None:
        entry.setdefault("partial_rotary_factor", fields.data["partial_rotary_factor"])
    if model_type == "phi3" and entry.get("rope_type", entry.get("type")) in ("su", "yarn"):
        entry["rope_type"] = "longrope"
    rope_type = entry.get("rope_type", entry.get("type"))
    if rope_type in ("llama3", "yarn", "longrope"):
        # transformers: a top-level original_max_position_embeddings wins over the rope
        # fields' (Phi3Config always has one, 4096 by default); else max_position_embeddings
        top = fields.optional("original_max_position_embeddings", None, least=1)
        if top is None and model_type == "phi3":
            top = PHI3_ORIGINAL_LENGTH
        if top is not None:
            entry["original_max_position_embeddings"] = top
        entry.setdefault("original_max_position_embeddings", max_positions)
    original: Any = entry.get("original_max_position_embeddings")
    if rope_type == "longrope" and entry.get("factor") is None and _is_count(original):
        # transformers: the ratio of the two lengths sets the attention factor
        entry["factor"] = max_positions / original
    return read_rope(entry, origin, RopeSpec("default", theta), ROPE_TYPES, partial=True)
