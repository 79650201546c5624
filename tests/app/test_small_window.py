"""At 1024x700 nothing essential is below the fold or cut: the Export button, every
session's graph-capture row (the decoder's first), the benchmark's metrics; text columns
hold their text where the table has room, and elided text keeps its full form in a tooltip.
The capture reasons say what a user can act on, not the graph's internal node names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import pytest
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QTableWidget, QWidget

from app.findings import group_findings, readable_reasons
from app.history import BenchHistory
from app.widgets.preview_panel import WARNINGS_SHOWN
from app.widgets.tables import RowsTable
from app.windows.main_window import MainWindow
from engine.audit import Finding, SessionAudit
from tests.app.conftest import bench_result, make_settings, wait_for_preview

SMALL, LARGE = (1024, 700), (1600, 1000)
INTERNAL_NAME = re.compile(r"\w+_node_\d+|'[^']*_node")


def _in_sight(widget: QWidget) -> bool:
    """The widget's whole rectangle is inside the window and inside every scroll area's
    viewport it sits in (nothing of it scrolled out of view)."""
    if not widget.isVisible():
        return False
    rect = QRect(widget.mapTo(widget.window(), widget.rect().topLeft()), widget.size())
    if not widget.window().rect().contains(rect):
        return False
    parent = widget.parentWidget()
    while parent is not None:
        area = parent.parentWidget()
        if isinstance(area, QAbstractScrollArea) and area.viewport() is parent:
            inside = QRect(widget.mapTo(parent, widget.rect().topLeft()), widget.size())
            if not parent.rect().contains(inside):
                return False
        parent = parent.parentWidget()
    return True


def _text_width(table: QTableWidget, text: str) -> int:
    metrics = table.fontMetrics()
    return max(metrics.horizontalAdvance(line) for line in text.split("\n"))


def _elided(table: QTableWidget) -> list[str]:
    """The columns narrower than their widest cell (whose text the table elides)."""
    header = table.horizontalHeader()
    return [
        table.horizontalHeaderItem(c).text()
        for c in range(table.columnCount())
        if header.sectionSize(c) < table.sizeHintForColumn(c)
    ]


def _open(qtbot, tmp_path, size: tuple[int, int]) -> MainWindow:
    window = MainWindow(make_settings(tmp_path))
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    qtbot.waitUntil(lambda: window.width() == size[0] and window.state.preview is not None)
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    window.state.update_options(ep="webgpu", weight_bits=4)
    wait_for_preview(
        qtbot,
        window,
        lambda p: "gemma4-e2b → WebGPU" in p.title and p.readiness[0].source == "audit",
    )
    window.tabs.setCurrentWidget(window.preview)
    QApplication.processEvents()
    return window


@pytest.fixture
def small(qtbot, tmp_path) -> Iterator[MainWindow]:
    yield _open(qtbot, tmp_path, SMALL)


@pytest.fixture
def large(qtbot, tmp_path) -> Iterator[MainWindow]:
    yield _open(qtbot, tmp_path, LARGE)


def test_at_1024x700_both_export_buttons_are_in_sight(small: MainWindow):
    assert small.size().height() == SMALL[1], "the window's content needs more than 700 px"
    assert _in_sight(small.export_shortcut), "the left Export button is below the fold"
    small.tabs.setCurrentWidget(small.export_panel)
    QApplication.processEvents()
    assert _in_sight(small.export_panel.export_button)


def test_at_1024x700_the_capture_table_shows_every_session_decoder_first(small: MainWindow):
    table = small.preview.readiness
    assert isinstance(table, RowsTable)
    sessions = [table.item(r, 0).text() for r in range(table.rowCount())]
    assert sessions[0] == "decoder" and sorted(sessions) == [
        "decoder",
        "embedding",
        "speech",
        "vision",
    ]
    assert not table.verticalScrollBar().isVisible()
    viewport = table.viewport().rect()
    for r in range(table.rowCount()):
        row = table.visualRect(table.model().index(r, 2))
        assert viewport.contains(row), f"row {sessions[r]} is cut: {row} in {viewport}"
    assert _in_sight(table), "the capture box is below the fold"
    decoder = table.visualRect(table.model().index(0, 0))
    window_rect = small.rect()
    top_left = table.viewport().mapTo(small, decoder.topLeft())
    assert window_rect.contains(QRect(top_left, decoder.size()))


def test_at_1024x700_the_split_table_fits_its_width_and_elided_text_has_a_tooltip(
    small: MainWindow,
):
    table = small.preview.splits
    assert not table.horizontalScrollBar().isVisible()
    assert _in_sight(table)
    for r in range(table.rowCount()):
        for c in range(table.columnCount()):
            item = table.item(r, c)
            assert item.text() in item.toolTip()


def test_capture_reasons_name_no_internal_nodes_and_the_tooltip_does(small: MainWindow):
    rows = small.state.preview.readiness
    vision = next(r for r in rows if r.session == "vision")
    for row in rows:
        for reason in row.reasons:
            assert not INTERNAL_NAME.search(reason), reason
    assert "1 Slice node: input 2 (a shape or index) is computed at run time" in vision.reasons
    assert "Slice_node_" in vision.tooltip
    table = small.preview.readiness
    shown = [table.item(r, 2).text() for r in range(table.rowCount())]
    assert not any(INTERNAL_NAME.search(text) for text in shown)


def test_no_column_is_elided_where_the_table_has_room(large: MainWindow, tmp_path):
    preview = large.preview
    assert _elided(preview.splits) == []
    assert _elided(preview.readiness) == []
    assert not preview.splits.horizontalScrollBar().isVisible()
    bench = _with_history(large, tmp_path)
    assert _elided(bench.table) == []
    assert _in_sight(bench.table) and not bench.page_scroll.verticalScrollBar().isVisible()


def test_at_1024x700_every_benchmark_metric_shows_and_the_package_name_is_in_its_tooltip(
    small: MainWindow, tmp_path
):
    table = _with_history(small, tmp_path).table
    assert not table.horizontalScrollBar().isVisible()
    assert _in_sight(table)
    assert _elided(table) in ([], ["Package"]), "only the package name may be shortened"
    package = table.item(0, 1)
    assert str(tmp_path / "gemma4-e2b-webgpu-fp16-w4-emb4") in package.toolTip()
    header = table.horizontalHeader()
    assert header.sectionSize(1) >= _text_width(table, "gemma4-e2b-web")  # readable


def test_at_1024x700_the_benchmark_tab_keeps_the_window_s_height(small: MainWindow, tmp_path):
    """After a capture off/on run (two runs, a two-line note, the chart's legend) the tab
    never raises the window's least height (it grew to 711-755 px, off a 768-px screen,
    and would not shrink back): the page scrolls instead, Run stays in sight and the
    history scrolls into sight."""
    bench = _with_history(small, tmp_path)
    bench.note.say(
        "Done: 2 runs recorded. Ran on the WebGpuExecutionProvider plugin 0.4.0, software "
        "adapter (lavapipe, no GPU). Capture on generates the same tokens as off.",
        "ready",
    )
    for _ in range(3):
        QApplication.processEvents()
    assert small.minimumSizeHint().height() <= SMALL[1]
    small.resize(*SMALL)
    QApplication.processEvents()
    assert small.size().height() == SMALL[1]
    assert _in_sight(bench.run_button)
    bench.page_scroll.ensureWidgetVisible(bench.table, 0, 0)
    QApplication.processEvents()
    header = bench.table.horizontalHeader()
    assert small.rect().contains(QRect(header.mapTo(small, header.rect().topLeft()), header.size()))


def test_many_plan_warnings_take_three_lines_and_the_tooltip_has_them_all(small: MainWindow):
    warnings = tuple(f"layers.{i}.mlp.down_proj exceeds the buffer limit" for i in range(40))
    small.preview.show_preview(replace(small.state.preview, warnings=warnings))
    QApplication.processEvents()
    label = small.preview.warnings
    assert label.text().count("\n") == WARNINGS_SHOWN and "and 38 more" in label.text()
    assert label.toolTip().split("\n") == list(warnings)
    assert small.size().height() == SMALL[1]
    assert _in_sight(small.preview.readiness)


def test_findings_are_grouped_by_op_type_with_counts():
    reason = "input 1 (a shape or index) is computed at run time"
    findings = [Finding(f"Slice_node_{i}", "Slice", reason) for i in range(3)]
    findings += [
        Finding("Reshape_7", "Reshape", reason),
        Finding("Add_1", "Add", "int64 input 'pos': WebGPU runs int64 arithmetic on the CPU"),
        Finding("Add_2", "Add", "int64 input 'ids': WebGPU runs int64 arithmetic on the CPU"),
    ]
    groups = group_findings(findings)
    assert [g.text for g in groups] == [
        f"3 Slice nodes: {reason}",
        f"1 Reshape node: {reason}",
        "2 Add nodes: int64 input: WebGPU runs int64 arithmetic on the CPU",
    ]
    assert "Slice_node_0, Slice_node_1, Slice_node_2" in groups[0].detail
    audit = SessionAudit("vision", "webgpu", True, tuple(findings))
    never = "its input shapes follow each image's size"
    shown = readable_reasons([never, *audit.reasons(), "standard attention"], audit)
    assert shown.lines == (never, *(g.text for g in groups), "standard attention")
    assert shown.details[1] == groups[0].detail


def _with_history(window: MainWindow, tmp_path) -> object:
    """The Benchmark tab with two recorded runs of a package with a long name."""
    history: BenchHistory = window.bencher.history
    for capture in (False, True):
        package = str(tmp_path / "gemma4-e2b-webgpu-fp16-w4-emb4")
        history.add(bench_result(package=package, graph_capture=capture))
    window.tabs.setCurrentWidget(window.bench_panel)
    window.bench_panel.refresh()
    QApplication.processEvents()
    return window.bench_panel
