"""The window's one place for errors: a banner above the tabs."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton

from app.state import StudioState
from app.widgets.messages import MessageLabel, plain

SOURCES = {
    "preview": "Preview",
    "export": "Export",
    "verify": "Verify",
    "bench": "Benchmark",
    "config": "Config editor",
    "inspect": "Inspector",
}


class ErrorBanner(QFrame):
    """Shows ``state``'s current error (where it came from, and the engine's message)."""

    def __init__(self, state: StudioState, parent: Any = None) -> None:
        super().__init__(parent)
        self._state = state
        self.setObjectName("errorBanner")
        self.setStyleSheet(
            "#errorBanner { background: #fdecea; border: 1px solid #e57373; border-radius: 4px; }"
            "QLabel { color: #8e0000; }"
        )
        self.where = plain(QLabel())
        font = self.where.font()
        font.setBold(True)
        self.where.setFont(font)
        self.label = MessageLabel()  # the engine's words, exactly: "<= 1" is not a tag
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        icon = plain(QLabel("⚠"))
        icon.setStyleSheet("font-size: 14pt;")
        layout.addWidget(icon)
        layout.addWidget(self.where, 0, Qt.AlignmentFlag.AlignTop)
        layout.addWidget(self.label, 1)
        layout.addWidget(close)
        close.clicked.connect(lambda: state.clear_error(state.error[0]))
        state.errorChanged.connect(self._show)
        self.setVisible(False)

    def _show(self, where: str, message: str) -> None:
        if message:
            self.where.setText(f"{SOURCES.get(where, where)}:")
            self.label.setText(message)
        self.setVisible(bool(message))

    @property
    def text(self) -> str:
        """What the banner says ("Export: …"), empty while it is hidden."""
        return f"{self.where.text()} {self.label.text()}" if self.isVisible() else ""
