"""Reading a Hugging Face ``config.json`` into a :class:`~engine.spec.ModelSpec`.

The raw JSON is parsed here rather than through transformers' config classes, whose
fields move between releases (``global_head_dim`` became ``per_layer_config`` in 5.15)
and which would pull torch into every import. Both formats, and the multimodal
``gemma4`` nesting under ``text_config``, are read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import SpecError, option
from engine.hf_towers import audio_spec, multimodal_tokens, vision_spec
from engine.spec import AttentionKind, LayerSpec, ModelSpec, MoeSpec, RopeSpec

SUPPORTED_MODEL_TYPES = ("gemma4_text", "gemma4")
SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu")
_LAYER_TYPE_NAMES: dict[str, AttentionKind] = {
    "sliding_attention": "sliding",
    "full_attention": "full",
}


class _Fields:
    """Typed access to a config dict that names the file and field in every error."""

    def __init__(self, data: Mapping[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin

    def required(self, key: str, kind: type = int) -> Any:
        if key not in self.data or self.data[key] is None:
            raise SpecError(f"{self.origin}: required field '{key}' is missing")
        return self._check(key, self.data[key], kind)

    def optional(self, key: str, default: Any, kind: type = int) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        return self._check(key, value, kind)

    def _check(self, key: str, value: Any, kind: type) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, bool):
            raise SpecError(f"{self.origin}: field '{key}' must be an integer, got {value!r}")
        if not isinstance(value, kind):
            raise SpecError(f"{self.origin}: field '{key}' must be {kind.__name__}, got {value!r}")
        if kind is int and isinstance(value, int) and value < 0:
            raise SpecError(f"{self.origin}: field '{key}' must not be negative, got {value}")
        return value


def _rope_specs(text: _Fields) -> dict[AttentionKind, RopeSpec]:
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
    for layer_type, kind in _LAYER_TYPE_NAMES.items():
        entry = params.get(layer_type)
        if entry is None:
            continue
        rope_type = entry.get("rope_type", "default")
        if rope_type not in ("default", "proportional"):
            raise SpecError(
                f"{text.origin}: rope_type '{rope_type}' of {layer_type} is not supported "
                "(supported: default, proportional)"
            )
        specs[kind] = RopeSpec(
            kind=rope_type,
            theta=float(entry.get("rope_theta", defaults[kind].theta)),
            partial_rotary_factor=float(entry.get("partial_rotary_factor", 1.0)),
            factor=float(entry.get("factor", 1.0)),
        )
    return specs


def _layer_types(text: _Fields, num_layers: int) -> list[AttentionKind]:
    raw = text.data.get("layer_types")
    if raw is None:
        # transformers' default: five sliding layers, then one full layer.
        names = [
            "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)
        ]
    else:
        names = list(raw)
    if len(names) != num_layers:
        raise SpecError(
            f"{text.origin}: 'layer_types' has {len(names)} entries "
            f"but num_hidden_layers is {num_layers}"
        )
    unknown = sorted({n for n in names if n not in _LAYER_TYPE_NAMES})
    if unknown:
        raise SpecError(
            f"{text.origin}: unknown layer types {unknown} "
            "(expected sliding_attention or full_attention)"
        )
    # transformers forces the last layer to full attention.
    names[-1] = "full_attention"
    return [_LAYER_TYPE_NAMES[n] for n in names]


def _per_layer_overrides(
    text: _Fields, kinds: list[AttentionKind], k_eq_v: bool
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
            clean = {
                k: int(v) for k, v in values.items() if k in ("head_dim", "num_key_value_heads")
            }
            if str(key) in _LAYER_TYPE_NAMES:
                targets = [i for i, k in enumerate(kinds) if k == _LAYER_TYPE_NAMES[str(key)]]
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
    global_head_dim = text.optional("global_head_dim", 512)
    global_kv_heads = text.optional("num_global_key_value_heads", None)
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


def _moe_spec(text: _Fields) -> MoeSpec | None:
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


def _token_ids(*sources: _Fields) -> tuple[int | None, tuple[int, ...], int | None]:
    def first(key: str) -> Any:
        for src in sources:
            if src.data.get(key) is not None:
                return src.data[key]
        return None

    bos = first("bos_token_id")
    eos = first("eos_token_id")
    pad = first("pad_token_id")
    eos_ids = tuple(
        int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])
    )
    return (
        int(bos) if bos is not None else None,
        eos_ids,
        int(pad) if pad is not None else None,
    )


def spec_from_config(
    config: Mapping[str, Any], name: str = "model", origin: str = "config.json"
) -> ModelSpec:
    """Read a Hugging Face Gemma 4 config (text-only or multimodal) into a :class:`ModelSpec`."""
    top = _Fields(config, origin)
    model_type = config.get("model_type")
    if model_type is None:
        raise SpecError(f"{origin}: required field 'model_type' is missing")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SpecError(
            f"{origin}: model type '{model_type}' is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if model_type == "gemma4":
        text_raw = config.get("text_config")
        if not isinstance(text_raw, Mapping):
            raise SpecError(f"{origin}: a 'gemma4' config needs a 'text_config' object")
        text = _Fields(text_raw, f"{origin} (text_config)")
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
    activation = text.optional("hidden_activation", "gelu_pytorch_tanh", str)
    if activation not in SUPPORTED_ACTIVATIONS:
        raise SpecError(
            f"{text.origin}: hidden_activation '{activation}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ACTIVATIONS)})"
        )

    num_layers = text.required("num_hidden_layers")
    if num_layers < 1:
        raise SpecError(f"{text.origin}: num_hidden_layers must be at least 1")
    hidden = text.required("hidden_size")
    num_heads = text.required("num_attention_heads")
    num_kv_heads = text.required("num_key_value_heads")
    head_dim = text.required("head_dim")
    intermediate = text.required("intermediate_size")
    vocab = text.required("vocab_size")
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
    # A multimodal checkpoint's top level says how generation ends (an -it model stops at
    # <turn|> too); its text_config keeps the text model's own ids.
    bos, eos, pad = _token_ids(top, text) if model_type == "gemma4" else _token_ids(text, top)
    softcap = text.optional("final_logit_softcapping", None, float)
    tie = bool(config.get("tie_word_embeddings", text.optional("tie_word_embeddings", True, bool)))
    dtype = (
        text.data.get("dtype")
        or text.data.get("torch_dtype")
        or config.get("dtype")
        or config.get("torch_dtype")
        or "float32"
    )
    return ModelSpec(
        name=name,
        model_type=text_type,
        source_model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        num_attention_heads=num_heads,
        layers=tuple(layers),
        rope=_rope_specs(text),
        sliding_window=text.optional("sliding_window", 512),
        max_position_embeddings=text.optional("max_position_embeddings", 131_072),
        rms_norm_eps=text.optional("rms_norm_eps", 1e-6, float),
        hidden_activation=activation,
        final_logit_softcapping=softcap if softcap else None,
        tie_word_embeddings=tie,
        ple_dim=ple_dim,
        ple_vocab_size=text.optional("vocab_size_per_layer_input", vocab) if ple_dim else 0,
        bos_token_id=bos,
        eos_token_ids=eos,
        pad_token_id=pad,
        weight_prefix=prefix,
        source_dtype=str(dtype),
        bidirectional_images=text.data.get("use_bidirectional_attention") == "vision",
        vision=vision_spec(config, origin) if model_type == "gemma4" else None,
        audio=audio_spec(config, origin) if model_type == "gemma4" else None,
        tokens=multimodal_tokens(config, origin) if model_type == "gemma4" else None,
        raw=dict(config),
    )


def load_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``config.json`` from a checkpoint folder, with errors that say what to fix."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise SpecError(f"model folder '{folder}' does not exist or is not a folder")
    path = folder / "config.json"
    if not path.is_file():
        raise SpecError(
            f"'{folder}' has no config.json; point {option('model')} at a Hugging Face "
            "checkpoint folder"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a JSON object at the top level")
    return data


def load_spec(model_dir: str | os.PathLike[str]) -> ModelSpec:
    """Read a checkpoint folder's ``config.json`` into a :class:`ModelSpec`."""
    folder = Path(model_dir)
    config = load_config(folder)
    return spec_from_config(config, name=folder.name, origin=str(folder / "config.json"))
