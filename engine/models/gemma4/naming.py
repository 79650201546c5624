"""Checkpoint tensors a Gemma 4 export may leave unread."""

from __future__ import annotations

from engine.options import ExportOptions
from engine.spec import ModelSpec

# KV projections of KV-shared layers (transformers never uses them either).
_SHARED_KV_TENSORS = (
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.k_norm.weight",
    "self_attn.v_norm.weight",
)
TOWER_PREFIXES = {
    "vision": ("model.vision_tower.", "model.embed_vision."),
    "audio": ("model.audio_tower.", "model.embed_audio."),
}
"""Checkpoint prefixes of each multimodal tower."""
_OTHER_TOWERS = ("model.multi_modal_projector.",)


def ignorable(spec: ModelSpec, options: ExportOptions, key: str) -> bool:
    """True for checkpoint keys the export does not need: towers left out, the LM head
    when tied, KV projections of KV-shared layers."""
    exported = set(exported_modalities(spec, options))
    for modality, prefixes in TOWER_PREFIXES.items():
        if modality not in exported and key.startswith(prefixes):
            return True
    if key.startswith(_OTHER_TOWERS):
        return True
    if spec.tie_word_embeddings and key == "lm_head.weight":
        return True
    prefix = spec.weight_prefix + "layers."
    if key.startswith(prefix):
        index_text, _, tail = key[len(prefix) :].partition(".")
        if index_text.isdigit() and int(index_text) < spec.num_layers:
            layer = spec.layers[int(index_text)]
            if not layer.owns_kv:
                return tail in _SHARED_KV_TENSORS
            if layer.k_eq_v:
                return tail == "self_attn.v_proj.weight"
    return False


def exported_modalities(spec: ModelSpec, options: ExportOptions) -> tuple[str, ...]:
    """The modalities the package will have: text, plus the towers the checkpoint has
    that the options ask for (all of them by default)."""
    available = ["text", *spec.towers]
    wanted = options.modalities
    if wanted is None:
        return tuple(available)
    return tuple(m for m in available if m in wanted)
