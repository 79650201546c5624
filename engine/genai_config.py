"""genai_config.json for onnxruntime-genai: written per package, per session.

onnxruntime-genai rejects unknown keys, so only keys it reads are written. Graph capture
is set per session from what that session's graph can do (the seed's generator turned
it on for every session and left users to edit the file by hand).
"""

from __future__ import annotations

from typing import Any

from engine.plan_model import ExportPlan
from engine.processors import (
    AUDIO_CONFIG_FILE,
    IMAGE_CONFIG_FILE,
    AudioProcessing,
    ImageProcessing,
)

DEFAULT_SHARED_MAX_LENGTH = 4096
"""search.max_length when past/present share a preallocated buffer and the user gave no
length: every KV layer holds [batch, kv_heads, max_length, head_dim] from the start."""


def search_max_length(plan: ExportPlan, share_buffer: bool) -> int:
    if plan.options.max_length is not None or not share_buffer:
        return plan.context_length
    return min(plan.context_length, DEFAULT_SHARED_MAX_LENGTH)


def provider_options(plan: ExportPlan, capture: bool) -> list[dict[str, dict[str, str]]]:
    """``session_options.provider_options`` for one session."""
    caps = plan.caps
    if caps.genai_provider is None:
        return []
    options = dict(caps.provider_options)
    if caps.capture_option is not None:
        options[caps.capture_option] = "1" if capture else "0"
    return [{caps.genai_provider: options}]


def make_genai_config(
    plan: ExportPlan, *, capture: dict[str, bool], share_buffer: bool
) -> dict[str, Any]:
    """The whole genai_config.json of a package; ``capture`` is decided per session."""
    spec = plan.spec
    kv_layers = spec.kv_layers
    first = kv_layers[0]
    eos: int | list[int] = (
        list(spec.eos_token_ids) if len(spec.eos_token_ids) != 1 else spec.eos_token_ids[0]
    )
    names = [s.name for s in plan.sessions]
    multimodal = "embedding" in names
    decoder_inputs = (
        {"inputs_embeds": "inputs_embeds"} if multimodal else {"input_ids": "input_ids"}
    )
    if multimodal and spec.has_ple:
        decoder_inputs["per_layer_inputs"] = "per_layer_inputs"
    decoder: dict[str, Any] = {
        **_session(plan, "decoder", capture),
        # KV shapes are read per layer from the model's inputs (they are static there);
        # these describe the first cache layer for tools that want one number.
        "head_size": first.head_dim,
        "hidden_size": spec.hidden_size,
        "inputs": {
            **decoder_inputs,
            "attention_mask": "attention_mask",
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": len(kv_layers),
        "num_key_value_heads": first.num_kv_heads,
    }
    model: dict[str, Any] = {
        "bos_token_id": spec.bos_token_id if spec.bos_token_id is not None else 0,
        "context_length": plan.context_length,
        "decoder": decoder,
        "eos_token_id": eos,
        "pad_token_id": spec.pad_token_id if spec.pad_token_id is not None else 0,
        "type": "gemma4" if multimodal else spec.model_type,
        "vocab_size": spec.vocab_size,
    }
    if multimodal:
        model.update(_multimodal_sections(plan, capture, spec.has_ple))
    search = {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": search_max_length(plan, share_buffer),
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": share_buffer,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 1.0,
    }
    return {"model": model, "search": search}


def _session(plan: ExportPlan, name: str, capture: dict[str, bool]) -> dict[str, Any]:
    """``filename`` and ``session_options`` of one session, capture decided per session."""
    return {
        "session_options": {
            "log_id": "onnxruntime-genai",
            "provider_options": provider_options(plan, capture.get(name, False)),
        },
        "filename": plan.session(name).filename,
    }


def _multimodal_sections(
    plan: ExportPlan, capture: dict[str, bool], per_layer: bool
) -> dict[str, Any]:
    """The ``embedding``, ``vision`` and ``speech`` sections of a ``gemma4`` package."""
    names = {s.name for s in plan.sessions}
    embedding_inputs = {"input_ids": "input_ids"}
    if "vision" in names:
        embedding_inputs["image_features"] = "image_features"
    if "speech" in names:
        embedding_inputs["audio_features"] = "audio_features"
    embedding_outputs = {"inputs_embeds": "inputs_embeds"}
    if per_layer:
        embedding_outputs["per_layer_inputs"] = "per_layer_inputs"
    sections: dict[str, Any] = {
        "embedding": {
            **_session(plan, "embedding", capture),
            "inputs": embedding_inputs,
            "outputs": embedding_outputs,
        }
    }
    if "vision" in names:
        sections["vision"] = {
            **_session(plan, "vision", capture),
            "config_filename": IMAGE_CONFIG_FILE,
            "inputs": {"pixel_values": "pixel_values", "pixel_position_ids": "pixel_position_ids"},
            "outputs": {"image_features": "image_features"},
        }
    if "speech" in names:
        sections["speech"] = {
            **_session(plan, "speech", capture),
            "config_filename": AUDIO_CONFIG_FILE,
            "inputs": {
                "audio_embeds": "input_features",
                "attention_mask": "input_features_mask",
            },
            "outputs": {"audio_features": "audio_features"},
        }
    else:
        # genai 0.18 looks for an audio processor unless told there is none.
        sections["speech"] = {"config_filename": ""}
    return sections


def processor_files(
    plan: ExportPlan, image: ImageProcessing, audio: AudioProcessing
) -> dict[str, dict[str, Any]]:
    """File name -> JSON of the processor configs the package's sessions need."""
    names = {s.name for s in plan.sessions}
    files = {}
    if "vision" in names:
        files[IMAGE_CONFIG_FILE] = image.genai_json()
    if "speech" in names:
        files[AUDIO_CONFIG_FILE] = audio.genai_json()
    return files
