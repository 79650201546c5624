"""Llama 3.x, Mistral, Qwen2 / Qwen2.5, Qwen3, SmolLM3 and Phi-3: pre-norm decoders of one
layer shape, text only, as one family record (their differences are data: :mod:`.config`)."""

from __future__ import annotations

from engine.errors import OptionsError, option
from engine.models.decoder import CausalDecoder
from engine.models.family import Family, Session
from engine.models.llama.config import MODEL_TYPES, read_spec
from engine.options import ExportOptions
from engine.spec import ModelSpec


def sessions(spec: ModelSpec, options: ExportOptions, max_length: int) -> tuple[Session, ...]:
    """One decoder session (``model.onnx``) that takes ``input_ids``."""
    towers = [m for m in options.modalities or () if m != "text"]
    if towers:
        raise OptionsError(
            f"a {spec.model_type} model has no {' or '.join(towers)} tower (it has: text); "
            f"leave {option('modalities')} out or choose text"
        )
    ties = {"lm_head.weight": "embed_tokens.weight"} if spec.tie_word_embeddings else {}
    decoder = CausalDecoder(spec, max_length, options=options)
    decoder.bind(source=spec.weight_prefix)
    return (Session("decoder", "model.onnx", decoder, ties),)


_UNUSED_SUFFIXES = (".rotary_emb.inv_freq",)
"""Buffers older checkpoints saved that the export computes instead."""


def ignorable(spec: ModelSpec, options: ExportOptions, key: str) -> bool:
    """The LM head of a tied checkpoint, and RoPE buffers some checkpoints carry."""
    if spec.tie_word_embeddings and key == "lm_head.weight":
        return True
    return key.endswith(_UNUSED_SUFFIXES)


FAMILY = Family(
    name="llama",
    model_types=MODEL_TYPES,
    read_spec=read_spec,
    sessions=sessions,
    ignorable=ignorable,
)
