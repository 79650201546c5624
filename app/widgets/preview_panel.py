"""The live preview: sizes, the largest tensors against the limit, splits, capture readiness."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QListWidget,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.preview_data import PreviewData
from app.theme import status_color
from app.widgets.deferred import Deferred
from app.widgets.messages import MessageLabel
from app.widgets.tables import fill_table, read_only_table
from engine.units import format_bytes

if TYPE_CHECKING:
    from app.widgets.charts import LargestTensorsChart, SessionSizeChart


def _sizes_chart() -> SessionSizeChart:
    from app.widgets.charts import SessionSizeChart

    return SessionSizeChart()


def _tensors_chart() -> LargestTensorsChart:
    from app.widgets.charts import LargestTensorsChart

    return LargestTensorsChart()


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
            ["Session", "Tensor", "Storage", "Unsplit", "Pieces", "Bytes each", "How"], stretch=6
        )
        self.readiness = read_only_table(["Session", "Graph capture", "Why"], stretch=2)
        self.readiness.setWordWrap(True)
        self.warnings = QListWidget()
        self.warnings.setWordWrap(True)

        charts = QSplitter(Qt.Orientation.Horizontal)
        charts.addWidget(self._sizes)
        charts.addWidget(self._tensors)
        charts.setSizes([380, 620])
        split_box = _boxed("Split tables", self.splits)
        split_box.setToolTip(
            "What is split to fit the buffer limit, into how many pieces, bytes each"
        )
        right = QSplitter(Qt.Orientation.Vertical)
        capture_box = _boxed("Graph capture", self.readiness)
        capture_box.setToolTip("Graph-capture readiness per session, and why")
        right.addWidget(capture_box)
        right.addWidget(_boxed("Warnings", self.warnings))
        tables = QSplitter(Qt.Orientation.Horizontal)
        tables.addWidget(split_box)
        tables.addWidget(right)
        tables.setSizes([600, 400])
        body = QSplitter(Qt.Orientation.Vertical)
        body.addWidget(charts)
        body.addWidget(tables)
        body.setSizes([400, 330])

        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.facts)
        layout.addWidget(body, 1)

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

    def _redraw(self, data: PreviewData | None) -> None:
        if data is None:
            self.title.setText("No preview: the current options cannot be planned")
            self.facts.setText("")
            for table in (self.splits, self.readiness):
                table.setRowCount(0)
            self.warnings.clear()
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
            ["\n".join(r.reasons) + f"\n(source: {r.source})" for r in data.readiness],
        )
        self.readiness.resizeRowsToContents()
        self.warnings.clear()
        self.warnings.addItems(list(data.warnings) or ["No warnings."])
        self.drawn.emit()


def _boxed(title: str, widget: QWidget) -> QGroupBox:
    box = QGroupBox(title)
    layout = QHBoxLayout(box)
    layout.setContentsMargins(4, 4, 4, 4)
    layout.addWidget(widget)
    return box
