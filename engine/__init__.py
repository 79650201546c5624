"""Export Studio's headless engine: Gemma 4 -> ONNX Runtime GenAI packages.

Importing ``engine`` is cheap; the public names below load their modules on first use.
(``make_plan`` is ``engine.plan.plan``: the name ``engine.plan`` is the module.)
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
    "make_plan": "engine.plan:plan",
    "load_spec": "engine.models",
    "load_preset": "engine.presets",
    "list_presets": "engine.presets",
    "get_caps": "engine.caps",
    "list_eps": "engine.caps",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute or name)
