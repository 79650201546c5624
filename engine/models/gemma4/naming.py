"""Checkpoint tensors a Gemma 4 export may leave unread."""

from __future__ import annotations

from engine.errors import OptionsError, option
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


EXPORTABLE_TOWERS: tuple[str, ...] = ("vision", "audio")
"""Towers the engine can export; a checkpoint's other towers are left out (and named by
the error when a user asks for them)."""


def exported_modalities(spec: ModelSpec, options: ExportOptions) -> tuple[str, ...]:
    """The modalities the package will have: text, plus the towers the checkpoint has
    that the options ask for (every exportable one by default)."""
    wanted = options.modalities
    exportable = EXPORTABLE_TOWERS
    if spec.bidirectional_images:
        # The decoder would have to find image spans in its ids and let them attend both
        # ways on sliding layers; without that, image prompts would be silently wrong.
        exportable = tuple(t for t in exportable if t != "vision")
    if wanted is None:
        return ("text", *(t for t in spec.towers if t in exportable))
    if "vision" in wanted and spec.bidirectional_images:
        raise OptionsError(
            "this model's image tokens attend to each other both ways "
            "(use_bidirectional_attention: vision), which the exported decoder does not do "
            f"yet; leave vision out of {option('modalities')} for a text package"
        )
    missing = [m for m in wanted if m != "text" and m not in spec.towers]
    if missing:
        have = ", ".join(["text", *spec.towers])
        raise OptionsError(
            f"the model has no {' or '.join(missing)} tower (it has: {have}); "
            f"choose {option('modalities')} among those"
        )
    unsupported = [m for m in wanted if m != "text" and m not in EXPORTABLE_TOWERS]
    if unsupported:
        raise OptionsError(
            f"exporting the {' and '.join(unsupported)} tower is not supported yet; "
            f"leave it out of {option('modalities')}"
        )
    chosen = ("text", *(t for t in spec.towers if t in wanted))
    if "audio" in chosen and "vision" not in chosen:
        # Measured on the 0.18 wheel: without a vision session the gemma4 pipeline tries
        # to load the package folder as a model ("model path is a directory").
        raise OptionsError(
            "onnxruntime-genai 0.18 runs a Gemma 4 audio session only beside a vision "
            f"session; add vision to {option('modalities')} or leave audio out"
        )
    return chosen
