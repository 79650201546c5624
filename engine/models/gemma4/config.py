"""Gemma 4's ``config.json``: the text decoder of ``gemma4_text`` checkpoints, and of
``gemma4`` (multimodal) ones under ``text_config``, into a :class:`~engine.spec.ModelSpec`.

The raw JSON is parsed here rather than through transformers' config classes, whose
fields move between releases (``global_head_dim`` became ``per_layer_config`` in 5.15)
and which would pull torch into every import. Both formats are read; the towers of a
multimodal checkpoint are read by :mod:`engine.models.gemma4.tower_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config_fields import ConfigFields, source_dtype, token_ids
from engine.errors import SpecError
from engine.models.gemma4.tower_config import audio_spec, multimodal_tokens, vision_spec
from engine.models.layer_types import LAYER_TYPE_NAMES, layer_kinds
from engine.models.rope_config import read_rope
from engine.spec import (
    ROPE_KINDS,
    AttentionKind,
    LayerSpec,
    ModelSpec,
    MoeSpec,
    RopeKind,
    RopeSpec,
)

MODEL_TYPES = ("gemma4_text", "gemma4")
SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu")
ROPE_TYPES: tuple[RopeKind, ...] = tuple(kind for kind in ROPE_KINDS if kind != "longrope")
"""Gemma 4's checkpoints use default and proportional RoPE; its graphs take every kind the
spec describes (the caches are computed from the spec), as transformers' Gemma 4 does."""


def _rope_specs(text: ConfigFields) -> dict[AttentionKind, RopeSpec]:
    defaults: dict[AttentionKind, RopeSpec] = {
        "sliding": RopeSpec("default", 10_000.0),
        "full": RopeSpec("proportional", 1_000_000.0, partial_rotary_factor=0.25),
    }
    params = text.data.get("rope_parameters")
    if params is None:
        return defaults
    if not isinstance(params, Mapping):
        raise SpecError(f"{text.origin}: 'rope_parameters' must be an object, got {params!r}")
    specs = dict(defaults)
    for layer_type, kind in LAYER_TYPE_NAMES.items():
        entry = params.get(layer_type)
        if entry is None:
            continue
        if not isinstance(entry, Mapping):
            raise SpecError(
                f"{text.origin}: rope_parameters['{layer_type}'] must be an object, got {entry!r}"
            )
        origin = f"{text.origin} rope_parameters['{layer_type}']"
        specs[kind] = read_rope(entry, origin, defaults[kind], ROPE_TYPES)
    return specs


def _layer_types(text: ConfigFields, num_layers: int) -> list[AttentionKind]:
    raw = text.data.get("layer_types")
    if raw is None:
        # transformers' default: five sliding layers, then one full layer.
        raw = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)]
    kinds = layer_kinds(text, raw, num_layers)
    # transformers forces the last layer to full attention.
    kinds[-1] = "full"
    return kinds


def _per_layer_overrides(
    text: ConfigFields, kinds: list[AttentionKind], k_eq_v: bool
) -> dict[int, dict[str, int]]:
    """Head-dim / KV-head overrides per layer, from either config format."""
    overrides: dict[int, dict[str, int]] = {}
    per_layer = text.data.get("per_layer_config")
    if per_layer is not None:  # transformers >= 5.15
        if not isinstance(per_layer, Mapping):
            raise SpecError(f"{text.origin}: 'per_layer_config' must be an object")
        for key, values in per_layer.items():
            if not isinstance(values, Mapping):
                raise SpecError(f"{text.origin}: per_layer_config[{key!r}] must be an object")
            fields = ConfigFields(values, f"{text.origin} per_layer_config[{key!r}]")
            clean: dict[str, int] = {}
            if values.get("head_dim") is not None:
                clean["head_dim"] = fields.head_dim("head_dim", values["head_dim"])
            if values.get("num_key_value_heads") is not None:
                clean["num_key_value_heads"] = fields.required("num_key_value_heads", least=1)
            if str(key) in LAYER_TYPE_NAMES:
                targets = [i for i, k in enumerate(kinds) if k == LAYER_TYPE_NAMES[str(key)]]
            else:
                try:
                    targets = [int(key)]
                except ValueError:
                    raise SpecError(
                        f"{text.origin}: per_layer_config key {key!r} is neither a layer index "
                        "nor a layer type"
                    ) from None
            for index in targets:
                if not 0 <= index < len(kinds):
                    raise SpecError(
                        f"{text.origin}: per_layer_config names layer {index}, "
                        f"but the model has {len(kinds)} layers"
                    )
                overrides.setdefault(index, {}).update(clean)
        return overrides
    # transformers <= 5.14: global_* fields apply to the full-attention layers.
    raw_global = text.data.get("global_head_dim")
    global_head_dim = text.head_dim("global_head_dim", 512 if raw_global is None else raw_global)
    global_kv_heads = text.optional("num_global_key_value_heads", None, least=1)
    for index, kind in enumerate(kinds):
        if kind != "full":
            continue
        entry = {"head_dim": global_head_dim}
        if global_kv_heads is not None and k_eq_v:
            entry["num_key_value_heads"] = global_kv_heads
        overrides[index] = entry
    return overrides


def _kv_sources(kinds: list[AttentionKind], num_shared: int, origin: str) -> list[int]:
    num_layers = len(kinds)
    if num_shared > num_layers:
        raise SpecError(
            f"{origin}: num_kv_shared_layers ({num_shared}) exceeds "
            f"num_hidden_layers ({num_layers})"
        )
    if num_shared == num_layers:
        raise SpecError(
            f"{origin}: every layer shares its KV (num_kv_shared_layers == num_hidden_layers); "
            "such a model has no KV producer and is not supported"
        )
    first_shared = num_layers - num_shared
    producers: dict[AttentionKind, int] = {}
    for index in range(first_shared):
        producers[kinds[index]] = index
    sources = []
    for index, kind in enumerate(kinds):
        if index < first_shared:
            sources.append(index)
        elif kind in producers:
            sources.append(producers[kind])
        else:
            raise SpecError(
                f"{origin}: layer {index} ({kind} attention) shares KV, but no earlier "
                f"{kind}-attention layer produces a KV cache"
            )
    return sources


def _moe_spec(text: ConfigFields) -> MoeSpec | None:
    """The experts of ``enable_moe_block`` configs (every layer of such a model has them)."""
    if not text.optional("enable_moe_block", False, bool):
        return None
    fields = {}
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        value = text.optional(key, None)
        if value is None or value < 1:
            raise SpecError(
                f"{text.origin}: a Mixture-of-Experts config (enable_moe_block) needs a positive "
                f"'{key}', got {value!r}"
            )
        fields[key] = value
    if fields["top_k_experts"] > fields["num_experts"]:
        raise SpecError(
            f"{text.origin}: top_k_experts ({fields['top_k_experts']}) exceeds "
            f"num_experts ({fields['num_experts']})"
        )
    return MoeSpec(
        num_experts=fields["num_experts"],
        top_k=fields["top_k_experts"],
        intermediate_size=fields["moe_intermediate_size"],
    )


def read_spec(
    config: Mapping[str, Any], name: str = "model", origin: str = "config.json"
) -> ModelSpec:
    """Read a Hugging Face Gemma 4 config (text-only or multimodal) into a :class:`ModelSpec`.

    Called through :func:`engine.models.spec_from_config`, which picks the family by
    ``model_type``: ``config["model_type"]`` is one of :data:`MODEL_TYPES`.
    """
    top = ConfigFields(config, origin)
    model_type = config["model_type"]
    if model_type == "gemma4":
        text_raw = config.get("text_config")
        if not isinstance(text_raw, Mapping):
            raise SpecError(f"{origin}: a 'gemma4' config needs a 'text_config' object")
        text = ConfigFields(text_raw, f"{origin} (text_config)")
        text_type = text_raw.get("model_type", "gemma4_text")
        prefix = "model.language_model."
    else:
        text = top
        text_type = model_type
        prefix = "model."
    if text_type != "gemma4_text":
        raise SpecError(f"{text.origin}: text model type '{text_type}' is not supported")

    if text.optional("attention_bias", False, bool):
        raise SpecError(f"{text.origin}: attention_bias=true is not supported")
    if text.data.get("use_bidirectional_attention") == "all":
        raise SpecError(
            f"{text.origin}: use_bidirectional_attention='all' (an encoder) cannot be exported "
            "as a causal decoder"
        )
    activation = text.one_of("hidden_activation", "gelu_pytorch_tanh", SUPPORTED_ACTIVATIONS)

    num_layers = text.layer_count()
    hidden = text.required("hidden_size", least=1)
    num_heads = text.required("num_attention_heads", least=1)
    num_kv_heads = text.required("num_key_value_heads", least=1)
    head_dim = text.head_dim("head_dim", text.required("head_dim"))
    intermediate = text.required("intermediate_size", least=1)
    vocab = text.required("vocab_size", least=1)
    k_eq_v = text.optional("attention_k_eq_v", False, bool)
    kinds = _layer_types(text, num_layers)
    overrides = _per_layer_overrides(text, kinds, k_eq_v)
    num_shared = text.optional("num_kv_shared_layers", 0)
    sources = _kv_sources(kinds, num_shared, text.origin)
    double_wide = text.optional("use_double_wide_mlp", False, bool)
    moe = _moe_spec(text)

    layers = []
    for index, kind in enumerate(kinds):
        extra = overrides.get(index, {})
        layer_head_dim = extra.get("head_dim", head_dim)
        layer_kv_heads = extra.get("num_key_value_heads", num_kv_heads)
        if num_heads % layer_kv_heads:
            raise SpecError(
                f"{text.origin}: layer {index} has {layer_kv_heads} KV heads, "
                f"which does not divide {num_heads} attention heads"
            )
        shared = sources[index] != index
        layers.append(
            LayerSpec(
                index=index,
                attention=kind,
                head_dim=layer_head_dim,
                num_kv_heads=layer_kv_heads,
                intermediate_size=intermediate * (2 if double_wide and shared else 1),
                kv_source=sources[index],
                k_eq_v=k_eq_v and kind == "full",
                moe=moe,
                query_scale=1.0,  # q and k are RMS-normed: no 1 / sqrt(head_dim)
            )
        )
    for layer in layers:
        source = layers[layer.kv_source]
        if (source.head_dim, source.num_kv_heads) != (layer.head_dim, layer.num_kv_heads):
            raise SpecError(
                f"{text.origin}: layer {layer.index} shares the KV of layer {source.index}, "
                "but their head_dim / num_key_value_heads differ"
            )

    ple_dim = text.optional("hidden_size_per_layer_input", 0)
    ple_vocab = text.optional("vocab_size_per_layer_input", vocab, least=1) if ple_dim else 0
    if ple_dim and ple_vocab < vocab:
        raise text.error(
            "vocab_size_per_layer_input",
            f"is {ple_vocab}, smaller than vocab_size ({vocab}): tokens {ple_vocab} and above "
            "would have no per-layer embedding (transformers fails on them too)",
        )
    # A multimodal checkpoint's top level says how generation ends (an -it model stops at
    # <turn|> too); its text_config keeps the text model's own ids.
    first, second = (top, text) if model_type == "gemma4" else (text, top)
    bos, eos, pad = token_ids(vocab, first, second)
    softcap = text.optional("final_logit_softcapping", None, float)
    if softcap is not None and softcap < 0:
        raise text.error("final_logit_softcapping", f"must not be negative, got {softcap}")
    eps = text.non_negative("rms_norm_eps", 1e-6)
    tie_text = text.optional("tie_word_embeddings", True, bool)
    tie = top.optional("tie_word_embeddings", tie_text, bool)
    dtype = source_dtype(text.data, config)
    return ModelSpec(
        name=name,
        model_type=text_type,
        source_model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        layers=tuple(layers),
        rope=_rope_specs(text),
        sliding_window=text.optional("sliding_window", 512, least=1),
        max_position_embeddings=text.optional("max_position_embeddings", 131_072, least=2),
        rms_norm_eps=eps,
        hidden_activation=activation,
        final_logit_softcapping=softcap if softcap else None,
        tie_word_embeddings=tie,
        ple_dim=ple_dim,
        ple_vocab_size=ple_vocab,
        bos_token_id=bos,
        eos_token_ids=eos,
        pad_token_id=pad,
        weight_prefix=prefix,
        source_dtype=dtype,
        bidirectional_images=text.data.get("use_bidirectional_attention") == "vision",
        vision=vision_spec(config, origin) if model_type == "gemma4" else None,
        audio=audio_spec(config, origin) if model_type == "gemma4" else None,
        tokens=multimodal_tokens(config, origin) if model_type == "gemma4" else None,
        qk_norm=True,
        value_norm=True,
        raw=dict(config),
    )
