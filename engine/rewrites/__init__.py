"""Graph rewrites chosen by EP capability flags, one rule family per module."""

from __future__ import annotations

import onnx_ir as ir

from engine.caps import EpCapabilities


def apply_rewrites(model: ir.Model, caps: EpCapabilities) -> dict[str, int]:
    """Apply every rule family the EP's flags ask for; returns rewrites per family."""
    applied: dict[str, int] = {}
    if caps.capture_needs_static_graph:
        from engine.rewrites import static_empty_kv

        applied["static_empty_kv"] = static_empty_kv.rules.apply_to_model(model)
    return applied
