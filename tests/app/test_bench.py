"""The Benchmark tab: runs the engine's bench in a worker, charts it, keeps a history."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt

from app import runtime_adapter
from app.history import HISTORY_FILE, BenchHistory
from app.state import StudioState
from app.widgets.bench_panel import BenchPanel
from app.windows.main_window import MainWindow
from engine.progress import CancelToken


def fake_bench(
    package,
    *,
    runtime="ort",
    prompt_length=128,
    new_tokens=64,
    graph_capture=False,
    progress=None,
    cancel: CancelToken | None = None,
):
    """Stands in for engine.runtime.bench.bench (same keywords, a to_json()-able result)."""
    for step in range(5):
        progress(step / 5, f"run {step}")
        cancel.raise_if_cancelled()
    return {
        "provider": "CPUExecutionProvider",
        "prompt_length": prompt_length,
        "prefill_tokens_per_second": 900.0 + 100 * graph_capture,
        "decode_tokens_per_second": 70.0 if graph_capture else 50.0,
    }


def test_bench_runs_capture_off_and_on_and_keeps_history(
    qtbot, window: MainWindow, monkeypatch, tmp_path, screens
):
    monkeypatch.setattr(runtime_adapter, "_entry", lambda feature: fake_bench)
    panel = window.bench_panel
    window.tabs.setCurrentWidget(panel)
    panel.package.setText(str(tmp_path))
    with qtbot.waitSignal(panel.finished, timeout=30_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    off, on = done.args[0]
    assert (off.capture, on.capture) == (False, True)
    assert (off.decode_tps, on.decode_tps) == (50.0, 70.0)
    assert (off.prefill_tps, on.prefill_tps) == (900.0, 1000.0)
    assert panel.table.rowCount() == 2
    assert panel.table.item(0, 7).text() == "70.0"

    with qtbot.waitSignal(panel.finished, timeout=30_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    saved = json.loads((window.settings.data_dir() / HISTORY_FILE).read_text())
    assert [r["capture"] for r in saved] == [False, True, False, True]
    screens(window, "07-benchmark")

    reopened = BenchPanel(StudioState(), BenchHistory(window.settings.data_dir()))
    qtbot.addWidget(reopened)
    assert reopened.table.rowCount() == 4


def test_missing_engine_bench_is_reported_not_crashed(
    qtbot, window: MainWindow, monkeypatch, tmp_path
):
    def missing(name):
        raise ImportError("No module named 'engine.runtime.bench'")

    monkeypatch.setattr(runtime_adapter, "_module", missing)
    assert not runtime_adapter.availability("bench").available
    panel = window.bench_panel
    panel.package.setText(str(tmp_path))
    worker = panel.run()
    qtbot.waitUntil(lambda: panel.worker is None, timeout=30_000)
    assert worker is not None
    assert "bench is not available in this build" in window.banner.text
    assert "not available" in panel.note.text()
    assert panel.history.records == []


def test_the_real_engine_bench_runs_on_an_exported_package(tmp_path):
    """No fake: the adapter drives engine.runtime.bench on a tiny package."""
    from engine.options import ExportOptions
    from engine.pipeline import export

    if not runtime_adapter.availability("bench").available:
        raise AssertionError(runtime_adapter.availability("bench").message)
    package = export(
        tmp_path / "pkg", preset="gemma4-tiny", options=ExportOptions(random_weights=True)
    ).output
    settings = runtime_adapter.BenchSettings(prompt_len=8, new_tokens=4)
    record = runtime_adapter.run_bench(package, settings, lambda f, m: None, CancelToken())
    assert record.decode_tps and record.decode_tps > 0
    assert record.prefill_tps and record.prefill_tps > 0
    assert record.raw["prompt_length"] == 8
