"""Small safetensors checkpoints written with numpy alone (no torch): fast fixtures for tests
of bad input and for the input fuzzer. Use ``tiny_gemma`` when transformers must agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engine.models import spec_from_config
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import preset_config


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """The ``gemma4-tiny`` preset's config.json, with overrides."""
    return {**preset_config("gemma4-tiny"), **overrides}


def checkpoint_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 tensors, by checkpoint name, for every weight ``config`` needs."""
    spec = spec_from_config(config)
    rng = np.random.default_rng(seed)
    tensors = {}
    for session in plan(spec, ExportOptions()).sessions:
        for wp in session.weights:
            w = wp.weight
            if w.source is None or wp.shares:
                continue
            tensors[w.source] = _draw(rng, w.shape, w.role)
    return tensors


def _draw(rng: np.random.Generator, shape: tuple[int, ...], role: str) -> np.ndarray:
    if role in ("norm", "scalar"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (0.05 * rng.standard_normal(shape)).astype(np.float32)


def write_checkpoint(folder: Path, config: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A checkpoint folder (config.json + model.safetensors) for ``config`` (default: tiny)."""
    from safetensors.numpy import save_file

    config = config or tiny_config()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_file(checkpoint_tensors(config, seed), str(folder / "model.safetensors"))
    return folder
