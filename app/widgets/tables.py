"""Small helpers for read-only tables.

Columns are sized to their content; the ``stretch`` column (the one with the longest
text) takes the slack, and where the table is too narrow for it, it is the one elided.
Every cell carries its full text (or a row's tooltip) as a tooltip, so nothing elided is
lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

Rows = Literal["scroll", "prefer", "all"]
"""How tall a table is: any height, scrolling its rows (``scroll``); as tall as its rows
where there is room, else down to two rows and scrolling (``prefer``); as tall as its
rows, word-wrapped, never scrolling (``all``: a handful of rows that must all show)."""


def read_only_table(
    headers: Sequence[str], stretch: int = -1, rows: Rows = "scroll"
) -> QTableWidget:
    """A compact, read-only table; column ``stretch`` takes the slack."""
    table = QTableWidget(0, len(headers)) if rows == "scroll" else RowsTable(0, len(headers), rows)
    all_rows = rows == "all"
    for column, text in enumerate(headers):
        item = QTableWidgetItem(text)
        item.setToolTip(text.replace("\n", " "))
        table.setHorizontalHeaderItem(column, item)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.verticalHeader().setVisible(False)
    table.setAlternatingRowColors(True)
    table.setWordWrap(all_rows)
    # Tab moves on to the next control instead of walking every cell (a read-only table
    # would trap the keyboard); arrows still move between cells.
    table.setTabKeyNavigation(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch % len(headers), QHeaderView.ResizeMode.Stretch)
    table.verticalHeader().setDefaultSectionSize(22)
    return table


class RowsTable(QTableWidget):
    """A table whose height follows its rows (see :data:`Rows`)."""

    LEAST_ROWS = 2

    def __init__(self, rows: int, columns: int, fit: Rows, parent: QWidget | None = None) -> None:
        super().__init__(rows, columns, parent)
        self.fit = fit
        if fit == "all":
            self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def rows_height(self, rows: int | None = None) -> int:
        """The height that shows the header and ``rows`` rows (None: every row)."""
        bar = self.horizontalScrollBar()
        extra = bar.sizeHint().height() if bar.isVisible() else 0
        header = self.horizontalHeader().sizeHint().height()
        vertical = self.verticalHeader()
        if rows is None:
            body = vertical.length()
        else:
            shown = min(rows, self.rowCount())
            body = sum(vertical.sectionSize(r) for r in range(shown))
            body += (rows - shown) * vertical.defaultSectionSize()
        return header + body + 2 * self.frameWidth() + extra

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.rows_height())

    def minimumSizeHint(self) -> QSize:
        least = None if self.fit == "all" else self.LEAST_ROWS
        return QSize(super().minimumSizeHint().width(), self.rows_height(least))

    def refit(self) -> None:
        """Row heights for the current column widths, and the table's height for those."""
        self.resizeRowsToContents()
        self.updateGeometry()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():  # the text wraps anew
            self.refit()


def fill_table(
    table: QTableWidget,
    rows: Sequence[Sequence[object]],
    colors: Sequence[str | None] | None = None,
    tooltips: Sequence[str] | None = None,
) -> None:
    """Replace the table's rows; ``colors`` tints whole rows' text. Each cell's tooltip is
    its own text (whole, where the column elides it) and the row's entry of ``tooltips``."""
    table.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            item = QTableWidgetItem(str(value))
            if colors and colors[r]:
                item.setForeground(QColor(colors[r]))
            item.setToolTip(_tooltip(str(value), tooltips[r] if tooltips else ""))
            table.setItem(r, c, item)
    if isinstance(table, RowsTable):
        table.refit()


def _tooltip(text: str, row_tip: str) -> str:
    if not row_tip or text in row_tip:
        return row_tip or text
    return f"{text}\n{row_tip}"
