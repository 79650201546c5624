"""The Preview under a size budget: each decoder weight's precision and the predicted size
from the session's measurement (the engine's own pick), or one line saying how to get one.
Measurements are the tiny Qwen2 checkpoint's real plans with made-up costs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.preview_data import compute_preview
from app.windows.main_window import MainWindow
from app.wording import CONTROLS
from engine.models import load_spec
from engine.options import ExportOptions
from engine.plan import plan
from engine.sensitivity import Tradeoff, pick
from tests.app.conftest import Measured, wait_for_preview

INT4 = dict(ep="cpu", weight_bits=4, embedding_bits=4, block_size=16)


def _mix_line(tradeoff: Tradeoff) -> tuple[int, set[str], int]:
    """The "+10%" line's budget, and the INT8 weights and bytes the export picks under it."""
    point = next(p for p in tradeoff.points if p.label == "INT4 + INT8, +10% bytes")
    assert point.size_budget is not None
    options = ExportOptions(**INT4, size_budget=point.size_budget)
    names, _, nbytes = pick(list(tradeoff.costs), options, tradeoff.points[0].nbytes)
    return point.size_budget, set(names), nbytes


def test_a_measured_budget_shows_each_weights_precision_and_the_predicted_size(
    qwen2: Path, measured: Measured
):
    """With the session's measurement, the preview is the plan the export makes: the INT8
    weights the engine picks under the budget, the rest INT4, and its bytes."""
    tradeoff = measured(ExportOptions(**INT4))
    budget, int8, nbytes = _mix_line(tradeoff)
    assert int8  # the +10% line buys some INT8 weights
    preview = compute_preview(load_spec(qwen2), ExportOptions(**INT4, size_budget=budget), tradeoff)
    mix = preview.precision
    assert mix is not None and mix.level is None
    precisions = {t.name: t.precision for t in mix.tensors}
    assert {name for name, p in precisions.items() if p == "INT8"} == int8
    assert {c.name for c in tradeoff.costs} <= set(precisions)  # every measured weight
    assert all(precisions[c.name] in ("INT4", "INT8") for c in tradeoff.costs)
    assert [t.precision for t in mix.tensors][: len(int8)] == ["INT8"] * len(int8)
    assert preview.total_bytes == nbytes  # the predicted size, from the same pick
    assert preview.plan.nbytes == nbytes
    assert f"{len(int8)} of {len(tradeoff.costs)} 4-bit weights in INT8" in mix.summary
    assert "predicted mean KLD" in mix.summary and "\n" not in mix.summary


def test_without_a_measurement_one_line_says_the_mix_is_chosen_at_export(qwen2: Path):
    spec = load_spec(qwen2)
    options = ExportOptions(**INT4, size_budget=10**9)
    preview = compute_preview(spec, options)
    mix = preview.precision
    assert mix is not None and mix.tensors == ()
    assert "chosen at export" in mix.summary and "\n" not in mix.summary
    assert f"“{CONTROLS['tradeoff'].name}”" in mix.summary  # how to get one now
    assert preview.total_bytes == plan(spec, ExportOptions(**INT4)).nbytes  # all-INT4
    assert compute_preview(spec, ExportOptions(**INT4)).precision is None  # no budget


def test_a_budget_below_all_int4_is_said_to_be_refused(qwen2: Path, measured: Measured):
    tradeoff = measured(ExportOptions(**INT4))
    base = tradeoff.points[0].nbytes
    options = ExportOptions(**INT4, size_budget=base - 1)
    mix = compute_preview(load_spec(qwen2), options, tradeoff).precision
    assert mix is not None and mix.level == "warning"
    assert "below the all-INT4 package" in mix.summary and "refuses" in mix.summary


def test_the_preview_shows_the_mix_once_the_session_has_measured(
    qtbot,
    window: MainWindow,
    qwen2: Path,
    measured: Measured,
    screens: Callable[..., Path],
):
    """A budget with nothing measured: the one line, no table. The measurement (as Compare
    keeps it) arrives: the preview re-plans by itself and lists each weight's precision."""
    window.model_panel.kind_buttons.button(1).click()  # a checkpoint folder, as a user picks
    window.model_panel.folder.setText(str(qwen2))
    window.model_panel.folder.editingFinished.emit()
    window.state.update_options(**INT4)
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("my-qwen2"))
    tradeoff = measured(window.state.options)
    budget, int8, nbytes = _mix_line(tradeoff)
    window.tabs.setCurrentWidget(window.preview)
    window.state.update_options(size_budget=budget)
    wait_for_preview(qtbot, window, lambda p: p.precision is not None)
    panel = window.preview
    assert panel.precision.isVisible() and "chosen at export" in panel.precision.text()
    assert not panel.precision_box.isVisible()
    screens(window, "preview-budget-not-measured")

    window.state.set_tradeoff(window.state.source, window.state.options, tradeoff)
    wait_for_preview(qtbot, window, lambda p: bool(p.precision and p.precision.tensors))
    QApplication.processEvents()
    assert panel.precision_box.isVisible() and "4-bit weights in INT8" in panel.precision.text()
    table = panel.precision_table
    shown = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    assert {name for name, p in shown.items() if p == "INT8"} == int8
    assert f"({nbytes:,} B)" in panel.facts.text()  # the predicted total
    screens(window, "preview-mixed-precision")
