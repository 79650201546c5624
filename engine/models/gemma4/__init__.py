"""Gemma 4: text decoder (E2B, E4B, 26B-A4B, 31B), and the multimodal towers of ``gemma4``
checkpoints, as one family record."""

from __future__ import annotations

from engine.models.family import Family, Session
from engine.models.gemma4.config import MODEL_TYPES, read_spec
from engine.models.gemma4.embedding import EmbeddingSession
from engine.models.gemma4.naming import exported_modalities, ignorable
from engine.models.gemma4.text import TextDecoder
from engine.options import ExportOptions
from engine.spec import ModelSpec


def sessions(spec: ModelSpec, options: ExportOptions, max_length: int) -> tuple[Session, ...]:
    """A text package has one decoder session; a multimodal one adds embedding, vision and
    speech sessions around a decoder that takes embeddings."""
    ties = {"lm_head.weight": "embed_tokens.weight"} if spec.tie_word_embeddings else {}
    modalities = exported_modalities(spec, options)
    if modalities == ("text",):
        decoder = TextDecoder(spec, max_length, options=options)
        decoder.bind(source=spec.weight_prefix)
        return (Session("decoder", "model.onnx", decoder, ties),)
    out = []
    if "vision" in modalities:
        from engine.models.gemma4.vision import VisionTower

        tower = VisionTower(spec).bind(source="model.")
        out.append(Session("vision", "vision.onnx", tower, never_captured=_PER_IMAGE))
    if "audio" in modalities:
        from engine.models.gemma4.audio import AudioTower

        tower = AudioTower(spec).bind(source="model.")
        out.append(Session("speech", "speech.onnx", tower, never_captured=_PER_CLIP))
    embedding = EmbeddingSession(spec, modalities).bind(source=spec.weight_prefix)
    decoder = TextDecoder(spec, max_length, embeds_in=True, options=options)
    decoder.bind(source=spec.weight_prefix)
    out += [
        Session("embedding", "embedding.onnx", embedding, never_captured=_PER_STEP),
        Session("decoder", "decoder.onnx", decoder, ties),
    ]
    return tuple(out)


_PER_IMAGE = "its input shapes follow each image's size (patches, tokens)"
_PER_CLIP = "its input shapes follow each clip's length"
_PER_STEP = (
    "its input shapes change between the prompt step (all tokens, the features) "
    "and the decode steps (one token, no features)"
)


FAMILY = Family(
    name="gemma4",
    model_types=MODEL_TYPES,
    read_spec=read_spec,
    sessions=sessions,
    ignorable=ignorable,
)
