"""A stand-in for a widget that is costly to create, made once the window has been painted.

pyqtgraph (and numpy under it) costs about a third of a second to import and its plots
tens of milliseconds each to create. Charts are therefore not part of the first frame:
their place is painted empty, and they are made on the next turn of the event loop, or
earlier if something asks for them (data to draw arrives, a test reads them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from PySide6.QtCore import QTimer
from PySide6.QtGui import QPaintEvent
from PySide6.QtWidgets import QVBoxLayout, QWidget

W = TypeVar("W", bound=QWidget)


class Deferred(QWidget, Generic[W]):
    """Holds the place of ``factory()``'s widget and creates it after its first paint."""

    def __init__(self, factory: Callable[[], W], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._factory = factory
        self._widget: W | None = None
        self._scheduled = False
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)

    @property
    def ready(self) -> bool:
        return self._widget is not None

    @property
    def widget(self) -> W:
        """The real widget (created now if it was not yet)."""
        if self._widget is None:
            self._widget = self._factory()
            self._layout.addWidget(self._widget)
        return self._widget

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if self._widget is None and not self._scheduled:
            self._scheduled = True
            QTimer.singleShot(0, self, lambda: self.widget)
