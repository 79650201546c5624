"""One rotary embedding's ``rope_parameters`` (transformers' format: ``rope_type``,
``rope_theta`` and the type's own fields), read for any family into a :class:`RopeSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from engine.config_fields import ConfigFields
from engine.errors import SpecError
from engine.spec import ROPE_KINDS, RopeKind, RopeSpec

NOT_LOWERED = {
    "dynamic": "its frequencies change with the sequence length, which a static cache cannot",
}
"""transformers' rope types this engine does not export, and why."""


def read_rope(
    entry: Mapping[str, Any],
    origin: str,
    default: RopeSpec,
    kinds: tuple[RopeKind, ...],
    *,
    partial: bool = False,
) -> RopeSpec:
    """The rotary embedding ``entry`` describes; fields it leaves out keep ``default``'s.

    ``kinds``: the rope types the family's graphs lower. ``partial``: the family's layers
    take a ``partial_rotary_factor`` below 1 on kinds other than proportional (their q/k
    rows are reordered; not with q/k norms, whose scales would need it too). Every number
    is checked, and a type the family does not take is refused with the reason.

    Raises:
        SpecError: An unknown or unsupported ``rope_type``, or a field out of range.
    """
    fields = ConfigFields(entry, origin)
    rope_type = fields.optional("rope_type", entry.get("type", "default"), str)
    if rope_type not in kinds:
        why = NOT_LOWERED.get(rope_type) or (
            "this family does not take it" if rope_type in ROPE_KINDS else "unknown"
        )
        raise SpecError(
            f"{origin}: rope_type '{rope_type}' is not supported ({why}; supported: "
            f"{', '.join(kinds)})"
        )
    kind = cast(RopeKind, rope_type)
    spec = replace(
        default,
        kind=kind,
        theta=_positive(fields, "rope_theta", default.theta),
        partial_rotary_factor=fields.optional("partial_rotary_factor", 1.0, float),
        factor=_positive(fields, "factor", default.factor),
    )
    if not 0 < spec.partial_rotary_factor <= 1:
        raise fields.error(
            "partial_rotary_factor", f"must be in (0, 1], got {spec.partial_rotary_factor}"
        )
    if spec.partial_rotary_factor < 1 and kind != "proportional" and not partial:
        raise fields.error(
            "partial_rotary_factor",
            f"is {spec.partial_rotary_factor}: rotating part of each head is not exported for "
            f"this family's {kind} RoPE",
        )
    if kind in ("llama3", "yarn", "longrope"):
        original = fields.required("original_max_position_embeddings", least=1)
        spec = replace(spec, original_max_position_embeddings=original)
    if kind == "llama3":
        low = _positive(fields, "low_freq_factor", default.low_freq_factor)
        high = _positive(fields, "high_freq_factor", default.high_freq_factor)
        if high <= low:
            raise fields.error("high_freq_factor", f"must exceed low_freq_factor ({low})")
        spec = replace(spec, low_freq_factor=low, high_freq_factor=high)
    if kind == "yarn":
        if entry.get("mscale") or entry.get("mscale_all_dim"):
            raise SpecError(f"{origin}: yarn's mscale / mscale_all_dim are not supported yet")
        attention = fields.optional("attention_factor", None, float)
        spec = replace(
            spec,
            beta_fast=_positive(fields, "beta_fast", default.beta_fast),
            beta_slow=_positive(fields, "beta_slow", default.beta_slow),
            truncate=fields.optional("truncate", True, bool),
            attention_factor=attention,
        )
    if kind == "longrope":
        spec = replace(
            spec,
            short_factor=_factors(fields, "short_factor"),
            long_factor=_factors(fields, "long_factor"),
            attention_factor=fields.optional("attention_factor", None, float),
        )
    return spec


def check_head(rope: RopeSpec, head_dim: int, origin: str) -> None:
    """Refuse a rotary embedding that does not fit heads of ``head_dim``: an odd number of
    rotated channels, or longrope factors of another length than the rotated pairs."""
    dim = rope.rotary_dim(head_dim)
    if dim % 2 or dim < 2:
        raise SpecError(
            f"{origin}: partial_rotary_factor {rope.partial_rotary_factor} rotates {dim} of "
            f"head_dim {head_dim} channels; RoPE needs an even number of at least 2"
        )
    for key, factors in (("short_factor", rope.short_factor), ("long_factor", rope.long_factor)):
        if rope.kind == "longrope" and len(factors) != dim // 2:
            raise SpecError(
                f"{origin}: {key} has {len(factors)} values; head_dim {head_dim} with "
                f"partial_rotary_factor {rope.partial_rotary_factor} rotates {dim // 2} "
                "frequency pairs, one factor each"
            )


def _factors(fields: ConfigFields, key: str) -> tuple[float, ...]:
    """longrope's list of per-frequency divisors: positive numbers."""
    raw = fields.data.get(key)
    if not isinstance(raw, list) or not raw:
        raise fields.error(key, f"must be a list of numbers (one per rotated pair), got {raw!r}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in raw):
        raise fields.error(key, "must hold positive numbers only")
    return tuple(float(v) for v in raw)


def _positive(fields: ConfigFields, key: str, default: float) -> float:
    value = float(fields.optional(key, default, float))
    if value <= 0:
        raise fields.error(key, f"must be positive, got {value}")
    return value
