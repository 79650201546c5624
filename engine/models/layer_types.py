"""transformers' ``layer_types`` (``sliding_attention`` / ``full_attention`` per layer),
read the same way for every family into the spec's attention kinds."""

from __future__ import annotations

from typing import Any

from engine.config_fields import ConfigFields
from engine.errors import SpecError
from engine.spec import AttentionKind

LAYER_TYPE_NAMES: dict[str, AttentionKind] = {
    "sliding_attention": "sliding",
    "full_attention": "full",
}


def layer_kinds(fields: ConfigFields, raw: Any, num_layers: int) -> list[AttentionKind]:
    """The attention kind of each layer from a ``layer_types`` list.

    Raises:
        SpecError: Not a list of names, the wrong length, or a type no graph lowers.
    """
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise SpecError(f"{fields.origin}: 'layer_types' must be a list of names, got {raw!r}")
    if len(raw) != num_layers:
        raise SpecError(
            f"{fields.origin}: 'layer_types' has {len(raw)} entries "
            f"but num_hidden_layers is {num_layers}"
        )
    unknown = sorted({n for n in raw if n not in LAYER_TYPE_NAMES})
    if unknown:
        raise SpecError(
            f"{fields.origin}: unknown layer types {unknown} "
            "(expected sliding_attention or full_attention)"
        )
    return [LAYER_TYPE_NAMES[n] for n in raw]
