"""The form controls every panel builds from :data:`app.wording.CONTROLS`: described (label,
tooltip, accessible name), and greyed with the reason and what enables them."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QCheckBox, QComboBox, QWidget

from app.wording import CONTROLS


def described(widget: Any, key: str, suffix: str = "") -> Any:
    """``widget`` with the tooltip and accessible name of option ``key``."""
    control = CONTROLS[key]
    widget.setToolTip(control.help)
    widget.setAccessibleName(control.name + suffix)
    widget.setAccessibleDescription(control.help)
    return widget


def offer(widget: QWidget, key: str, why: str | None) -> None:
    """Enable or disable option ``key``'s control, with the reason (:func:`allow`)."""
    allow(widget, CONTROLS[key].help, why)


def allow(widget: QWidget, tip: str, why: str | None) -> None:
    """Enable ``widget`` with ``tip`` as its tooltip, or disable it with ``why`` (a
    sentence: why it is unused now and what makes it count) before ``tip``: a greyed
    control that only described itself left the user guessing."""
    widget.setEnabled(why is None)
    widget.setToolTip(tip if why is None else f"{why}\n\n{tip}")


def combo(key: str, items: list[tuple[str, Any]] | None = None) -> QComboBox:
    """A combo box of option ``key``'s choices (or ``items``), described."""
    widget = described(QComboBox(), key)
    for label, data in CONTROLS[key].choices if items is None else items:
        widget.addItem(label, data)
    return widget


def checkbox(key: str) -> QCheckBox:
    return described(QCheckBox(CONTROLS[key].label), key)


def find_data(combo: QComboBox, data: Any) -> int:
    """The index of the item whose data equals ``data``, or -1. Unlike ``findData``, it
    compares Python values: a tuple (the inputs' choices) is found by value, not identity."""
    return next((i for i in range(combo.count()) if combo.itemData(i) == data), -1)
