"""Messages: shown exactly as the engine words them, and only while they are about what is
chosen now (the model, the options, the package)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.state import ModelSource
from app.widgets.legend import LegendEntry
from app.windows.main_window import MainWindow
from engine.runtime.bench_record import BenchResult

TRICKY = "must be <= 1 & >= 0, got <b>2</b>"
"""Engine text that a rich-text label would eat ("<= 1 & >= 0, got" vanishes, 2 turns bold)."""


def _config(folder: Path) -> Path:
    path = folder / "genai_config.json"
    path.write_text(json.dumps({"model": {"type": "gemma3_text"}, "search": {"top_p": 0.9}}))
    return path


def test_a_refused_value_shows_its_whole_reason(qtbot, window: MainWindow, tmp_path: Path):
    editor = window.config_editor
    assert editor.open(str(_config(tmp_path)))
    with qtbot.waitSignal(editor.refused):
        assert not editor.set_value_text(("search", "top_p"), "2")
    message = editor.message
    assert message.textFormat() == Qt.TextFormat.PlainText
    assert "Refused search.top_p: must be <= 1" in message.text(), message.text()
    assert message.level == "error"


def test_the_error_banner_shows_lt_and_amp_as_typed(window: MainWindow):
    window.state.report_error("export", f"Export failed: {TRICKY}")
    banner = window.banner
    assert banner.isVisible()
    assert banner.label.textFormat() == Qt.TextFormat.PlainText
    assert banner.label.text() == f"Export failed: {TRICKY}"
    assert banner.text == f"Export: Export failed: {TRICKY}"


def _labels(window: MainWindow) -> list[QLabel]:
    for i in range(window.tabs.count()):  # every tab's widgets made (charts are deferred)
        window.tabs.setCurrentIndex(i)
    for chart in (window.preview.sizes, window.preview.tensors, window.inspector.sizes):
        assert chart is not None
    window.bench_panel.latest_chart  # noqa: B018 (made on first use)
    return window.findChildren(QLabel)


def test_every_label_that_shows_text_from_elsewhere_is_plain_text(window: MainWindow):
    """A label is plain text unless it is a control's caption (a buddy, with its mnemonic)."""
    rich = [
        f"{type(label.parent()).__name__}: {label.text()[:50]!r}"
        for label in _labels(window)
        if label.textFormat() != Qt.TextFormat.PlainText and label.buddy() is None
    ]
    assert not rich, rich


def test_engine_words_in_every_message_label_survive(qtbot, window: MainWindow):
    """The same tricky words through each message the studio words around engine text."""
    state = window.state
    state.set_source_problem(TRICKY)
    assert TRICKY in window.export_panel.blocker.text()
    assert TRICKY in window.export_reason.text()
    window.exporter.failed.emit(TRICKY)
    assert window.export_panel.stage.text() == f"Failed: {TRICKY}"
    window.bencher.failed.emit(TRICKY)
    assert window.bench_panel.note.text() == f"Failed: {TRICKY}"
    for label in (
        window.export_panel.blocker,
        window.export_reason,
        window.export_panel.stage,
        window.bench_panel.note,
    ):
        assert label.textFormat() == Qt.TextFormat.PlainText
    state.set_source_problem("")


# ---------------------------------------------------------------- status and its context


def test_a_preset_change_clears_the_last_exports_status(qtbot, window: MainWindow):
    panel = window.export_panel
    window.exporter.progress.emit(0.31, "writing embed_tokens")
    window.exporter.cancelled.emit()
    # nothing was written: the bar does not stay at the share it had reached
    assert panel.progress.value() == 0 and "Cancelled" in panel.stage.text()
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    assert window.state.source == ModelSource("preset", "gemma4-e2b")
    assert panel.stage.text() == "Ready."
    assert panel.progress.value() == 0
    window.exporter.failed.emit("the disk is full")
    window.state.update_options(ep="webgpu")
    assert panel.stage.text() == "Ready."


def test_a_successful_export_says_it_was_written_not_unavailable(
    qtbot, window: MainWindow, tmp_path: Path
):
    output = tmp_path / "written"
    window.state.set_output(str(output))
    with qtbot.waitSignal(window.exporter.finished, timeout=180_000):
        window.export()
    assert window.exporter.result is not None, window.banner.text
    panel = window.export_panel
    for label in (panel.blocker, window.export_reason):
        assert not label.isHidden()
        assert "unavailable" not in label.text()
        assert f"Exported to {output}" in label.text()
        assert "Replace an existing folder" in label.text()
        assert label.level == "ready"
    assert panel.summary_box.isVisible()
    # Another folder: nothing to say; back to a folder that is not this package: a warning.
    window.state.set_output(str(tmp_path / "another"))
    assert panel.blocker.isHidden() and not panel.summary_box.isVisible()
    taken = tmp_path / "taken"
    taken.mkdir()
    window.state.set_output(str(taken))  # empty: made for the package, nothing to say
    assert panel.blocker.isHidden() and panel.export_button.isEnabled()
    (taken / "notes.txt").write_text("mine")
    window.state.set_output(str(tmp_path / "another"))
    window.state.set_output(str(taken))
    assert "Export is unavailable" in panel.blocker.text() and panel.blocker.level == "warning"


def _result(package: Path, capture: bool, decode: float) -> BenchResult:
    """A benchmark record of ``package`` with made-up numbers."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(BenchResult):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        kind = str(f.type)
        values[f.name] = (
            () if "tuple" in kind else 1 if "int" in kind else 1.0 if "float" in kind else "x"
        )
    values.update(
        package=str(package),
        runtime="ort",
        ep="cpu",
        graph_capture=capture,
        peak_rss_scope="benchmark",
        decode_tokens_per_second=decode,
        decode_tokens_per_second_min=decode,
        decode_tokens_per_second_max=decode,
        decode_tokens_per_second_runs=(decode,),
    )
    return BenchResult(**values)


def test_the_benchmark_status_and_latest_runs_belong_to_the_chosen_package(
    qtbot, window: MainWindow, tmp_path: Path
):
    first, second = tmp_path / "first-package", tmp_path / "second-package"
    for folder in (first, second):
        folder.mkdir()
    window.bencher.history.add(_result(first, False, 42.0))
    panel = window.bench_panel
    window.tabs.setCurrentWidget(panel)
    panel.set_package(str(first))
    panel.refresh()
    chart = panel.latest_chart
    assert chart.off is not None and chart.off.decode_tokens_per_second == 42.0
    assert "first-package" in chart.title.text()
    window.bencher.failed.emit("the EP crashed")
    assert panel.note.text() == "Failed: the EP crashed"
    panel.set_package(str(first))  # the same package again (e.g. the field lost focus)
    assert panel.note.text() == "Failed: the EP crashed"

    panel.set_package(str(second))
    assert panel.note.text() == ""
    assert chart.off is None and chart.on is None  # not the first package's run
    assert "second-package" in chart.title.text()
    assert "No runs of second-package" in chart.empty.text()
    assert panel.table.rowCount() == 1  # the history still lists it, with its package
    assert panel.table.item(0, 1).text() == "first-package"


def test_legend_entries_are_plain_text_too(window: MainWindow):
    window.tabs.setCurrentWidget(window.preview)
    entries = window.preview.sizes.legend.findChildren(LegendEntry)
    assert entries
    assert all(e.label.textFormat() == Qt.TextFormat.PlainText for e in entries)
