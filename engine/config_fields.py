"""Typed reading of a model's raw ``config.json`` fields, shared by every family's reader:
each error names the file and the field, and says what was found."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.errors import SpecError

MAX_SIZE = 2**31 - 1
"""Largest count or size a config field may hold (onnxruntime indexes tokens, positions and
most dimensions with int32)."""
MAX_LAYERS = 1024
"""Most decoder layers a config may declare (Gemma 4 models have up to 60)."""


class ConfigFields:
    """Typed access to a config dict that names the file and field in every error."""

    def __init__(self, data: Mapping[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin

    def required(self, key: str, kind: type = int, least: int | None = None) -> Any:
        if key not in self.data or self.data[key] is None:
            raise SpecError(f"{self.origin}: required field '{key}' is missing")
        return self._check(key, self.data[key], kind, least)

    def optional(self, key: str, default: Any, kind: type = int, least: int | None = None) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        return self._check(key, value, kind, least)

    def head_dim(self, key: str, value: Any) -> int:
        """A head size: a whole number, even (RoPE rotates pairs), at least 2."""
        size = self._check(key, value, int, 2)
        if size % 2:
            raise SpecError(
                f"{self.origin}: field '{key}' must be even (rotary embeddings rotate pairs), "
                f"got {size}"
            )
        return int(size)

    def layer_count(self, key: str = "num_hidden_layers") -> int:
        """A layer count: at least 1, at most :data:`MAX_LAYERS`."""
        count = int(self.required(key, least=1))
        if count > MAX_LAYERS:
            raise self.error(key, f"is {count:,}; the engine exports at most {MAX_LAYERS}")
        return count

    def non_negative(self, key: str, default: float) -> float:
        """A float field that may be 0 but not negative (an epsilon)."""
        value = float(self.optional(key, default, float))
        if value < 0:
            raise self.error(key, f"must not be negative, got {value}")
        return value

    def one_of(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        """A text field whose value must be one of ``allowed`` (an activation's name)."""
        value = str(self.optional(key, default, str))
        if value not in allowed:
            raise SpecError(
                f"{self.origin}: {key} '{value}' is not supported (supported: {', '.join(allowed)})"
            )
        return value

    def error(self, key: str, problem: str) -> SpecError:
        return SpecError(f"{self.origin}: field '{key}' {problem}")

    def _check(self, key: str, value: Any, kind: type, least: int | None = None) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind in (int, float) and isinstance(value, bool):
            raise self.error(key, f"must be a number, got {value!r}")
        if not isinstance(value, kind):
            noun = {int: "a whole number", float: "a number", bool: "true or false"}.get(
                kind, kind.__name__
            )
            raise self.error(key, f"must be {noun}, got {value!r}")
        number: Any = value
        if kind is float and not math.isfinite(number):
            raise self.error(key, f"must be a finite number, got {number!r}")
        if kind is int and number < 0:
            raise self.error(key, f"must not be negative, got {number}")
        if kind is int and number > MAX_SIZE:
            raise self.error(key, f"is {number:,}, larger than any model can use ({MAX_SIZE:,})")
        if least is not None and number < least:
            raise self.error(key, f"must be at least {least}, got {number}")
        return number


def section(config: Mapping[str, Any], key: str, origin: str) -> ConfigFields | None:
    """The view of one sub-config (``vision_config``), or None when the config has none."""
    raw = config.get(key)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(f"{origin}: '{key}' must be an object, got {raw!r}")
    return ConfigFields(raw, f"{origin} ({key})")


def positive(fields: ConfigFields, key: str, default: Any = None) -> int:
    value = fields.required(key) if default is None else fields.optional(key, default)
    if value < 1:
        raise SpecError(f"{fields.origin}: field '{key}' must be at least 1, got {value}")
    return int(value)


def token_ids(vocab: int, *sources: ConfigFields) -> tuple[int | None, tuple[int, ...], int | None]:
    """``bos_token_id``, the ``eos_token_id`` list and ``pad_token_id``, each from the first
    of ``sources`` that sets it, checked against the vocabulary."""

    def first(key: str) -> tuple[Any, ConfigFields]:
        for src in sources:
            if src.data.get(key) is not None:
                return src.data[key], src
        return None, sources[0]

    def token(key: str, value: Any, where: ConfigFields) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(key, f"must be a token id (a whole number), got {value!r}")
        if not 0 <= value < vocab:
            raise where.error(key, f"is {value}, outside the vocabulary (0 to {vocab - 1})")
        return value

    bos, bos_src = first("bos_token_id")
    eos, eos_src = first("eos_token_id")
    pad, pad_src = first("pad_token_id")
    eos_list = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return (
        token("bos_token_id", bos, bos_src) if bos is not None else None,
        tuple(token("eos_token_id", e, eos_src) for e in eos_list),
        token("pad_token_id", pad, pad_src) if pad is not None else None,
    )


def source_dtype(*sources: Mapping[str, Any]) -> str:
    """The dtype a checkpoint is stored in: the first ``dtype`` or ``torch_dtype`` of
    ``sources`` (a sub-config before its parent), float32 when none says."""
    for source in sources:
        for key in ("dtype", "torch_dtype"):
            if source.get(key):
                return str(source[key])
    return "float32"
