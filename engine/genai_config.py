"""genai_config.json for onnxruntime-genai: written per package, per session.

onnxruntime-genai rejects unknown keys, so only keys it reads are written. Graph capture
is set per session from what that session's graph can do (the seed's generator turned
it on for every session and left users to edit the file by hand).
"""

from __future__ import annotations

from typing import Any

from engine.plan_model import ExportPlan

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
    decoder: dict[str, Any] = {
        "session_options": {
            "log_id": "onnxruntime-genai",
            "provider_options": provider_options(plan, capture.get("decoder", False)),
        },
        "filename": plan.decoder.filename,
        # KV shapes are read per layer from the model's inputs (they are static there);
        # these describe the first cache layer for tools that want one number.
        "head_size": first.head_dim,
        "hidden_size": spec.hidden_size,
        "inputs": {
            "input_ids": "input_ids",
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
        "type": spec.model_type,
        "vocab_size": spec.vocab_size,
    }
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
