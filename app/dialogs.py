"""The app's questions to the user, in one place so tests can answer them.

Each function shows a modal message box and returns the answer. Tests replace
:data:`ask` (``monkeypatch.setattr(dialogs, "ask", ...)``) to answer without a dialog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import QMessageBox, QWidget

Asker = Callable[[QWidget | None, str, str, Sequence[str]], str]
"""(parent, title, text, buttons) -> the text of the button pressed ("" when dismissed)."""


def _message_box(parent: QWidget | None, title: str, text: str, buttons: Sequence[str]) -> str:
    box = QMessageBox(
        QMessageBox.Icon.Question, title, text, QMessageBox.StandardButton.NoButton, parent
    )
    made = []
    for i, label in enumerate(buttons):
        role = (
            QMessageBox.ButtonRole.RejectRole
            if i == len(buttons) - 1
            else QMessageBox.ButtonRole.AcceptRole
        )
        made.append(box.addButton(label, role))
    box.setDefaultButton(made[-1])  # the last one is the safe choice (Cancel)
    box.setEscapeButton(made[-1])
    box.exec()
    clicked = box.clickedButton()
    return next(
        (label for label, button in zip(buttons, made, strict=True) if button is clicked), ""
    )


ask: Asker = _message_box


def confirm(parent: QWidget | None, title: str, text: str, action: str) -> bool:
    """Ask before something that cannot be undone; True when the user chose ``action``."""
    return ask(parent, title, text, (action, "Cancel")) == action


def unsaved_changes(parent: QWidget | None, what: str) -> str:
    """ "save", "discard" or "cancel" for unsaved edits of ``what``."""
    answer = ask(
        parent,
        "Unsaved changes",
        f"{what} has unsaved changes.",
        ("Save", "Discard changes", "Cancel"),
    )
    return {"Save": "save", "Discard changes": "discard"}.get(answer, "cancel")
