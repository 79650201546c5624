"""Size against quality before any export: each quantization choice's bytes beside the
mean KL divergence it is predicted to lose (:func:`engine.sensitivity.tradeoff`), as a
table and a chart; the chosen line becomes the size budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.jobs import TradeoffRequest, run_in_process, tradeoff_job
from app.theme import FITS, OVER
from app.widgets.charts import ChartBox, unit_for
from app.widgets.legend import LegendItem
from app.widgets.messages import MessageLabel
from app.widgets.tables import fill_table, read_only_table
from app.wording import error_text
from app.workers import Worker, start_worker
from engine.options import ExportOptions
from engine.sensitivity import Tradeoff, TradeoffPoint
from engine.units import format_bytes

HEADERS = ("Choice", "Size", "vs the first line", "Predicted KLD", "INT8 weights")
NOTE = (
    "Predicted, not measured on packages: each 4-bit weight's KL divergence is measured with "
    "only it in INT4 on the checkpoint's float32 model (the calibration text), and the costs "
    "are added. Verify measures a built package on your text."
)


class TradeoffChart(ChartBox):
    """Package bytes (x) against predicted mean KLD (y, a log scale with a tick per
    decade) of the quantized choices. The float package (KLD 0 by definition, and several
    times their bytes) is named under the chart, not drawn: drawn, it would squeeze them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Size against predicted quality", parent)
        self.selected: int | None = None

    def set_tradeoff(self, tradeoff: Tradeoff | None, selected: int | None = None) -> None:
        self.selected = selected
        self.show_data(tradeoff, selected)

    def draw(self, tradeoff: Tradeoff | None, selected: int | None) -> None:
        self.reset()
        if tradeoff is None:
            return
        quantized = [p for p in tradeoff.points if not p.float_choice]
        scale, unit = unit_for(max(p.nbytes for p in quantized))
        xs = [p.nbytes / scale for p in quantized]
        ys = [_decades(p.predicted_kld) for p in quantized]
        self.plot.addItem(pg.PlotCurveItem(xs, ys, pen=pg.mkPen(FITS, width=2)))
        self.plot.addItem(
            pg.ScatterPlotItem(xs, ys, size=9, brush=pg.mkBrush(FITS), pen=pg.mkPen(FITS))
        )
        items = [LegendItem("quantized: predicted mean KLD", FITS)]
        if selected is not None and not tradeoff.points[selected].float_choice:
            point = tradeoff.points[selected]
            ring = pg.ScatterPlotItem(
                [point.nbytes / scale],
                [_decades(point.predicted_kld)],
                size=17,
                brush=pg.mkBrush(None),
                pen=pg.mkPen(OVER, width=2),
            )
            self.plot.addItem(ring)
            items.append(LegendItem(f"chosen: {point.label}", OVER))
        low, high = math.floor(min(ys)), math.ceil(max(ys))
        if high == low:
            high += 1
        left = self.plot.getAxis("left")
        left.setTicks([[(d, f"1e{d}") for d in range(low, high + 1)]])
        self.plot.setYRange(low, high, padding=0.05)
        span = max(xs) - min(xs) or max(xs)
        self.plot.setXRange(min(xs) - 0.08 * span, max(xs) + 0.08 * span, padding=0)
        self.plot.setLabel("bottom", f"package size ({unit})")
        self.plot.setLabel("left", "mean KLD (nats / token)")
        floats = [p for p in tradeoff.points if p.float_choice]
        note = "; ".join(
            f"{p.label}: {format_bytes(p.nbytes)}, KLD {tradeoff.kld_text(p)}, not drawn"
            for p in floats
        )
        self.legend.set_items(items, note)
        self.updateGeometry()
        self.describe(
            "; ".join(
                f"{p.label}: {format_bytes(p.nbytes)}, KLD {tradeoff.kld_text(p)}"
                for p in tradeoff.points
            )
        )


def _decades(kld: float) -> float:
    """log10 of a KLD, floored at 1e-9 (all-INT8 of a tiny model can predict ~0)."""
    return math.log10(max(kld, 1e-9))


class QualityDialog(QDialog):
    """Measures in a child process (progress, cancel), then shows the choices; ``Use as
    size budget`` hands the chosen line's budget (None: none) to ``on_chosen``. Given a
    ``measured`` tradeoff (the same checkpoint and options, measured before), it shows that
    at once; the line of the ``current`` budget starts selected."""

    def __init__(
        self,
        model_dir: Path,
        options: ExportOptions,
        on_chosen: Callable[[int | None], None],
        parent: QWidget | None = None,
        *,
        measured: Tradeoff | None = None,
        current: int | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Size against quality")
        self.setModal(True)
        self.resize(760, 190)  # the results make it taller
        self.tradeoff: Tradeoff | None = None
        self._current = current
        self._on_chosen = on_chosen
        self._gptq = options.quant_method == "gptq"
        self.status = MessageLabel("Measuring each 4-bit weight on the float model…")
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy until the first weight is measured
        self.table = read_only_table(HEADERS, stretch=0, rows="all")
        self.table.setAccessibleName("Quantization choices")
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.chart = TradeoffChart()
        self.note = MessageLabel(NOTE)
        buttons = QDialogButtonBox()
        self.use = QPushButton("&Use as size budget")
        self.use.setEnabled(False)
        self.use.setToolTip(
            "Set the size budget that exports the selected line (the first line: no budget)"
        )
        buttons.addButton(self.use, QDialogButtonBox.ButtonRole.AcceptRole)
        self.close_button = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        layout = QVBoxLayout(self)
        for widget in (self.status, self.progress, self.table):
            layout.addWidget(widget)
        layout.addWidget(self.chart, 1)
        self.table.hide()  # empty axes and headers say nothing while it measures
        self.chart.hide()
        layout.addStretch(0)  # takes the room only while the chart is hidden
        layout.addWidget(self.note)
        layout.addWidget(buttons)
        self.use.clicked.connect(self._use)
        self.close_button.clicked.connect(self.reject)
        self.table.itemSelectionChanged.connect(self._selected)
        self.worker: Worker | None = None
        if measured is not None:
            self._show(measured)
            return
        request = TradeoffRequest(model_dir, options)
        self.worker = start_worker(
            partial(run_in_process, tradeoff_job, request),
            owner=self,
            name="tradeoff",
            on_returned=self._show,
            on_errored=self._failed,
            on_progress=self._progress,
        )

    @property
    def measuring(self) -> bool:
        return self.worker is not None and self.worker.running

    def _progress(self, fraction: float, message: str) -> None:
        if fraction > 0 and self.progress.maximum() == 0:
            self.progress.setRange(0, 1000)
        self.progress.setValue(round(fraction * 1000))
        self.status.setText(message[:1].upper() + message[1:])

    def _show(self, tradeoff: Tradeoff) -> None:
        self.tradeoff = tradeoff
        self.progress.hide()
        self.close_button.setText("Close")
        measured = len(tradeoff.costs)
        weights = "weight" if measured == 1 else "weights"
        gptq = (
            " GPTQ is measured by its round to nearest, so a GPTQ export loses less."
            if self._gptq
            else ""
        )
        self.status.setText(
            f"{measured} 4-bit {weights} measured. Pick a line, then Use as size budget: the "
            f"budget that exports it.{gptq}"
        )
        base = tradeoff.points[0].nbytes
        fill_table(self.table, [_row(tradeoff, p, base) for p in tradeoff.points])
        self.chart.set_tradeoff(tradeoff)
        self.table.show()
        self.chart.show()
        self.resize(self.width(), max(self.height(), 560))
        budgets = [p.size_budget for p in tradeoff.points]
        if self._current is not None and self._current in budgets:
            self.table.selectRow(budgets.index(self._current))
        self.table.setFocus()

    def _failed(self, exc: BaseException) -> None:
        self.progress.hide()
        self.close_button.setText("Close")
        self.status.say(f"✘ Could not estimate the quality: {error_text(exc)}", "error")

    def _selected(self) -> None:
        row = self.selected_row()
        if self.tradeoff is None or row is None:
            self.use.setEnabled(False)
            return
        point = self.tradeoff.points[row]
        # the float package is another dtype, not a budget of this quantization
        self.use.setEnabled(not point.float_choice)
        self.chart.set_tradeoff(self.tradeoff, row)

    def selected_row(self) -> int | None:
        rows = {index.row() for index in self.table.selectedIndexes()}
        return min(rows) if rows else None

    def _use(self) -> None:
        row = self.selected_row()
        if self.tradeoff is None or row is None:
            return
        self._on_chosen(self.tradeoff.points[row].size_budget)
        self.accept()

    def done(self, result: int) -> None:
        if self.worker is not None:  # closed while measuring: the child stops at its next weight
            self.worker.cancel()
        super().done(result)


def _row(tradeoff: Tradeoff, point: TradeoffPoint, base: int) -> tuple[Any, ...]:
    return (
        point.label,
        format_bytes(point.nbytes),
        f"{point.nbytes / base - 1:+.1%}",
        tradeoff.kld_text(point),
        point.int8 if not point.float_choice else "—",
    )
