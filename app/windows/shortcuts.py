"""The window's own shortcuts work from every field.

A focused text field claims the keys it edits with (a ShortcutOverride event), and which
keys those are depends on the platform: on X11 and in KDE and GNOME key bindings, Ctrl+E
moves a QLineEdit's cursor to the end of the line, so Ctrl+E (Export) did nothing while
the cursor was in the output folder. The studio's run and view shortcuts (export,
benchmark, tabs) are worth more than a second End key: this filter turns down the field's
claim for them, so the action fires wherever the focus is.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QWidget


class WindowShortcuts(QObject):
    """Lets ``actions``' shortcuts beat any field of ``window`` that would take the key."""

    def __init__(self, window: QWidget, actions: Iterable[QAction]) -> None:
        super().__init__(window)
        self._window = window
        self.actions = list(actions)
        app = QApplication.instance()
        if app is not None:
            app.installEventFilter(self)  # removed by Qt when this object goes

    def claims(self, event: QKeyEvent) -> QAction | None:
        """The enabled action whose shortcut is this key, if any."""
        key = QKeySequence(event.keyCombination())
        for action in self.actions:
            shortcut = action.shortcut()
            if (
                action.isEnabled()
                and not shortcut.isEmpty()
                and shortcut.matches(key) == QKeySequence.SequenceMatch.ExactMatch
            ):
                return action
        return None

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(watched, QWidget)
            and isinstance(event, QKeyEvent)
            and watched.window() is self._window
            and self.claims(event) is not None
        ):
            event.ignore()  # not overridden: the shortcut map triggers the action
            return True
        return False
