"""Tab widgets whose inactive tabs show their whole label.

Fusion draws an inactive tab's label shifted down (PM_TabBarTabShiftVertical) inside a
tab only as tall as the text plus PM_TabBarTabVSpace, so the descenders and the
underscore of "genai_config" were cut off. The tab is made taller by twice the shift.
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QStyle, QTabBar, QTabWidget, QWidget


class RoomyTabBar(QTabBar):
    """A tab bar with room for the label's shift on inactive tabs."""

    def tabSizeHint(self, index: int) -> QSize:
        size = super().tabSizeHint(index)
        shift = self.style().pixelMetric(QStyle.PixelMetric.PM_TabBarTabShiftVertical, None, self)
        return QSize(size.width(), size.height() + 2 * max(shift, 0))


def roomy_tabs(parent: QWidget | None = None) -> QTabWidget:
    """A QTabWidget with a :class:`RoomyTabBar`."""
    tabs = QTabWidget(parent)
    tabs.setTabBar(RoomyTabBar(tabs))
    return tabs
