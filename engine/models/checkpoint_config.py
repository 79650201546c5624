"""A checkpoint's ``config.json`` into a :class:`~engine.spec.ModelSpec`, through the model
family that its ``model_type`` names (each family reads its own fields)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import SpecError, option
from engine.spec import ModelSpec
from engine.weights.formats import adapter_problem


def spec_from_config(
    config: Mapping[str, Any], name: str = "model", origin: str = "config.json"
) -> ModelSpec:
    """Read a Hugging Face config dict with the reader of the family its ``model_type``
    names.

    Raises:
        SpecError: No ``model_type``, one no family reads, or fields the family refuses.
    """
    from engine.models import family_for

    model_type = config.get("model_type")
    if model_type is None:
        raise SpecError(f"{origin}: required field 'model_type' is missing")
    if not isinstance(model_type, str):
        raise SpecError(f"{origin}: field 'model_type' must be text, got {model_type!r}")
    return family_for(model_type, origin).read_spec(config, name, origin)


def load_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``config.json`` from a checkpoint folder, with errors that say what to fix."""
    folder = Path(model_dir)
    path = folder / "config.json"
    try:
        if not folder.is_dir():
            raise SpecError(f"model folder '{folder}' does not exist or is not a folder")
        if not path.is_file():
            adapter = adapter_problem(folder)
            if adapter is not None:
                raise SpecError(adapter)
            raise SpecError(
                f"'{folder}' has no config.json; point {option('model')} at a Hugging Face "
                "checkpoint folder"
            )
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:  # a folder this user may not enter, an unreadable file
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix it, or copy the model folder again"
        ) from exc
    except (UnicodeDecodeError, RecursionError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a JSON object at the top level")
    return data


def load_spec(model_dir: str | os.PathLike[str]) -> ModelSpec:
    """Read a checkpoint folder's ``config.json`` into a :class:`ModelSpec`."""
    folder = Path(model_dir)
    config = load_config(folder)
    return spec_from_config(config, name=folder.name, origin=str(folder / "config.json"))
