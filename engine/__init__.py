"""Export Studio's headless engine: Gemma 4 -> ONNX Runtime GenAI packages.

Importing ``engine`` is cheap; the public names below load their modules on first use.
The engine never imports Qt.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ExportOptions": "engine.options",
    "ExportPlan": "engine.plan",
    "ExportResult": "engine.pipeline",
    "ModelSpec": "engine.spec",
    "CancelToken": "engine.progress",
    "EngineError": "engine.errors",
    "export": "engine.pipeline",
    "plan": "engine.plan",
    "load_spec": "engine.spec",
    "load_preset": "engine.presets",
    "list_presets": "engine.presets",
    "get_caps": "engine.caps",
    "list_eps": "engine.caps",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
