"""The live preview: sizes, the largest tensors against the limit, splits, capture readiness."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QLabel,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.precision import PrecisionMix
from app.preview_data import PreviewData
from app.theme import status_color
from app.widgets.deferred import Deferred
from app.widgets.messages import MessageLabel
from app.widgets.tables import RowsTable, fill_table, read_only_table
from engine.units import format_bytes

if TYPE_CHECKING:
    from app.widgets.charts import LargestTensorsChart, SessionSizeChart


WARNINGS_SHOWN = 2
"""Plan warnings written out under the facts; the rest are counted."""
PLOT_HEIGHT = 100
"""The charts' least plot height here: at 1024x700 they share the tab with both tables."""
PRECISION_ROWS = 8
"""Rows the mixed-precision table shows before it scrolls (a decoder has hundreds of
weights; the charts keep the room)."""


def _sizes_chart() -> SessionSizeChart:
    from app.widgets.charts import SessionSizeChart

    chart = SessionSizeChart()
    chart.plot.setMinimumHeight(PLOT_HEIGHT)
    return chart


def _tensors_chart() -> LargestTensorsChart:
    from app.widgets.charts import LargestTensorsChart

    chart = LargestTensorsChart()
    chart.plot.setMinimumHeight(PLOT_HEIGHT)
    return chart


class PreviewPanel(QWidget):
    """Draws a :class:`PreviewData`; shows a placeholder while there is none."""

    drawn = Signal()
    """A preview (not a placeholder) is on screen, charts included."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.data: PreviewData | None = None
        self._stale = False
        self.title = MessageLabel("Planning…")
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        self.title.setFont(font)
        self.facts = MessageLabel()
        self._sizes = Deferred(_sizes_chart)
        self._tensors = Deferred(_tensors_chart)
        self.splits = read_only_table(
            ["Session", "Tensor", "Storage", "Unsplit", "Pieces", "Bytes each", "How"],
            stretch=6,
            rows="prefer",
        )
        # Every session's row shows (the decoder's first): at most a handful, and the reason
        # capture is off is what the box is for.
        self.readiness = read_only_table(["Session", "Graph capture", "Why"], stretch=2, rows="all")
        # Plan warnings are few and short: read under the facts, not in a box of their own.
        self.warnings = MessageLabel()
        self.warnings.setAccessibleName("Warnings")
        # A size budget's mix: one line (the choice, or how to measure one), and each
        # decoder weight's precision once measured.
        self.precision = MessageLabel()
        self.precision.setAccessibleName("Mixed precision")
        self.precision.hide()
        self.precision_table = read_only_table(
            ["Tensor", "Precision", "Bytes", "Measured KLD in INT4"], stretch=0, rows="prefer"
        )

        self.charts = charts = QSplitter(Qt.Orientation.Horizontal)
        charts.addWidget(self._sizes)
        charts.addWidget(self._tensors)
        charts.setSizes([380, 620])
        split_box = _boxed("Split tables", self.splits)
        split_box.setToolTip(
            "What is split to fit the buffer limit, into how many pieces, bytes each"
        )
        self.split_box = split_box
        capture_box = self.capture_box = _boxed("Graph capture", self.readiness)
        capture_box.setToolTip("Graph-capture readiness per session, and why")
        self.precision_box = _boxed("Mixed precision", self.precision_table)
        self.precision_box.setToolTip(
            "The precision of each decoder weight under the size budget, from the measurement"
        )
        self.precision_box.hide()

        layout = QVBoxLayout(self)
        layout.setSpacing(4)
        layout.addWidget(self.title)
        layout.addWidget(self.facts)
        layout.addWidget(self.warnings)
        layout.addWidget(self.precision)
        layout.addWidget(charts, 1)  # what the tables leave
        layout.addWidget(self.precision_box, 0)
        layout.addWidget(split_box, 0)
        layout.addWidget(capture_box, 0)
        # Without a plan the charts and tables hide: this keeps the title and the sentence
        # under it at the top instead of spread over the panel's height.
        self._filler = QWidget()
        self._filler.hide()
        layout.addWidget(self._filler, 1)

    @property
    def sizes(self) -> SessionSizeChart:
        return self._sizes.widget

    @property
    def tensors(self) -> LargestTensorsChart:
        return self._tensors.widget

    def show_preview(self, data: PreviewData | None) -> None:
        """Show ``data`` (None: the plan failed; the banner says why). While the panel is
        hidden the redraw waits for it to be shown: the UI thread shares the GIL with the
        workers, so it does no drawing nobody sees while an export runs."""
        self.data = data
        self._stale = not self.isVisible()
        if not self._stale:
            self._redraw(data)

    def showEvent(self, event: QShowEvent) -> None:
        if self._stale:
            self._stale = False
            self._redraw(self.data)
        super().showEvent(event)

    def _show_warnings(self, warnings: tuple[str, ...]) -> None:
        self.warnings.say(_warning_lines(warnings), "warning")
        self.warnings.setToolTip("\n".join(warnings))
        self.warnings.setVisible(bool(warnings))

    def _redraw(self, data: PreviewData | None) -> None:
        # Without a plan, empty charts and tables would only show meaningless axes.
        for part in (self.charts, self.split_box, self.capture_box):
            part.setVisible(data is not None)
        self._filler.setVisible(data is None)
        if data is None:
            self.title.setText("No preview: the current options cannot be planned")
            self.facts.setText(
                "Why is said above and beside Export. Change the model or the options, and the "
                "preview comes back by itself."
            )
            for table in (self.splits, self.readiness):
                table.setRowCount(0)
            self._show_warnings(())
            self._show_precision(None)
            if self._sizes.ready:  # nothing to draw: no reason to make the charts now
                self.sizes.set_sessions(())
                self.tensors.set_tensors((), None, None)
            return
        self.title.setText(data.title)
        limit = format_bytes(data.buffer_limit) if data.buffer_limit else "none"
        self.facts.setText(
            f"total {format_bytes(data.total_bytes)} ({data.total_bytes:,} B)  ·  "
            f"buffer limit {limit}  ·  context {data.context_length:,}  ·  "
            f"attention {data.attention}  ·  planned in {data.compute_ms:.1f} ms"
        )
        self.sizes.set_sessions(data.sessions)
        self.tensors.set_tensors(data.largest, data.buffer_limit, data.binding_limit)
        fill_table(
            self.splits,
            [
                (
                    s.session,
                    s.name,
                    s.storage,
                    format_bytes(s.unsplit_bytes),
                    s.pieces,
                    format_bytes(s.piece_bytes),
                    s.note or "not split",
                )
                for s in data.splits
            ],
            [status_color("error", self.palette()) if s.still_over else None for s in data.splits],
            [f"{s.piece_bytes:,} B per piece" for s in data.splits],
        )
        if not data.splits:
            limit = format_bytes(data.buffer_limit) if data.buffer_limit else "no limit"
            fill_table(
                self.splits,
                [("", "nothing is split", "", "", "", "", f"every tensor fits ({limit})")],
            )
        fill_table(
            self.readiness,
            [(r.session, r.text, "\n".join(r.reasons)) for r in data.readiness],
            [status_color(r.status, self.palette()) for r in data.readiness],
            [r.tooltip for r in data.readiness],
        )
        self._show_warnings(data.warnings)
        self._show_precision(data.precision)
        self.drawn.emit()

    def _show_precision(self, mix: PrecisionMix | None) -> None:
        self.precision.say(mix.summary if mix else "", mix.level if mix else None)
        self.precision.setVisible(mix is not None)
        self.precision_box.setVisible(bool(mix and mix.tensors))
        fill_table(
            self.precision_table,
            [
                (
                    t.name,
                    t.precision,
                    format_bytes(t.nbytes),
                    "not measured" if t.kld4 is None else f"{t.kld4:.3g}",
                )
                for t in (mix.tensors if mix else ())
            ],
            tooltips=[f"{t.nbytes:,} B" for t in (mix.tensors if mix else ())],
        )
        table = self.precision_table
        if isinstance(table, RowsTable):
            table.setMaximumHeight(table.rows_height(PRECISION_ROWS))


def _warning_lines(warnings: tuple[str, ...]) -> str:
    """The first :data:`WARNINGS_SHOWN` warnings, then how many more (all are in the
    tooltip): a plan can warn about every weight under a very low buffer limit."""
    lines = [f"⚠ {w}" for w in warnings[:WARNINGS_SHOWN]]
    more = len(warnings) - WARNINGS_SHOWN
    if more > 0:
        lines.append(f"⚠ and {more} more (hover here to read them all)")
    return "\n".join(lines)


def _boxed(title: str, widget: QWidget) -> QWidget:
    """``widget`` under a bold title: a group box's frame and margins cost the charts
    the height of a bar at 1024x700."""
    box = QWidget()
    label = QLabel(title)
    label.setBuddy(widget)
    font = label.font()
    font.setBold(True)
    label.setFont(font)
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(2)
    layout.addWidget(label)
    layout.addWidget(widget)
    return box
