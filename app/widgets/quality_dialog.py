"""Size against quality before any export: each quantization choice's bytes beside the
mean KL divergence it is predicted to lose (:func:`engine.sensitivity.tradeoff`), as a
table and a chart; the chosen line becomes the size budget, a readable size that exports
it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QLineF, QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.jobs import TradeoffRequest, tradeoff_job
from app.theme import FITS, OVER
from app.widgets.charts import ChartBox, unit_for
from app.widgets.legend import LegendItem
from app.widgets.messages import MessageLabel
from app.widgets.tables import fill_table, read_only_table
from app.wording import error_text
from app.workers import Worker, start_worker
from engine.child import run_in_child
from engine.options import ExportOptions
from engine.sensitivity import TRADEOFF_EXTRA, Tradeoff, TradeoffPoint, pick
from engine.units import exact_size, format_bytes, parse_bytes, rounded_up_size

HEADERS = ("Choice", "Size", "vs the first line", "Predicted KLD", "INT8 weights")
NOTE = (
    "Predicted, not measured on packages: each 4-bit weight's KL divergence is measured with "
    "only it in INT4 on the checkpoint's float32 model (the calibration text), and the costs "
    "are added. Verify measures a built package on your text."
)
DOT = 11
"""Pixels across a point: a target for a click."""


class TradeoffChart(ChartBox):
    """Package bytes (x) against predicted mean KLD (y, a log scale with a tick per
    decade) of the quantized choices, each point marked with a short name (:func:`mark`)
    and clickable (``pointClicked``). The float package (KLD 0 by definition, and several
    times their bytes) is named under the chart, not drawn: drawn, it would squeeze them."""

    pointClicked = Signal(int)
    """The index, in the tradeoff's points, of the point clicked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Size against predicted quality", parent)
        self.selected: int | None = None
        self.marks: list[pg.TextItem] = []
        """The points' names as drawn, in the order of the points."""
        self._marked: list[QPointF] = []
        """Where each of :attr:`marks` belongs (data coordinates)."""
        self.plot.getViewBox().sigResized.connect(self._place_marks)

    def set_tradeoff(self, tradeoff: Tradeoff | None, selected: int | None = None) -> None:
        self.selected = selected
        self.show_data(tradeoff, selected)

    def draw(self, tradeoff: Tradeoff | None, selected: int | None) -> None:
        self.reset()
        self.marks, self._marked = [], []
        if tradeoff is None:
            return
        drawn = [i for i, p in enumerate(tradeoff.points) if not p.float_choice]
        quantized = [tradeoff.points[i] for i in drawn]
        scale, unit = unit_for(max(p.nbytes for p in quantized))
        xs = [p.nbytes / scale for p in quantized]
        ys = [_decades(p.predicted_kld) for p in quantized]
        self.plot.addItem(pg.PlotCurveItem(xs, ys, pen=pg.mkPen(FITS, width=2)))
        dots = pg.ScatterPlotItem(
            xs, ys, data=drawn, size=DOT, brush=pg.mkBrush(FITS), pen=pg.mkPen(FITS)
        )
        dots.sigClicked.connect(self._clicked)
        self.plot.addItem(dots)
        for point, x, y in zip(quantized, xs, ys, strict=True):
            text = pg.TextItem(mark(tradeoff, point), color=self.foreground)
            self.plot.addItem(text)
            text.setPos(x, y)
            self.marks.append(text)
            self._marked.append(QPointF(x, y))
        items = [LegendItem("quantized: predicted mean KLD (click a point to pick it)", FITS)]
        chosen = ""
        if selected is not None and not tradeoff.points[selected].float_choice:
            point = tradeoff.points[selected]
            ring = pg.ScatterPlotItem(
                [point.nbytes / scale],
                [_decades(point.predicted_kld)],
                size=17,
                brush=pg.mkBrush(None),
                pen=pg.mkPen(OVER, width=2),
            )
            ring.setAcceptedMouseButtons(Qt.MouseButton.NoButton)  # clicks reach the dots
            self.plot.addItem(ring)
            items.append(LegendItem(f"chosen: {point.label}", OVER))
            chosen = f"; chosen: {point.label}"
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
        self._place_marks()
        self.describe(
            "; ".join(
                f"{p.label}{_marked_as(tradeoff, p)}: {format_bytes(p.nbytes)}, "
                f"KLD {tradeoff.kld_text(p)}" + (", not drawn" if p.float_choice else "")
                for p in tradeoff.points
            )
            + chosen
        )

    def _clicked(self, item: Any, points: Any, event: Any) -> None:
        if len(points):
            self.pointClicked.emit(int(points[0].data()))

    def _place_marks(self, *_: Any) -> None:
        """Put each name beside its point where it stays inside the plot and covers the
        least: another name worst, then a point, then the curve. Above right first, else
        below left (the curve falls to the right, so both sides are clear of it), else the
        other two corners."""
        view = self.plot.getViewBox()
        bounds = view.boundingRect()
        dots = [view.mapFromView(p) for p in self._marked]
        segments = [QLineF(a, b) for a, b in itertools.pairwise(dots)]
        radius = DOT / 2 + 1
        boxes = [QRectF(d.x() - radius, d.y() - radius, 2 * radius, 2 * radius) for d in dots]
        placed: list[QRectF] = []
        for index, (text, dot) in enumerate(zip(self.marks, dots, strict=True)):
            size = text.textItem.boundingRect().size()
            margin = text.textItem.document().documentMargin()  # blank around the glyphs
            width, height = size.width() - 2 * margin, size.height() - 2 * margin
            others = boxes[:index] + boxes[index + 1 :]
            scored = []
            for right, down in ((1, -1), (-1, 1), (-1, -1), (1, 1)):
                left = dot.x() + radius if right > 0 else dot.x() - radius - width
                top = dot.y() + radius if down > 0 else dot.y() - radius - height
                glyphs = QRectF(left, top, width, height)
                cover = 3 * sum(glyphs.intersects(r) for r in placed)
                cover += 2 * sum(glyphs.intersects(r) for r in others)
                cover += sum(_crosses(glyphs, s) for s in segments)
                scored.append(((not bounds.contains(glyphs), cover), glyphs))
            _, glyphs = min(scored, key=lambda score: score[0])  # the first of the best
            corner = glyphs.topLeft() - QPointF(margin, margin)  # of the text's whole box
            text.setAnchor(
                ((dot.x() - corner.x()) / size.width(), (dot.y() - corner.y()) / size.height())
            )
            placed.append(glyphs)


def _decades(kld: float) -> float:
    """log10 of a KLD, floored at 1e-9 (all-INT8 of a tiny model can predict ~0)."""
    return math.log10(max(kld, 1e-9))


def _crosses(rect: QRectF, segment: QLineF) -> bool:
    """The segment passes through the rectangle (or ends in it)."""
    if rect.contains(segment.p1()) or rect.contains(segment.p2()):
        return True
    corners = (rect.topLeft(), rect.topRight(), rect.bottomRight(), rect.bottomLeft())
    return any(
        segment.intersects(QLineF(a, b))[0] == QLineF.IntersectionType.BoundedIntersection
        for a, b in zip(corners, corners[1:] + corners[:1], strict=True)
    )


def line_extras(tradeoff: Tradeoff) -> dict[float, TradeoffPoint | None]:
    """Each share of :data:`~engine.sensitivity.TRADEOFF_EXTRA` and its mix line (None:
    :func:`~engine.sensitivity.tradeoff` gave it none), found by the budget it spends."""
    base = tradeoff.points[0].nbytes
    mixes = {p.size_budget: p for p in _quantized(tradeoff)[1:-1]}
    return {extra: mixes.get(int(base * (1 + extra))) for extra in TRADEOFF_EXTRA}


def mark(tradeoff: Tradeoff, point: TradeoffPoint) -> str:
    """A point's name on the chart: ``all INT4`` (or ``as chosen``), ``+10%``, ``INT8``."""
    quantized = _quantized(tradeoff)
    if point == quantized[0]:
        return point.label.partition(",")[0]
    if point == quantized[-1]:
        return "INT8"
    shares = [extra for extra, line in line_extras(tradeoff).items() if line == point]
    return f"+{shares[0]:.0%}" if shares else point.label


def _marked_as(tradeoff: Tradeoff, point: TradeoffPoint) -> str:
    shown = "" if point.float_choice else mark(tradeoff, point)
    return f" (marked {shown})" if shown and shown != point.label else ""


def missing_lines(tradeoff: Tradeoff) -> str:
    """Why mix lines of :data:`~engine.sensitivity.TRADEOFF_EXTRA` are absent: their budget
    reaches every 4-bit weight in INT8 (which the INT8 line already is), or buys nothing
    the line above does not ("" when every share has its line)."""
    base, all_int8 = tradeoff.points[0].nbytes, _quantized(tradeoff)[-1].nbytes
    absent = [extra for extra, line in line_extras(tradeoff).items() if line is None]
    beyond = [extra for extra in absent if int(base * (1 + extra)) >= all_int8]
    idle = [extra for extra in absent if extra not in beyond]
    sentences = []
    if idle:
        buys = "its budget buys" if len(idle) == 1 else "their budgets buy"
        sentences.append(
            f"No {_shares(idle)} line: {buys} no more INT8 weights than the line above."
        )
    if beyond:
        sentences.append(
            f"No {_shares(beyond)} line: every 4-bit weight in INT8 is only "
            f"{all_int8 / base - 1:+.1%}."
        )
    return " ".join(sentences)


def _shares(extras: Sequence[float]) -> str:
    """``+5%``, ``+5% or +10%``, ``+5%, +10% or +20%``."""
    words = [f"+{extra:.0%}" for extra in extras]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def budget_text(tradeoff: Tradeoff, point: TradeoffPoint, options: ExportOptions) -> str:
    """The size budget that exports ``point``, as the budget box shows it ("" for none):
    rounded up to a readable size (:func:`~engine.units.rounded_up_size`) where the export
    picks the same INT8 weights under it, else exact (the few bytes more would fit
    another INT8 weight)."""
    if point.size_budget is None:
        return ""
    costs, base = list(tradeoff.costs), tradeoff.points[0].nbytes

    def chosen(budget: int) -> tuple[list[str], int]:
        options_then = replace(options, size_budget=budget, target_kld=None)
        names, _, nbytes = pick(costs, options_then, base)
        return sorted(names), nbytes

    wanted = chosen(point.size_budget)
    for decimals in (2, 3):
        text = rounded_up_size(point.size_budget, decimals)
        if chosen(parse_bytes(text)) == wanted:
            return text
    return exact_size(point.size_budget)


def _quantized(tradeoff: Tradeoff) -> list[TradeoffPoint]:
    """The points but the float package: the base, the mixes, every 4-bit weight in INT8."""
    return [p for p in tradeoff.points if not p.float_choice]


class QualityDialog(QDialog):
    """Measures in a child process (progress, cancel), then shows the choices; ``Use as
    size budget`` (or Enter in the table) hands the chosen line's budget as the budget box
    shows it (:func:`budget_text`; "" for none) to ``on_chosen``, and a click on a point of
    the chart selects its line. Given a ``measured`` tradeoff (the same checkpoint and
    options, measured before), it shows that at once; the line of the ``current`` budget
    starts selected."""

    def __init__(
        self,
        model_dir: Path,
        options: ExportOptions,
        on_chosen: Callable[[str], None],
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
        self._options = options
        self._budgets: list[str] = []
        """Each line's size budget as the budget box shows it."""
        self._calibrated = options.quant_method if options.calibrated else None
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
        self.chart.pointClicked.connect(self.table.selectRow)
        self.worker: Worker | None = None
        if measured is not None:
            self._show(measured)
            return
        request = TradeoffRequest(model_dir, options)
        self.worker = start_worker(
            partial(run_in_child, tradeoff_job, request),
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
        gptq = {
            "gptq": " GPTQ is measured by its round to nearest, so a GPTQ export loses less.",
            "awq": " AWQ is measured by round to nearest (its scales are found at export).",
            "awq-gptq": " AWQ + GPTQ is measured by round to nearest, so its export loses less.",
        }.get(self._calibrated or "", "")
        missing = missing_lines(tradeoff)
        self.status.setText(
            f"{measured} 4-bit {weights} measured.{' ' + missing if missing else ''} Pick a "
            f"line (or a point), then Use as size budget: the budget that exports it.{gptq}"
        )
        base = tradeoff.points[0].nbytes
        fill_table(self.table, [_row(tradeoff, p, base) for p in tradeoff.points])
        self._budgets = [budget_text(tradeoff, p, self._options) for p in tradeoff.points]
        self.chart.set_tradeoff(tradeoff)
        self.table.show()
        self.chart.show()
        self.resize(self.width(), max(self.height(), 560))
        row = self._line_of(self._current)
        if row is not None:
            self.table.selectRow(row)
        self.table.setFocus()

    def _line_of(self, budget: int | None) -> int | None:
        """The line a size budget exports: its own budget, or the readable one it showed."""
        if self.tradeoff is None or budget is None:
            return None
        for row, (point, text) in enumerate(zip(self.tradeoff.points, self._budgets, strict=True)):
            if text and budget in (point.size_budget, parse_bytes(text)):
                return row
        return None

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
        if self.tradeoff is None or row is None or self.tradeoff.points[row].float_choice:
            return
        self._on_chosen(self._budgets[row])
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
