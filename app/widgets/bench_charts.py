"""Benchmark charts: every recorded metric of the latest runs (capture off vs on side by
side), and one metric of every run over time. They read the engine's ``BenchResult``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QStackedWidget, QVBoxLayout, QWidget

from app.bench_metrics import METRICS
from app.theme import CAPTURE_OFF, CAPTURE_ON, chart_background, chart_foreground
from app.widgets.charts import ChartBox
from app.widgets.legend import Legend, LegendItem

if TYPE_CHECKING:
    from app.history import BenchRun
    from engine.runtime.bench_record import BenchResult


def spread_text(result: BenchResult) -> str:
    return (
        f"{result.decode_tokens_per_second_min:,.1f}-{result.decode_tokens_per_second_max:,.1f}"
        f" over {result.repeats} runs (spread {result.decode_spread:.0%})"
    )


class LatestRunsChart(QWidget):
    """One small bar chart per metric: capture off and on side by side, each bar labelled
    with its value (so no value axis: its ticks crowd a short plot); decode carries its
    min-max whisker (the spread over repeats). The charts stay on one row while each gets
    :attr:`MIN_PLOT_WIDTH` pixels, then wrap; before any run a sentence says how to get one."""

    MIN_PLOT_WIDTH = 110

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel("Latest runs: capture off vs on")
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.title.setWordWrap(True)
        self.canvas = pg.GraphicsLayoutWidget()
        self.canvas.setMinimumHeight(150)
        self.empty = QLabel("No runs yet: choose a package, then Run benchmark (Ctrl+R).")
        self.empty.setTextFormat(Qt.TextFormat.PlainText)
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.canvas)
        self.legend = Legend()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.title)
        layout.addWidget(self.stack, 1)
        layout.addWidget(self.legend)
        self.plots: dict[str, pg.PlotItem] = {}
        self.columns = 0
        self.setAccessibleName("Latest benchmark runs")
        self.off: BenchResult | None = None
        self.on: BenchResult | None = None
        self._arrange(len(METRICS))
        self.package = ""
        self.set_runs(None, None)

    def _arrange(self, columns: int) -> None:
        """Put the metric plots on a grid of ``columns``."""
        self.columns = columns
        self.canvas.clear()
        self.plots = {}
        for i, metric in enumerate(METRICS):
            plot = self.canvas.addPlot(row=i // columns, col=i % columns)
            plot.setMouseEnabled(x=False, y=False)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.hideAxis("left")
            self.plots[metric.key] = plot

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        fit = max(2, min(len(METRICS), self.width() // self.MIN_PLOT_WIDTH))
        columns = len(METRICS) if fit >= len(METRICS) else min(fit, 3)
        if columns != self.columns:
            self._arrange(columns)
            self.set_runs(self.off, self.on, self.package)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self.set_runs(self.off, self.on, self.package)
        super().changeEvent(event)

    def set_runs(self, off: BenchResult | None, on: BenchResult | None, package: str = "") -> None:
        """The latest runs of ``package`` (its folder's name, said in the title)."""
        self.off, self.on, self.package = off, on, package
        of = f" of {package}" if package else ""
        ran = "capture on" if off is None and on else "capture off" if off and on is None else ""
        self.title.setText(f"Latest runs{of}: {ran or 'capture off vs on'}")
        self.empty.setText(
            f"No runs{of} yet: Run benchmark (Ctrl+R)."
            if package
            else "No runs yet: choose a package, then Run benchmark (Ctrl+R)."
        )
        self.stack.setCurrentWidget(self.canvas if off or on else self.empty)
        palette = self.palette()
        fg = chart_foreground(palette)
        self.canvas.setBackground(chart_background(palette))
        runs = [(0, off, CAPTURE_OFF), (1, on, CAPTURE_ON)]
        lines = []
        for metric in METRICS:
            plot = self.plots[metric.key]
            plot.clear()
            plot.setTitle(f"{metric.title} ({metric.unit})", size="8pt", color=fg)
            axis = plot.getAxis("bottom")
            axis.setPen(pg.mkPen(fg))
            axis.setTextPen(pg.mkPen(fg))
            axis.setTicks([[(0, "off"), (1, "on")]])
            peak = 0.0
            for x, result, color in runs:
                if result is None:
                    continue
                value = metric.read(result)
                top = value
                plot.addItem(pg.BarGraphItem(x=[x], height=[value], width=0.6, brush=color))
                if metric.key == "decode" and result.repeats > 1:
                    low = result.decode_tokens_per_second_min
                    high = result.decode_tokens_per_second_max
                    plot.addItem(
                        pg.ErrorBarItem(
                            x=np.array([x]),
                            y=np.array([value]),
                            top=np.array([high - value]),
                            bottom=np.array([value - low]),
                            beam=0.25,
                            pen=pg.mkPen(fg, width=1.5),
                        )
                    )
                    top = high
                label = pg.TextItem(metric.format(value), color=fg, anchor=(0.5, 1))
                label.setPos(x, top)
                plot.addItem(label)
                peak = max(peak, top)
            plot.setXRange(-0.6, 1.6, padding=0)
            plot.setYRange(0, max(peak, 1e-9) * 1.6, padding=0)  # room for the labels
        for name, result in (("capture off", off), ("capture on", on)):
            if result is not None:
                lines.append(
                    f"{name}: decode {result.decode_tokens_per_second:,.1f} tok/s, "
                    f"{spread_text(result)}"
                )
        speedup = (
            f"; capture speed-up {on.decode_tokens_per_second / off.decode_tokens_per_second:.2f}x"
            if off and on and off.decode_tokens_per_second
            else ""
        )
        # One line under the bars (their labels carry the values): a line per run pushed a
        # 1024x700 window past its height; the tooltip keeps the long form.
        shown = [(name, r) for name, r in (("off", off), ("on", on)) if r is not None]
        counts = {r.repeats for _, r in shown}
        same = len(counts) == 1  # the latest off and on runs may differ in repeats
        spreads = [
            f"{name} {r.decode_tokens_per_second_min:,.1f}-{r.decode_tokens_per_second_max:,.1f}"
            f" ({r.decode_spread:.0%}{'' if same else f', {r.repeats} runs'})"
            for name, r in shown
        ]
        over = f" over {counts.pop()} runs" if same else ""
        note = f"decode spread{over}: {', '.join(spreads)}" if spreads else ""
        self.legend.set_items(
            [LegendItem("capture off", CAPTURE_OFF), LegendItem("capture on", CAPTURE_ON)]
            if lines
            else [],
            note + speedup,
        )
        self.setToolTip("\n".join(lines) + speedup)
        self.setAccessibleDescription("; ".join(lines) + speedup or "no runs yet")


class HistoryChart(ChartBox):
    """One metric of every run, capture off vs on, in the order they ran."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Runs over time", parent)
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        self.plot.setMinimumHeight(100)  # under the latest runs in a 1280x800 window

    def set_history(self, runs: Sequence[BenchRun], key: str = "decode") -> None:
        self.show_data(tuple(runs), key)

    def draw(self, runs: tuple[BenchRun, ...], key: str) -> None:
        self.reset()
        metric = next(m for m in METRICS if m.key == key)
        self.title.setText(f"Runs over time: {metric.title.lower()} ({metric.unit})")
        legend = []
        for capture, color in ((False, CAPTURE_OFF), (True, CAPTURE_ON)):
            points = [
                (i + 1, metric.read(r.result))
                for i, r in enumerate(runs)
                if r.result.graph_capture == capture
            ]
            if points:
                self.plot.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    pen=pg.mkPen(color, width=2),
                    symbol="o",
                    symbolSize=7,
                    symbolBrush=color,
                    symbolPen=None,
                )
                legend.append(LegendItem("capture on" if capture else "capture off", color))
        count = len(runs)
        step = max(1, count // 10)
        self.plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, count + 1, step)]])
        self.plot.setLabel("left", metric.unit)
        self.plot.setLabel("bottom", "run")
        values: list[Any] = [metric.read(r.result) for r in runs]
        self.plot.setYRange(0, max(values or [1]) * 1.15, padding=0)
        self.plot.setXRange(0.5, max(count, 1) + 0.5, padding=0)
        self.legend.set_items(legend, "" if legend else "No runs yet.")
        self.describe(
            f"{count} runs; {metric.title}: " + ", ".join(metric.format(v) for v in values[-10:])
        )
