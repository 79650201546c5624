"""The main window: it opens, the preview follows the planner, errors show in one place."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt

from app.state import ModelSource
from app.windows.main_window import MainWindow
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset, preset_config
from tests.app.conftest import make_settings, wait_for_preview


def _choose(combo, data) -> None:
    index = combo.findData(data)
    assert index >= 0, f"{data!r} is not offered"
    combo.setCurrentIndex(index)


def test_window_opens_with_the_tiny_preview(window: MainWindow, screens):
    assert window.isVisible()
    assert window.windowTitle() == "Export Studio"
    assert [window.tabs.tabText(i) for i in range(window.tabs.count())] == [
        "Preview",
        "Export",
        "genai_config",
        "Benchmark",
    ]
    preview = window.state.preview
    expected = plan(load_preset("gemma4-tiny"), ExportOptions())
    assert preview.total_bytes == expected.nbytes
    assert window.preview.title.text().startswith("gemma4-tiny → CPU")
    assert "gemma4-tiny" in window.model_panel.summary.text()
    assert not window.banner.isVisible()
    screens(window, "01-preview-tiny-cpu")


def test_changing_options_updates_the_preview_from_the_planner(qtbot, window: MainWindow, screens):
    window.model_panel.presets.setCurrentText("gemma4-e4b")
    _choose(window.target_panel.ep, "webgpu")
    first = wait_for_preview(qtbot, window, lambda p: "gemma4-e4b → WebGPU" in p.title)
    expected = plan(load_preset("gemma4-e4b"), ExportOptions(ep="webgpu"))
    assert first.total_bytes == expected.nbytes

    _choose(window.target_panel.embedding_bits, 4)
    second = wait_for_preview(qtbot, window, lambda p: "embeddings int4" in p.title)
    expected = plan(load_preset("gemma4-e4b"), ExportOptions(ep="webgpu", embedding_bits=4))
    assert second.total_bytes == expected.nbytes < first.total_bytes
    # Every session's splits (E4B's embedding session holds the per-layer table).
    split = sorted(
        w.name for s in expected.sessions for w in s.weights if w.is_split and not w.shares
    )
    table = window.preview.splits
    assert sorted(table.item(r, 0).text() for r in range(table.rowCount())) == split
    ple = next(
        r for r in range(table.rowCount()) if table.item(r, 0).text().startswith("embed_tokens_per")
    )
    assert table.item(ple, 3).text() == "42"  # one table per layer
    assert window.preview.tensors.bars[0].pieces == 42
    assert window.preview.readiness.rowCount() == len(expected.sessions)
    assert second.compute_ms > 0  # measured in the worker; its budget is benchmarks/app_preview.py
    window.tabs.setCurrentIndex(0)
    screens(window, "02-preview-e4b-webgpu-int4-embeddings")


def test_a_burst_of_changes_is_throttled(qtbot, window: MainWindow):
    runs_before = window.previewer.runs
    for length in range(10, 310, 10):  # 30 changes in one go
        window.state.update_options(max_length=length)
    preview = wait_for_preview(qtbot, window, lambda p: p.context_length == 300)
    assert window.previewer.runs - runs_before <= 3
    assert preview.context_length == 300


def test_options_the_plan_refuses_show_in_the_banner(qtbot, window: MainWindow, screens):
    _choose(window.target_panel.weight_bits, 4)
    _choose(window.target_panel.embedding_bits, 4)  # the tied head shares the table's blocks
    _choose(window.target_panel.block_size, 128)  # the tiny model's hidden size is 64
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=10_000)
    assert "block size 128 does not divide" in window.banner.text
    assert window.preview.title.text().startswith("No preview")
    screens(window, "03-error-banner")
    _choose(window.target_panel.block_size, 32)
    qtbot.waitUntil(lambda: not window.banner.isVisible(), timeout=10_000)
    assert window.state.preview is not None


def test_a_bad_custom_buffer_limit_is_refused_inline(qtbot, window: MainWindow):
    panel = window.target_panel
    _choose(panel.limit_mode, "custom")  # starts from the EP's limit (or 1 GiB)
    assert window.state.options.max_buffer_size == 1024**3
    panel.limit.setText("lots")
    panel.limit.editingFinished.emit()
    assert "Not applied" in panel.limit.toolTip()
    assert "border" in panel.limit.styleSheet()
    assert window.state.options.max_buffer_size == 1024**3
    panel.limit.setText("64MiB")
    panel.limit.editingFinished.emit()
    assert window.state.options.max_buffer_size == 64 * 1024**2


def test_settings_persist_between_sessions(qtbot, tmp_path: Path):
    settings = make_settings(tmp_path)
    first = MainWindow(settings)
    qtbot.addWidget(first)
    first.state.set_source(ModelSource("preset", "gemma4-e2b"))
    first.state.update_options(ep="webgpu", weight_bits=4, max_length=2048)
    first.state.set_output(str(tmp_path / "out"))
    first.show()
    first.resize(1300, 820)
    qtbot.waitUntil(lambda: first.width() >= 1300)
    geometry = first.saveGeometry()
    first.close()

    second = MainWindow(make_settings(tmp_path))
    qtbot.addWidget(second)
    second.show()
    assert second.state.source == ModelSource("preset", "gemma4-e2b")
    assert second.state.options == ExportOptions(ep="webgpu", weight_bits=4, max_length=2048)
    assert second.state.output == str(tmp_path / "out")
    # The offscreen screen is 800x800 and clamps a restored size, so compare the bytes.
    assert second.settings.qsettings.value("window/geometry") == geometry
    assert second.target_panel.weight_bits.currentData() == 4
    second.close()


def test_hf_cache_scan_lists_supported_snapshots_only(
    qtbot, window: MainWindow, tmp_path, monkeypatch
):
    cache = tmp_path / "hub"
    gemma = cache / "models--google--gemma-4-e2b-it" / "snapshots" / "0123456789abcdef"
    llama = cache / "models--meta--llama" / "snapshots" / "fedcba"
    for folder in (gemma, llama):
        folder.mkdir(parents=True)
    config = preset_config("gemma4-e2b")
    (gemma / "config.json").write_text(json.dumps(config))
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))

    panel = window.model_panel
    with qtbot.waitSignal(panel.cacheScanned, timeout=10_000) as found:
        qtbot.mouseClick(panel.kind_buttons.button(2), Qt.MouseButton.LeftButton)
    assert found.args == [1]
    assert panel.cache.itemText(0).startswith("google/gemma-4-e2b-it @ 01234567")
    panel.cache.activated.emit(0)
    assert window.state.source.kind == "cache"
    preview = wait_for_preview(qtbot, window, lambda p: p.title.startswith("0123456789abcdef"))
    assert preview.total_bytes == plan(load_preset("gemma4-e2b"), ExportOptions()).nbytes
