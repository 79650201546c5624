"""The Preview header says which attention the built graph really uses."""

from __future__ import annotations

import pytest

from app.preview_data import ATTENTION_WORDS, preview_from_plan
from app.windows.main_window import MainWindow
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset
from tests.app.conftest import wait_for_preview


@pytest.mark.parametrize(
    "preset, options, words",
    [
        ("gemma4-tiny", ExportOptions(), "GroupQueryAttention"),
        ("gemma4-tiny", ExportOptions(attention="standard"), "standard ONNX ops"),
        ("gemma4-tiny", ExportOptions(ep="webgpu"), ATTENTION_WORDS["static"]),
        ("gemma4-e2b", ExportOptions(ep="webgpu", weight_bits=4), ATTENTION_WORDS["static"]),
        ("gemma4-tiny", ExportOptions(ep="webgpu", attention="standard"), "standard ONNX ops"),
        ("gemma4-tiny", ExportOptions(ep="cuda"), "GroupQueryAttention"),  # heads <= 256
        ("gemma4-e2b", ExportOptions(ep="cuda", weight_bits=4), ATTENTION_WORDS["mixed"]),
    ],
)
def test_the_preview_names_the_attention_lowering_the_graph_uses(
    preset: str, options: ExportOptions, words: str
) -> None:
    export_plan = plan(load_preset(preset), options)
    assert preview_from_plan(export_plan).attention == words


def test_webgpu_is_not_said_to_use_gqa(qtbot, window: MainWindow) -> None:
    """WebGPU's plan takes the "gqa" path, but its graph has no GroupQueryAttention node:
    it is lowered over static KV buffers, and the header says so."""
    window.state.update_options(ep="webgpu")
    wait_for_preview(qtbot, window, lambda p: "WebGPU" in p.title)
    facts = window.preview.facts.text()
    assert "attention gqa" not in facts
    assert "static KV buffers" in facts, facts
    window.state.update_options(ep="cpu")
    wait_for_preview(qtbot, window, lambda p: "CPU" in p.title)
    assert "attention GroupQueryAttention" in window.preview.facts.text()
