"""Named constants of a session graph: one initializer per name, and one meaning."""

from __future__ import annotations

import numpy as np
import pytest

from engine.graph.context import BuildContext
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset


def _context() -> BuildContext:
    p = plan(load_preset("gemma4-tiny"), ExportOptions(ep="webgpu"))
    return BuildContext(p, p.sessions[0], None)


def test_a_named_constant_is_made_once() -> None:
    ctx = _context()
    first = ctx.const(np.array(1.0, np.float32), name="one_f32")
    assert ctx.const(np.array(1.0, np.float32), name="one_f32") is first
    assert list(ctx.graph.initializers) == ["one_f32"]


@pytest.mark.parametrize(
    "other", [np.array(1, np.int32), np.array([1.0], np.float32), np.array(2.0, np.float32)]
)
def test_a_name_asked_for_with_another_array_is_an_error(other: np.ndarray) -> None:
    ctx = _context()
    ctx.const(np.array(1.0, np.float32), name="one_f32")
    with pytest.raises(ValueError, match="one_f32"):
        ctx.const(other, name="one_f32")
