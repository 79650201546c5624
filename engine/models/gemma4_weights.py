"""The Gemma 4 text decoder's tensors, by checkpoint name (without the text prefix)."""

from __future__ import annotations

from engine.logical import LogicalWeight
from engine.spec import AttentionKind, ModelSpec

# Checkpoint tensors a text export reads no further: KV projections of KV-shared layers
# (transformers drops them too), and the multimodal towers of `gemma4` checkpoints.
_IGNORED_SHARED = (
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.k_norm.weight",
    "self_attn.v_norm.weight",
)
_IGNORED_PREFIXES = (
    "model.vision_tower.",
    "model.audio_tower.",
    "model.embed_vision.",
    "model.embed_audio.",
    "model.multi_modal_projector.",
)


def logical_weights(spec: ModelSpec) -> list[LogicalWeight]:
    """Every tensor the decoder reads from the checkpoint, in graph order."""
    h = spec.hidden_size
    weights = [
        LogicalWeight("embed_tokens.weight", (spec.vocab_size, h), "embedding", scale=h**0.5),
    ]
    if spec.has_ple:
        fused = spec.num_layers * spec.ple_dim
        weights += [
            LogicalWeight(
                "embed_tokens_per_layer.weight",
                (spec.ple_vocab_size, fused),
                "ple_table",
                scale=spec.ple_dim**0.5,
            ),
            LogicalWeight("per_layer_model_projection.weight", (fused, h), "linear"),
            LogicalWeight("per_layer_projection_norm.weight", (spec.ple_dim,), "norm"),
        ]
    for layer in spec.layers:
        p = f"layers.{layer.index}."
        q_out = spec.num_attention_heads * layer.head_dim
        kv_out = layer.num_kv_heads * layer.head_dim
        weights += [
            LogicalWeight(p + "input_layernorm.weight", (h,), "norm"),
            LogicalWeight(p + "self_attn.q_proj.weight", (q_out, h), "linear"),
            LogicalWeight(p + "self_attn.q_norm.weight", (layer.head_dim,), "norm"),
        ]
        if layer.owns_kv:
            weights.append(LogicalWeight(p + "self_attn.k_proj.weight", (kv_out, h), "linear"))
            if not layer.k_eq_v:
                weights.append(LogicalWeight(p + "self_attn.v_proj.weight", (kv_out, h), "linear"))
            weights.append(LogicalWeight(p + "self_attn.k_norm.weight", (layer.head_dim,), "norm"))
        inter = layer.intermediate_size
        weights += [
            LogicalWeight(p + "self_attn.o_proj.weight", (h, q_out), "linear"),
            LogicalWeight(p + "post_attention_layernorm.weight", (h,), "norm"),
            LogicalWeight(p + "pre_feedforward_layernorm.weight", (h,), "norm"),
            LogicalWeight(p + "mlp.gate_proj.weight", (inter, h), "linear"),
            LogicalWeight(p + "mlp.up_proj.weight", (inter, h), "linear"),
            LogicalWeight(p + "mlp.down_proj.weight", (h, inter), "linear"),
            LogicalWeight(p + "post_feedforward_layernorm.weight", (h,), "norm"),
        ]
        if spec.has_ple:
            weights += [
                LogicalWeight(p + "per_layer_input_gate.weight", (spec.ple_dim, h), "linear"),
                LogicalWeight(p + "per_layer_projection.weight", (h, spec.ple_dim), "linear"),
                LogicalWeight(p + "post_per_layer_input_norm.weight", (h,), "norm"),
            ]
        weights.append(LogicalWeight(p + "layer_scalar", (1,), "scalar"))
    weights.append(LogicalWeight("norm.weight", (h,), "norm"))
    if not spec.tie_word_embeddings:
        weights.append(LogicalWeight("lm_head.weight", (spec.vocab_size, h), "lm_head"))
    return weights


def rope_weights(spec: ModelSpec, max_length: int) -> list[LogicalWeight]:
    """The cos / sin caches, one pair per attention kind present in the model."""
    kinds: list[AttentionKind] = []
    for layer in spec.layers:
        if layer.attention not in kinds:
            kinds.append(layer.attention)
    out = []
    for kind in kinds:
        head_dim = next(layer.head_dim for layer in spec.layers if layer.attention == kind)
        for part in ("cos", "sin"):
            out.append(
                LogicalWeight(
                    f"rope.{kind}.{part}_cache",
                    (max_length, head_dim // 2),
                    "rope_cache",
                    computed=True,
                )
            )
    return out


def checkpoint_name(spec: ModelSpec, name: str) -> str:
    """The tensor's name in the checkpoint files."""
    if name == "lm_head.weight":
        return name
    return spec.weight_prefix + name


def ignorable(spec: ModelSpec, checkpoint_key: str) -> bool:
    """Checkpoint tensors a text-decoder export may leave unread without complaint."""
    if checkpoint_key.startswith(_IGNORED_PREFIXES):
        return True
    if spec.tie_word_embeddings and checkpoint_key == "lm_head.weight":
        return True
    prefix = spec.weight_prefix + "layers."
    if checkpoint_key.startswith(prefix):
        rest = checkpoint_key[len(prefix) :]
        index_text, _, tail = rest.partition(".")
        if index_text.isdigit():
            index = int(index_text)
            if index < spec.num_layers and not spec.layers[index].owns_kv:
                return tail in _IGNORED_SHARED
            if index < spec.num_layers and spec.layers[index].k_eq_v:
                return tail == "self_attn.v_proj.weight"
    return False
