"""Labels for messages: always plain text, optionally in a status colour.

Messages carry the engine's words ("must be <= 1", "fp16 & int4"), paths and names from
config files. A QLabel guesses rich text from a "<" and would then eat "<= 1" as a tag,
so every label that shows such text is a :class:`MessageLabel`: Qt.PlainText, word
wrapped, its colour a palette role (light or dark) instead of a ``<span>``.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel, QWidget

from app.theme import status_color


def plain(label: QLabel) -> QLabel:
    """``label`` showing its text as typed (a "<" or "&" stays a character)."""
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


class MessageLabel(QLabel):
    """A word-wrapped plain-text label; :meth:`say` sets its text and status colour."""

    def __init__(self, text: str = "", parent: QWidget | None = None, wrap: bool = True) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(wrap)
        self.level: str | None = None
        """The status colour's name (:mod:`app.theme`), or None for the palette's text."""
        self._painting = False
        self._colored = False
        """A status colour is set on the palette (and must be taken off for plain text)."""
        self.setText(text)

    def say(self, text: str, level: str | None = None) -> None:
        """Show ``text`` (plain) in the colour of ``level`` (None: ordinary text)."""
        self.level = level
        self._recolor()
        self.setText(text)

    def clear_message(self) -> None:
        self.say("")

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and not self._painting:
            self._recolor()  # light <-> dark: the status colour's other variant

    def _recolor(self) -> None:
        wanted = QPalette()  # only the roles set on it override the inherited palette
        if self.level is not None:
            color = QColor(status_color(self.level, self.palette()))
            if self.palette().color(QPalette.ColorRole.WindowText) == color:
                return
            wanted.setColor(QPalette.ColorRole.WindowText, color)
        elif not self._colored:
            return  # the inherited colours (or a style sheet's) stay
        self._colored = self.level is not None
        self._painting = True  # setPalette sends a PaletteChange of its own
        try:
            self.setPalette(wanted)
        finally:
            self._painting = False
