"""Small helpers for read-only tables."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem


def read_only_table(headers: Sequence[str], stretch: int = -1) -> QTableWidget:
    """A compact, sortable-looking, read-only table; column ``stretch`` takes the slack."""
    table = QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(list(headers))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.verticalHeader().setVisible(False)
    table.setAlternatingRowColors(True)
    table.setWordWrap(False)
    # Tab moves on to the next control instead of walking every cell (a read-only table
    # would trap the keyboard); arrows still move between cells.
    table.setTabKeyNavigation(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch % len(headers), QHeaderView.ResizeMode.Stretch)
    table.verticalHeader().setDefaultSectionSize(22)
    return table


def fill_table(
    table: QTableWidget,
    rows: Sequence[Sequence[object]],
    colors: Sequence[str | None] | None = None,
    tooltips: Sequence[str] | None = None,
) -> None:
    """Replace the table's rows; ``colors`` tints whole rows' text."""
    table.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            item = QTableWidgetItem(str(value))
            if colors and colors[r]:
                item.setForeground(QColor(colors[r]))
            if tooltips:
                item.setToolTip(tooltips[r])
            table.setItem(r, c, item)
