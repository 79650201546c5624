"""The record a model family fills in: how to read its config, and its sessions.

A family is chosen by the checkpoint's ``model_type``. Each session is a bound weight tree
(:mod:`engine.graph.modules`) whose ``build`` method lays out the session's graph; the
planner walks the same tree for sizes, so a weight's name is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.errors import OptionsError, option
from engine.graph.context import BuildContext
from engine.graph.modules import Module, logical_weights
from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.spec import ModelSpec


class SessionRoot(Protocol):
    """A session's bound weight tree that can lay out its graph."""

    def build(self, ctx: BuildContext) -> None: ...


@dataclass(frozen=True)
class Session:
    """One ONNX file of a package, as the family defines it."""

    name: str
    """The genai_config section: ``decoder``, ``embedding``, ``vision`` or ``speech``."""
    filename: str
    root: Module
    ties: Mapping[str, str] = field(default_factory=dict)
    """Weight name -> the weight whose bytes it reuses (a tied LM head)."""
    never_captured: str | None = None
    """Why graph capture can never replay this session (its input shapes change between
    runs); None for a session that runs with fixed shapes (the decoder)."""

    def weights(self) -> list[LogicalWeight]:
        return logical_weights(self.root)

    def build(self, ctx: BuildContext) -> None:
        builder: SessionRoot = self.root  # type: ignore[assignment]
        builder.build(ctx)


@dataclass(frozen=True)
class Family:
    """Everything the engine needs to know about one model family."""

    name: str
    model_types: tuple[str, ...]
    read_spec: Callable[[Mapping[str, Any], str, str], ModelSpec]
    """(config dict, model name, origin for messages) -> spec."""
    sessions: Callable[[ModelSpec, ExportOptions, int], tuple[Session, ...]]
    """(spec, resolved options, context length) -> the package's sessions."""
    ignorable: Callable[[ModelSpec, ExportOptions, str], bool]
    """Checkpoint keys an export may leave unread (towers not exported, unused tensors)."""


_ROPE_BUFFERS = (".rotary_emb.inv_freq",)
"""Buffers older checkpoints saved that the export computes instead."""


def decoder_ignorable(spec: ModelSpec, options: ExportOptions, key: str) -> bool:
    """Keys a text decoder's export leaves unread: the LM head of a tied checkpoint, and
    RoPE buffers some checkpoints carry."""
    if spec.tie_word_embeddings and key == "lm_head.weight":
        return True
    return key.endswith(_ROPE_BUFFERS)


def text_decoder_session(
    spec: ModelSpec, options: ExportOptions, decoder: Module, refusal: str
) -> tuple[Session, ...]:
    """The one session of a text-only package: ``decoder`` bound at the spec's prefix, as
    ``model.onnx``, its LM head tied where the spec ties it. Towers asked for in
    ``options.modalities`` are refused: ``refusal`` says why, ``{towers}`` naming them."""
    towers = [m for m in options.modalities or () if m != "text"]
    if towers:
        raise OptionsError(
            refusal.format(towers=" or ".join(towers))
            + f"; leave {option('modalities')} out or choose text"
        )
    ties = {"lm_head.weight": "embed_tokens.weight"} if spec.tie_word_embeddings else {}
    decoder.bind(source=spec.weight_prefix)
    return (Session("decoder", "model.onnx", decoder, ties),)
