"""Which option values can be chosen now, and the options adjusted to them (no Qt).

The target panel offers every value but disables those that cannot work for the current
EP and model, with the reason as the item's tooltip; the state keeps its options inside
what is allowed (:func:`fit_options`) and says in place what it changed. Reasons come from
the EP's capability flags and, for the model, from the engine itself: inputs (towers) are
allowed exactly when the model's family lays their sessions out, block sizes exactly when a
plan with them succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.wording import BLOCK_SIZES, CONTROLS, render
from engine.caps import EpCapabilities, get_caps, list_eps
from engine.errors import OptionsError
from engine.options import ExportOptions

if TYPE_CHECKING:
    from app.source import ModelSource
    from engine.spec import ModelSpec


@dataclass(frozen=True)
class Constraints:
    """Values that cannot be chosen now: option key -> value -> why not."""

    disabled: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)

    def reason(self, key: str, value: Any) -> str | None:
        """Why ``value`` cannot be chosen for ``key``, or None when it can."""
        return self.disabled.get(key, {}).get(value)

    def merged(self, other: Constraints) -> Constraints:
        keys = set(self.disabled) | set(other.disabled)
        return Constraints(
            {k: {**self.disabled.get(k, {}), **other.disabled.get(k, {})} for k in keys}
        )


def ep_constraints(caps: EpCapabilities) -> Constraints:
    """What the EP itself cannot do (its capability flags)."""
    name = caps.display_name
    disabled: dict[str, dict[Any, str]] = {}
    others = {d for ep in list_eps() for d in get_caps(ep).float_dtypes} - {*caps.float_dtypes}
    if others:  # an explicit dtype survives a change of EP where the new one runs it
        runs = f"{name} runs {' or '.join(caps.float_dtypes)} activations"
        disabled["dtype"] = dict.fromkeys(sorted(others), runs)
    if not caps.graph_capture:
        disabled["graph_capture"] = {"on": f"{name} has no graph capture"}
    if not caps.supports("MatMulNBits"):
        reason = f"{name} has no MatMulNBits: weights stay float"
        disabled["weight_bits"] = {4: reason, 8: reason}
    if not caps.supports("GatherBlockQuantized"):
        reason = f"{name} has no GatherBlockQuantized: embedding tables stay float"
        disabled["embedding_bits"] = {4: reason, 8: reason}
    if not caps.supports("GroupQueryAttention"):
        disabled["attention"] = {"gqa": f"{name} has no GroupQueryAttention"}
    return Constraints(disabled)


def source_constraints(is_preset: bool) -> Constraints:
    """What the model source rules out: GPTQ and AWQ calibrate on a checkpoint's own
    weights, which a preset (architecture only) does not have."""
    if not is_preset:
        return Constraints()
    reason = "calibration runs the checkpoint's own weights; a preset has none"
    return Constraints({"quant_method": dict.fromkeys(("gptq", "awq", "awq-gptq"), reason)})


def model_constraints(spec: ModelSpec, options: ExportOptions) -> Constraints:
    """What the model itself rules out, with the engine's reason: the inputs (towers) it does
    not have, and the block sizes its dimensions do not allow."""
    return modality_constraints(spec).merged(fitting_block_sizes(spec, options))


def modality_constraints(spec: ModelSpec) -> Constraints:
    """Input choices (towers) this model cannot export, as the engine's family says: each
    choice's sessions are laid out (no planning, milliseconds)."""
    from engine.models import sessions_for

    disabled: dict[Any, str] = {}
    for _, value in CONTROLS["modalities"].choices:
        if value is None:
            continue
        try:
            sessions_for(spec, ExportOptions(modalities=value).resolve(), 1)
        except OptionsError as exc:
            disabled[value] = render(exc.raw)
    return Constraints({"modalities": disabled})


def fitting_block_sizes(spec: ModelSpec, options: ExportOptions) -> Constraints:
    """Block sizes the model's dimensions do not allow, with the planner's reason.

    Each size is tried with the engine's planner for the EP, buffer limit and inputs
    (towers) chosen: the EP decides what its quantized kernels read (WebGPU's 4-bit
    embedding rows need an even block count) and the limit how tables are split. Weights and
    embeddings are tried separately. A failing size stops at its first unfit weight; the
    others plan whole.
    """
    from engine.plan import plan

    if options.weight_bits is None and options.embedding_bits is None:
        return Constraints()
    base = ExportOptions(
        ep=options.ep, max_buffer_size=options.max_buffer_size, modalities=options.modalities
    )
    try:
        plan(spec, base)
    except OptionsError:
        return Constraints()  # the model fails for another reason; the preview says which
    disabled: dict[str, dict[Any, str]] = {}
    trials = (
        ("block_size", options.weight_bits, None),
        ("embedding_block_size", None, options.embedding_bits),
    )
    for key, weight_bits, embedding_bits in trials:
        if weight_bits is None and embedding_bits is None:
            continue
        for size in BLOCK_SIZES:
            trial = replace(
                base,
                weight_bits=weight_bits,
                embedding_bits=embedding_bits,
                block_size=size,
                embedding_block_size=size,
                quantize_lm_head=options.quantize_lm_head,
                symmetric=options.symmetric,
            )
            try:
                plan(spec, trial)
            except OptionsError as exc:
                disabled.setdefault(key, {})[size] = render(exc.raw)
    return Constraints(disabled)


def constraints_key(source: ModelSource, options: ExportOptions) -> tuple[Any, ...]:
    """What :func:`model_constraints` depends on (its cache key)."""
    return (
        source,
        options.ep,
        options.max_buffer_size,
        options.weight_bits,
        options.embedding_bits,
        options.quantize_lm_head,
        options.symmetric,
        options.modalities,
    )


def fit_options(
    options: ExportOptions, constraints: Constraints
) -> tuple[ExportOptions, list[str]]:
    """``options`` moved onto allowed values; returns them and a note per change."""
    notes: list[str] = []
    changes: dict[str, Any] = {}
    for key in (
        "dtype",
        "graph_capture",
        "weight_bits",
        "embedding_bits",
        "attention",
        "modalities",
        "quant_method",
    ):
        value = getattr(options, key)
        reason = constraints.reason(key, value)
        if reason:
            fallback = {"graph_capture": "auto", "attention": "auto", "quant_method": "rtn"}.get(
                key
            )
            changes[key] = fallback
            shown = (
                f"EP default ({get_caps(options.ep).default_dtype})"
                if key == "dtype"
                else CONTROLS[key].choice_text(fallback) or fallback or "float"
            )
            notes.append(f"{_label(key, value)} is not available ({reason}): set to {shown}")
    for key in ("block_size", "embedding_block_size"):
        value = getattr(options, key)
        if key == "embedding_block_size" and options.embedding_bits is not None:
            value = value or options.block_size  # "same as weights" must fit the tables too
        if value is None or not constraints.reason(key, value):
            continue
        allowed = [b for b in BLOCK_SIZES if not constraints.reason(key, b)]
        if not allowed:
            continue  # nothing fits: the plan's own error explains what to do
        below = [b for b in allowed if b < value]
        changes[key] = below[-1] if below else allowed[0]
        notes.append(
            f"{_label(key, value)} does not fit this model ({constraints.reason(key, value)}): "
            f"using {changes[key]}"
        )
    return (replace(options, **changes) if changes else options), notes


def _label(key: str, value: Any) -> str:
    control = CONTROLS[key]
    shown = control.choice_text(value)
    return f"{control.name} {shown if shown is not None else value}"


def default_output(source: ModelSource, options: ExportOptions) -> str:
    """The package folder a model and options get by default, under ~/export-studio:
    model, EP, dtype and bits in its name (``gemma4-e2b-webgpu-fp16-w4-emb4``), and the
    inputs when they are chosen (``...-text`` for the text decoder alone)."""
    caps = get_caps(options.ep)
    name = source.value if source.is_preset else Path(source.value).name or "model"
    parts = [name, caps.name, options.dtype or caps.default_dtype]
    if options.weight_bits:
        parts.append(f"w{options.weight_bits}")
    if options.embedding_bits:
        parts.append(f"emb{options.embedding_bits}")
    if options.modalities is not None:
        parts += options.modalities
    return str(Path.home() / "export-studio" / "-".join(parts))
