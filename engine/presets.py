"""Built-in architecture presets (config only, no weights) shipped in ``resources/presets``."""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import SpecError
from engine.models import spec_from_config
from engine.spec import ModelSpec
from resources import resource_path

DEFAULT_PRESET = "gemma4-tiny"


def _preset_dir() -> Path:
    return resource_path("presets")


def list_presets() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(p.stem for p in _preset_dir().glob("*.json"))


def preset_config(name: str) -> dict:
    """The raw config dict of a preset."""
    path = _preset_dir() / f"{name}.json"
    if not path.is_file():
        raise SpecError(f"unknown preset '{name}'; available presets: {', '.join(list_presets())}")
    data: dict = json.loads(path.read_text(encoding="utf-8"))
    data.pop("_comment", None)
    return data


def load_preset(name: str) -> ModelSpec:
    """A preset's :class:`ModelSpec`."""
    return spec_from_config(preset_config(name), name=name, origin=f"preset '{name}'")
