"""Gemma 3: the text decoder of Gemma 3 checkpoints (``gemma3_text``: 270M, 1B; ``gemma3``:
the 4B, 12B and 27B, whose vision tower is not exported), as one family record. Its layer is
Gemma 4's (:class:`engine.models.gemma4.text.TextDecoder` without per-layer inputs and layer
scalars); its norms read ``1 + w`` from the checkpoint (``config.NORM_OFFSET``)."""

from __future__ import annotations

from dataclasses import replace

from engine.graph.modules import Param
from engine.models.family import Family, Session, decoder_ignorable, text_decoder_session
from engine.models.gemma3.config import MODEL_TYPES, NORM_OFFSET, read_spec
from engine.models.gemma4.text import TextDecoder
from engine.options import ExportOptions
from engine.spec import ModelSpec


def sessions(spec: ModelSpec, options: ExportOptions, max_length: int) -> tuple[Session, ...]:
    """One decoder session (``model.onnx``) that takes ``input_ids``."""
    decoder = TextDecoder(spec, max_length, options=options, layer_scalar=False)
    decoder.map_params(_offset_norm)
    refusal = "only Gemma 3's text decoder is exported (not its {towers} tower)"
    return text_decoder_session(spec, options, decoder, refusal)


def _offset_norm(param: Param) -> Param:
    """A norm scale read as ``1 + w`` (parts of a fused per-head table, each)."""
    if param.role != "norm":
        return param
    if param.parts:
        parts = tuple(
            replace(p, offset=NORM_OFFSET) if p.source is not None else p for p in param.parts
        )
        return replace(param, parts=parts)
    return replace(param, offset=NORM_OFFSET)


_UNUSED = ("vision_tower.", "multi_modal_projector.")
"""A multimodal checkpoint's tower and projector (not exported)."""


def ignorable(spec: ModelSpec, options: ExportOptions, key: str) -> bool:
    """A text decoder's (:func:`decoder_ignorable`), and a multimodal checkpoint's vision
    tower."""
    return decoder_ignorable(spec, options, key) or key.startswith(_UNUSED)


FAMILY = Family(
    name="gemma3",
    model_types=MODEL_TYPES,
    read_spec=read_spec,
    sessions=sessions,
    ignorable=ignorable,
)
