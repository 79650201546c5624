"""A chart legend whose entries wrap between one another, never inside one.

Each entry is a painted swatch (a box, or a dashed or dotted line for a limit) and its
plain-text words, kept on one line; the entries flow onto as many rows as the width
needs. Sentences that are not entries (a limit off the scale, a run's numbers) go in a
word-wrapped note under them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLayout, QLayoutItem, QVBoxLayout, QWidget

from app.widgets.messages import MessageLabel

Mark = Literal["box", "dash", "dot"]


@dataclass(frozen=True)
class LegendItem:
    text: str
    color: str
    mark: Mark = "box"


class FlowLayout(QLayout):
    """Lays its items out left to right, starting a new row when one does not fit."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 12) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._arrange(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, move=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _arrange(self, rect: QRect, move: bool) -> int:
        """Place the items in ``rect`` (when ``move``); the height they take."""
        x, y, row_height = rect.x(), rect.y(), 0
        for item in self._items:
            hint = item.sizeHint()
            if x > rect.x() and x + hint.width() > rect.right() + 1:
                x, y, row_height = rect.x(), y + row_height + 2, 0
            if move:
                width = min(hint.width(), rect.width())
                item.setGeometry(QRect(QPoint(x, y), QSize(width, hint.height())))
            x += hint.width() + self._spacing
            row_height = max(row_height, hint.height())
        return y + row_height - rect.y()


class Swatch(QWidget):
    """A colour sample: a filled box, or a dashed or dotted line."""

    def __init__(self, color: str, mark: Mark, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.color = color
        self.mark = mark
        self.setFixedSize(22 if mark != "box" else 12, 12)

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        color = QColor(self.color)
        if self.mark == "box":
            painter.fillRect(self.rect(), color)
            return
        style = Qt.PenStyle.DashLine if self.mark == "dash" else Qt.PenStyle.DotLine
        painter.setPen(QPen(color, 2, style))
        middle = self.height() // 2
        painter.drawLine(0, middle, self.width(), middle)


class LegendEntry(QWidget):
    """One swatch and its words, on one line."""

    def __init__(self, item: LegendItem, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.item = item
        self.swatch = Swatch(item.color, item.mark)
        self.label = QLabel(item.text)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.swatch)
        layout.addWidget(self.label)


class Legend(QWidget):
    """Entries that flow onto rows, and a note under them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entries: list[LegendEntry] = []
        self._box = QWidget()
        self._flow = FlowLayout(self._box)
        self.note = MessageLabel()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self._box)
        layout.addWidget(self.note)
        self.note.setVisible(False)

    def set_items(self, items: Sequence[LegendItem], note: str = "") -> None:
        """Show these entries (in order) and ``note`` under them."""
        for entry in self.entries:
            self._flow.removeWidget(entry)
            entry.hide()  # at once: deleteLater waits for the event loop
            entry.deleteLater()
        self.entries = [LegendEntry(item, self._box) for item in items]
        for entry in self.entries:
            self._flow.addWidget(entry)
            entry.show()
        self._box.setVisible(bool(self.entries))
        self.note.setText(note)
        self.note.setVisible(bool(note))
        self._flow.invalidate()
        self.updateGeometry()

    def clear(self) -> None:
        self.set_items(())

    @property
    def items(self) -> list[LegendItem]:
        return [entry.item for entry in self.entries]

    @property
    def colors(self) -> dict[str, str]:
        """Each entry's words and its colour."""
        return {item.text: item.color for item in self.items}

    def text(self) -> str:
        """Everything the legend says, as plain text."""
        return "  ".join([item.text for item in self.items] + [self.note.text()]).strip()
