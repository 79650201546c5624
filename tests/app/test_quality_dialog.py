"""The size-against-quality dialog on tradeoffs made without measuring: the tiny Qwen2
checkpoint's real plans with a stand-in for the per-weight measurement, or made-up costs.
What it shows, what its chart's points say and do, and the budget it hands the panel."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QPointF, Qt

from app.state import ModelSource
from app.widgets.quality_dialog import QualityDialog, budget_text, missing_lines
from app.windows.main_window import MainWindow
from engine import sensitivity
from engine.options import ExportOptions
from engine.sensitivity import Tradeoff, TradeoffPoint, WeightCost, pick
from engine.units import parse_bytes, rounded_up_size
from tests.app.conftest import Measured, wait_for_preview

INT4 = dict(ep="cpu", weight_bits=4, embedding_bits=4, block_size=16)
READABLE = re.compile(r"[0-9]+(\.[0-9]{1,3})?[KMG]iB")


@pytest.fixture
def made_up(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[WeightCost], int], Tradeoff]:
    """``made_up(costs, base)``: what :func:`engine.sensitivity.tradeoff` makes of these
    costs on an all-INT4 package of ``base`` bytes."""

    def make(costs: list[WeightCost], base: int) -> Tradeoff:
        monkeypatch.setattr(sensitivity, "_measurable", lambda *_: [])
        monkeypatch.setattr(sensitivity, "_costs", lambda *_, **__: costs)
        options = ExportOptions(weight_bits=4, embedding_bits=4)
        int4 = SimpleNamespace(options=options, nbytes=base, decoder=SimpleNamespace(weights=[]))
        floats = SimpleNamespace(nbytes=4 * base, options=SimpleNamespace(dtype="fp32"))
        return sensitivity.tradeoff(Path("checkpoint"), int4, lambda _: floats)

    return make


def _dialog(qtbot, tradeoff: Tradeoff, options: ExportOptions, chosen: list[str]) -> QualityDialog:
    dialog = QualityDialog(Path("checkpoint"), options, chosen.append, measured=tradeoff)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def _mix(budget: int, tradeoff: Tradeoff, options: ExportOptions) -> tuple[list[str], int]:
    """The INT8 weights and bytes an export picks under ``budget``."""
    changed = replace(options, size_budget=budget)
    names, _, nbytes = pick(list(tradeoff.costs), changed, tradeoff.points[0].nbytes)
    return sorted(names), nbytes


def test_a_chosen_line_is_a_readable_budget_that_exports_it(qtbot, measured: Measured):
    """Use as size budget hands a size in KiB / MiB / GiB, rounded up: at least the line's
    budget, and under it the export picks exactly the line's INT8 weights."""
    options = ExportOptions(**INT4)
    tradeoff = measured(options)
    chosen: list[str] = []
    dialog = _dialog(qtbot, tradeoff, options, chosen)
    row = next(i for i, p in enumerate(tradeoff.points) if p.label == "INT4 + INT8, +10% bytes")
    dialog.table.selectRow(row)
    qtbot.mouseClick(dialog.use, Qt.MouseButton.LeftButton)
    point = tradeoff.points[row]
    assert point.size_budget is not None and len(chosen) == 1
    assert READABLE.fullmatch(chosen[0]), chosen
    assert parse_bytes(chosen[0]) >= point.size_budget
    shown = _mix(parse_bytes(chosen[0]), tradeoff, options)
    assert shown == _mix(point.size_budget, tradeoff, options) and shown[1] == point.nbytes


def test_a_budget_stays_exact_where_rounding_up_would_fit_another_int8_weight():
    """A budget a byte short of fitting a one-byte INT8 weight: any readable size above it
    fits that weight too, so the exact figure is kept."""
    base = 300_000
    big = WeightCost("big", 1.0, 10_000, 20_000)
    tiny = WeightCost("tiny", 1e-6, 1, 2)
    # a budget that even 3 decimals of KiB round up by a byte or more
    budget = next(
        n for n in itertools.count(base + 10_001) if parse_bytes(rounded_up_size(n, 3)) > n
    )
    others = WeightCost("room", 0.5, budget - base - 10_000, 2 * (budget - base - 10_000))
    tradeoff = Tradeoff(
        (TradeoffPoint("all INT4", base, 1.5, 0, None),), (big, others, tiny), "fp32"
    )
    point = TradeoffPoint("mix", budget, 0.1, 2, budget)
    options = ExportOptions(**INT4)
    assert _mix(budget, tradeoff, options)[0] == ["big", "room"]
    assert _mix(budget + 1, tradeoff, options)[0] == ["big", "room", "tiny"]
    assert budget_text(tradeoff, point, options) == str(budget)
    roomy = replace(tradeoff, costs=(big, others, WeightCost("tiny", 1e-6, 100, 200)))
    text = budget_text(roomy, point, options)  # the next weight needs far more room
    assert READABLE.fullmatch(text) and parse_bytes(text) > budget


def test_the_status_says_why_a_line_is_missing(qtbot, measured: Measured, made_up):
    """Float tables: every 4-bit weight in INT8 costs less than +50%, so there is no +50%
    line, and the status says how much it does cost. A share whose budget buys no more
    than the line above is named for that."""
    options = ExportOptions(**{**INT4, "embedding_bits": None})
    tradeoff = measured(options)
    dialog = _dialog(qtbot, tradeoff, options, [])
    labels = [p.label for p in tradeoff.points]
    assert "INT4 + INT8, +50% bytes" not in labels and "INT4 + INT8, +20% bytes" in labels
    int8 = next(p for p in tradeoff.points if p.label == "4-bit weights in INT8")
    share = f"{int8.nbytes / tradeoff.points[0].nbytes - 1:+.1%}"
    assert f"No +50% line: every 4-bit weight in INT8 is only {share}." in dialog.status.text()
    full = measured(ExportOptions(**INT4))  # every share has its line
    assert len(full.points) == 7 and missing_lines(full) == ""

    # +5% fits no weight, +20% only the one +10% fits; +50% is past all-INT8 (+38%)
    costs = [WeightCost("small", 0.5, 80, 160), WeightCost("large", 0.2, 300, 600)]
    tradeoff = made_up(costs, 1000)
    assert [p.label for p in tradeoff.points][1:3] == [
        "INT4 + INT8, +10% bytes",
        "4-bit weights in INT8",
    ]
    assert missing_lines(tradeoff) == (
        "No +5% or +20% line: their budgets buy no more INT8 weights than the line above. "
        "No +50% line: every 4-bit weight in INT8 is only +38.0%."
    )


def test_each_point_is_named_on_the_chart_and_a_click_picks_its_line(qtbot, measured: Measured):
    """Short names beside the points, none over another or outside the plot; a click on a
    point selects its line (ringed on the chart); the description names both."""
    options = ExportOptions(**INT4)
    tradeoff = measured(options)
    dialog = _dialog(qtbot, tradeoff, options, [])
    chart = dialog.chart
    names = [text.toPlainText() for text in chart.marks]
    assert names == ["all INT4", "+5%", "+10%", "+20%", "+50%", "INT8"]
    view = chart.plot.getViewBox()
    rects = []
    for text in chart.marks:  # the glyphs: a text's box has a blank margin around them
        margin = text.textItem.document().documentMargin()
        box = view.mapRectFromItem(text, text.boundingRect())
        rects.append(box.adjusted(margin, margin, -margin, -margin))
    assert all(view.boundingRect().contains(r) for r in rects)
    assert not any(a.intersects(b) for a, b in itertools.combinations(rects, 2))
    dots = [view.mapFromView(QPointF(text.pos())) for text in chart.marks]
    assert not any(r.contains(d) for r, d in itertools.product(rects, dots))
    assert "INT4 + INT8, +20% bytes (marked +20%)" in chart.summary
    assert "float (fp32)" in chart.summary and "not drawn" in chart.summary

    row = names.index("+20%")
    where = chart.plot.mapFromScene(view.mapViewToScene(QPointF(chart.marks[row].pos())))
    qtbot.mouseClick(chart.plot.viewport(), Qt.MouseButton.LeftButton, pos=where)
    assert dialog.selected_row() == row and dialog.use.isEnabled()
    label = tradeoff.points[row].label
    assert f"chosen: {label}" in chart.legend.text() and chart.summary.endswith(f"chosen: {label}")


def test_enter_in_the_table_uses_the_selected_line(qtbot, measured: Measured):
    """Enter acts as Use as size budget on a line that has a budget; on the float line,
    which has none, it does nothing."""
    options = ExportOptions(**INT4)
    tradeoff = measured(options)
    chosen: list[str] = []
    dialog = _dialog(qtbot, tradeoff, options, chosen)
    dialog.table.selectRow(len(tradeoff.points) - 1)  # float
    qtbot.keyClick(dialog.table, Qt.Key.Key_Return)
    assert dialog.isVisible() and chosen == []
    dialog.table.selectRow(1)
    qtbot.keyClick(dialog.table, Qt.Key.Key_Return)
    assert not dialog.isVisible()
    assert chosen == [budget_text(tradeoff, tradeoff.points[1], options)]


def test_the_budget_box_keeps_a_readable_budget_and_says_when_it_is_not_applied(
    qtbot, window: MainWindow, qwen2: Path, measured: Measured
):
    """The line picked shows as a readable size that stays through other changes and
    selects its line again; choices it does not apply to (8-bit weights, random ones) keep
    it in the box, unapplied, and the note under the form says so and why."""
    from app.widgets.controls import find_data

    panel = window.target_panel
    window.model_panel.kind_buttons.button(1).click()  # a checkpoint folder, as a user picks
    window.model_panel.folder.setText(str(qwen2))
    window.model_panel.folder.editingFinished.emit()
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("my-qwen2"))
    for combo, value in ((panel.weight_bits, 4), (panel.embedding_bits, 4), (panel.block_size, 16)):
        combo.setCurrentIndex(find_data(combo, value))
    options = window.state.options
    tradeoff = measured(options)
    window.state.set_tradeoff(window.state.source, options, tradeoff)  # the dialog shows it
    dialog = panel.estimate_quality()
    row = next(i for i, p in enumerate(tradeoff.points) if p.label == "INT4 + INT8, +20% bytes")
    dialog.table.selectRow(row)
    qtbot.mouseClick(dialog.use, Qt.MouseButton.LeftButton)
    text = panel.size_budget.text()
    assert READABLE.fullmatch(text) and window.state.options.size_budget == parse_bytes(text)
    panel.quant_method.setCurrentIndex(find_data(panel.quant_method, "search"))
    panel.quant_method.setCurrentIndex(find_data(panel.quant_method, "rtn"))
    assert panel.size_budget.text() == text  # not rewritten as its bytes
    again = panel.estimate_quality()
    assert again.selected_row() == row
    again.reject()
    assert not panel.note.isVisible()

    panel.weight_bits.setCurrentIndex(find_data(panel.weight_bits, 8))
    panel.embedding_bits.setCurrentIndex(find_data(panel.embedding_bits, 8))
    assert window.state.options.size_budget is None and panel.size_budget.text() == text
    assert panel.note.isVisible()
    assert f"Size budget {text} is not applied: it picks INT8 for some 4-bit" in panel.note.text()
    panel.weight_bits.setCurrentIndex(find_data(panel.weight_bits, 4))  # applies again
    assert window.state.options.size_budget == parse_bytes(text)
    assert "Size budget" not in panel.note.text()
    panel.random_weights.setChecked(True)
    assert window.state.options.size_budget is None
    assert f"Size budget {text} is not applied: random weights" in panel.note.text()
    panel.random_weights.setChecked(False)
    assert window.state.options.size_budget == parse_bytes(text)
    folder = window.state.source
    window.state.set_source(ModelSource("preset", "gemma4-tiny"))  # nothing to measure
    assert window.state.options.size_budget is None and panel.size_budget.text() == text
    assert f"Size budget {text} is not applied: a preset has no weights" in panel.note.text()
    window.state.set_source(folder)  # back to the checkpoint: the budget that waited applies
    assert panel.size_budget.text() == text
    assert window.state.options.size_budget == parse_bytes(text)
    assert "Size budget" not in panel.note.text()
