"""Llama 3.x, Mistral, Qwen2 / Qwen2.5, Qwen3, SmolLM3 and Phi-3: pre-norm decoders of one
layer shape, text only, as one family record (their differences are data: :mod:`.config`)."""

from __future__ import annotations

from engine.models.decoder import CausalDecoder
from engine.models.family import Family, Session, decoder_ignorable, text_decoder_session
from engine.models.llama.config import MODEL_TYPES, read_spec
from engine.options import ExportOptions
from engine.spec import ModelSpec


def sessions(spec: ModelSpec, options: ExportOptions, max_length: int) -> tuple[Session, ...]:
    """One decoder session (``model.onnx``) that takes ``input_ids``."""
    decoder = CausalDecoder(spec, max_length, options=options)
    refusal = f"a {spec.model_type} model has no {{towers}} tower (it has: text)"
    return text_decoder_session(spec, options, decoder, refusal)


FAMILY = Family(
    name="llama",
    model_types=MODEL_TYPES,
    read_spec=read_spec,
    sessions=sessions,
    ignorable=decoder_ignorable,
)
