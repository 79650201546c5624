"""Gemma 3's ``config.json``: the text decoder of ``gemma3_text`` checkpoints (Gemma 3 1B,
270M) and of ``gemma3`` (multimodal: 4B, 12B, 27B) ones under ``text_config``, into a
:class:`~engine.spec.ModelSpec`.

Gemma 3's layer is Gemma 4's four-norm layer without per-layer inputs, KV sharing or value
norm: q/k norms, attention scaled by ``query_pre_attn_scalar ** -0.5``, sliding layers with
their own RoPE base (``rope_local_base_freq``), a tanh-GELU gated MLP, a tied head scaled
embedding. Its RMSNorms multiply by ``1 + w`` (``NORM_OFFSET``). Both RoPE formats are read:
transformers 5's ``rope_parameters`` per layer type and the published ``rope_theta`` /
``rope_local_base_freq`` / ``rope_scaling`` (which applies to the full layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config_fields import ConfigFields, source_dtype, token_ids
from engine.errors import SpecError
from engine.models.layer_types import LAYER_TYPE_NAMES, layer_kinds
from engine.models.rope_config import read_rope
from engine.spec import AttentionKind, LayerSpec, ModelSpec, RopeKind, RopeSpec

MODEL_TYPES = ("gemma3_text", "gemma3")
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu")
ROPE_TYPES: tuple[RopeKind, ...] = ("default", "linear", "llama3", "yarn")
NORM_OFFSET = 1.0
"""Gemma 3's RMSNorm scales by ``1 + weight`` (its weights initialise to zeros)."""
THETA = {"full": 1_000_000.0, "sliding": 10_000.0}
"""transformers' defaults: ``rope_theta`` for full layers, ``rope_local_base_freq`` for
sliding ones."""


def read_spec(
    config: Mapping[str, Any], name: str = "model", origin: str = "config.json"
) -> ModelSpec:
    """Read a Gemma 3 config (text-only or multimodal) into a :class:`ModelSpec` of its text
    decoder. Called through :func:`engine.models.spec_from_config`."""
    top = ConfigFields(config, origin)
    model_type = str(config["model_type"])
    if model_type == "gemma3":
        raw = config.get("text_config")
        if not isinstance(raw, Mapping):
            raise SpecError(f"{origin}: a 'gemma3' config needs a 'text_config' object")
        text = ConfigFields(raw, f"{origin} (text_config)")
        # As published and as transformers 5 saves Gemma3ForConditionalGeneration.
        prefix = "language_model.model."
    else:
        text, prefix = top, "model."
    if text.optional("use_bidirectional_attention", False, bool):
        raise SpecError(
            f"{text.origin}: use_bidirectional_attention=true is an embedding model "
            "(EmbeddingGemma), not a decoder this engine exports"
        )
    if text.optional("attn_logit_softcapping", None, float):
        raise text.error(
            "attn_logit_softcapping", "is set: attention softcapping is not exported (Gemma 2)"
        )
    activation = text.one_of("hidden_activation", "gelu_pytorch_tanh", ACTIVATIONS)
    num_layers = text.layer_count()
    hidden = text.optional("hidden_size", 2304, least=1)
    num_heads = text.optional("num_attention_heads", 8, least=1)
    num_kv_heads = text.optional("num_key_value_heads", 4, least=1)
    if num_heads % num_kv_heads:
        raise SpecError(
            f"{text.origin}: num_key_value_heads ({num_kv_heads}) does not divide "
            f"num_attention_heads ({num_heads})"
        )
    head_dim = text.head_dim("head_dim", text.data.get("head_dim") or 256)
    scalar = text.optional("query_pre_attn_scalar", 256, float)
    if scalar <= 0:
        raise text.error("query_pre_attn_scalar", f"must be positive, got {scalar}")
    intermediate = text.optional("intermediate_size", 9216, least=1)
    vocab = text.optional("vocab_size", 262_208, least=1)
    raw_types = text.data.get("layer_types")
    if raw_types is None:
        pattern = text.optional("sliding_window_pattern", 6, least=1)
        raw_types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(num_layers)
        ]
    kinds = layer_kinds(text, raw_types, num_layers)
    window = text.optional("sliding_window", 4096, least=1)
    layers = tuple(
        LayerSpec(
            index=index,
            attention=kind,
            head_dim=head_dim,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate,
            kv_source=index,
            query_scale=scalar**-0.5,
        )
        for index, kind in enumerate(kinds)
    )
    bos, eos, pad = token_ids(vocab, *((top, text) if model_type == "gemma3" else (text, top)))
    softcap = text.optional("final_logit_softcapping", None, float)
    if softcap is not None and softcap < 0:
        raise text.error("final_logit_softcapping", f"must not be negative, got {softcap}")
    tie_text = text.optional("tie_word_embeddings", True, bool)
    tie = top.optional("tie_word_embeddings", tie_text, bool)
    return ModelSpec(
        name=name,
        model_type="gemma3_text",
        source_model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        layers=layers,
        rope=_rope_specs(text),
        sliding_window=window if "sliding" in kinds else 0,
        max_position_embeddings=text.optional("max_position_embeddings", 131_072, least=2),
        rms_norm_eps=text.non_negative("rms_norm_eps", 1e-6),
        hidden_activation=activation,
        final_logit_softcapping=softcap if softcap else None,
        tie_word_embeddings=tie,
        ple_dim=0,
        ple_vocab_size=0,
        bos_token_id=bos,
        eos_token_ids=eos,
        pad_token_id=pad,
        weight_prefix=prefix,
        source_dtype=source_dtype(text.data, config),
        qk_norm=True,
        raw=dict(config),
    )


def _rope_specs(text: ConfigFields) -> dict[AttentionKind, RopeSpec]:
    """Full and sliding layers' RoPE, from ``rope_parameters`` per layer type or from the
    legacy fields (``rope_scaling`` applies to the full layers only, as in transformers)."""
    params = text.data.get("rope_parameters")
    specs: dict[AttentionKind, RopeSpec] = {}
    legacy = {
        "full": {
            **(text.data.get("rope_scaling") or {}),
            "rope_theta": text.optional("rope_theta", THETA["full"], float),
        },
        "sliding": {"rope_theta": text.optional("rope_local_base_freq", THETA["sliding"], float)},
    }
    for layer_type, kind in LAYER_TYPE_NAMES.items():
        entry: Any = legacy[kind]
        origin = text.origin
        if isinstance(params, Mapping) and layer_type in params:
            entry, origin = params[layer_type], f"{text.origin} rope_parameters['{layer_type}']"
        elif params is not None and not isinstance(params, Mapping):
            raise SpecError(f"{text.origin}: 'rope_parameters' must be an object, got {params!r}")
        if not isinstance(entry, Mapping):
            raise SpecError(f"{origin} must be an object, got {entry!r}")
        entry = dict(entry)
        if entry.get("rope_type", entry.get("type")) in ("llama3", "yarn"):
            entry.setdefault(
                "original_max_position_embeddings",
                text.optional("max_position_embeddings", 131_072, least=2),
            )
        specs[kind] = read_rope(entry, origin, RopeSpec("default", THETA[kind]), ROPE_TYPES)
    return specs
