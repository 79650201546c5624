"""The 26B-A4B and 31B presets are offered by the app and preview from the planner."""

from __future__ import annotations

import pytest

from app.windows.main_window import MainWindow
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset
from tests.app.conftest import wait_for_preview


@pytest.mark.parametrize("preset", ["gemma4-26b-a4b", "gemma4-31b"])
def test_large_presets_are_offered_and_previewed(qtbot, window: MainWindow, preset: str):
    offered = [
        window.model_panel.presets.itemText(i) for i in range(window.model_panel.presets.count())
    ]
    assert preset in offered
    window.model_panel.presets.setCurrentText(preset)
    assert "google/gemma-4-" in window.model_panel.preset_note.text()
    preview = wait_for_preview(qtbot, window, lambda p: p.title.startswith(f"{preset} → CPU"))
    assert preview.total_bytes == plan(load_preset(preset), ExportOptions()).nbytes
    assert preset in window.model_panel.summary.text()
