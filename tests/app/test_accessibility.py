"""Keyboard and assistive technology: every visible input says what it is and what it does,
mnemonics are not ambiguous, Tab moves on, and the main actions have shortcuts."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLabel,
    QLineEdit,
    QWidget,
)

from app.windows.main_window import MainWindow

INPUTS = (QAbstractButton, QComboBox, QLineEdit, QAbstractSpinBox)


def visible_inputs(root: QWidget) -> list[QWidget]:
    found = []
    for widget in root.findChildren(QWidget):
        if not isinstance(widget, INPUTS) or not widget.isVisible():
            continue
        if isinstance(widget, QLineEdit) and isinstance(widget.parent(), QAbstractSpinBox):
            continue  # a spin box's own editor: the spin box is the control
        if widget.objectName().startswith("qt_") or type(widget).__name__ == "QTabBar":
            continue  # Qt's internals (scroll-area corners, tab scrollers)
        found.append(widget)
    return found


def accessible_name(widget: QWidget) -> str:
    """The control's own name for a screen reader: its accessible name, a button's text, or
    the text of the label whose buddy it is. (Qt's accessibility layer would also fall back
    to an enclosing group box's title, which names the group, not the control.)"""
    if widget.accessibleName().strip():
        return widget.accessibleName().strip()
    if isinstance(widget, QAbstractButton) and widget.text().replace("&", "").strip():
        return widget.text().replace("&", "").strip()
    for label in widget.window().findChildren(QLabel):
        if label.buddy() is widget and label.text().strip():
            return label.text().replace("&", "").strip()
    return ""


def test_a_combo_is_labelled_by_its_buddy_for_screen_readers(window: MainWindow):
    """On Linux (AT-SPI) Qt announces a combo box by its value and its label through the
    "labelled by" relation, which the buddy label provides."""
    combo = window.target_panel.ep
    interface = QAccessible.queryAccessibleInterface(combo)
    labels = [
        other.text(QAccessible.Text.Name)
        for other, relation in interface.relations(QAccessible.Relation.Label)
    ]
    assert any("Execution provider" in label for label in labels), labels


def describe(widget: QWidget) -> str:
    text = getattr(widget, "text", lambda: "")()
    return f"{type(widget).__name__} {text or widget.accessibleName() or widget.objectName()!r}"


@pytest.mark.parametrize("tab", range(5))
def test_every_visible_input_has_a_tooltip_and_a_name(qtbot, window: MainWindow, tab):
    window.tabs.setCurrentIndex(tab)
    window.target_panel.advanced_button.setChecked(True)  # the hidden ones too
    qtbot.wait(20)
    inputs = visible_inputs(window)
    assert len(inputs) >= 25, len(inputs)  # the left panel alone has more than that
    missing_tip = [describe(w) for w in inputs if not w.toolTip().strip()]
    missing_name = [describe(w) for w in inputs if not accessible_name(w)]
    assert not missing_tip, f"no tooltip: {missing_tip}"
    assert not missing_name, f"no accessible name: {missing_name}"


def test_the_check_catches_a_bare_control(qtbot, window: MainWindow):
    from PySide6.QtWidgets import QComboBox

    bare = QComboBox(window.model_panel)
    bare.show()
    assert bare in visible_inputs(window)
    assert not bare.toolTip() and not accessible_name(bare)


def mnemonics(root: QWidget) -> Counter[str]:
    letters: Counter[str] = Counter()
    for widget in root.findChildren(QWidget):
        if not widget.isVisible() or not isinstance(widget, (QAbstractButton, QLabel)):
            continue
        text = widget.text()
        match = re.search(r"&([^&\s])", text.replace("&&", ""))
        if match and (not isinstance(widget, QLabel) or widget.buddy() is not None):
            letters[match.group(1).lower()] += 1
    return letters


@pytest.mark.parametrize("tab", range(5))
def test_mnemonics_are_unambiguous_on_each_screen(qtbot, window: MainWindow, tab):
    window.tabs.setCurrentIndex(tab)
    qtbot.wait(20)
    left = mnemonics(window.left_scroll)
    page = mnemonics(window.tabs.currentWidget())
    menus = Counter(a.text()[a.text().index("&") + 1].lower() for a in window.menuBar().actions())
    assert len(left) >= 12, left  # the left panel's controls carry them
    for name, counts in (("left panel", left), ("tab", page), ("menu bar", menus)):
        clashes = {k: n for k, n in counts.items() if n > 1}
        assert not clashes, f"{name}: {clashes}"
    with_menus = set(page) & set(menus) | set(left) & set(menus)
    assert not with_menus, f"Alt+{with_menus} would be the menu bar's and a control's"


def test_tab_moves_on_from_a_table_instead_of_walking_its_cells(qtbot, window: MainWindow):
    table = window.preview.readiness
    window.tabs.setCurrentWidget(window.preview)
    table.setFocus()
    qtbot.waitUntil(table.hasFocus)
    qtbot.keyClick(table, Qt.Key.Key_Tab)
    assert not table.hasFocus()
    assert not table.tabKeyNavigation()


def test_the_main_actions_have_shortcuts(qtbot, window: MainWindow):
    shortcuts = {key: action.shortcut().toString() for key, action in window.menu_actions.items()}
    assert shortcuts["export"] == "Ctrl+E"
    assert shortcuts["benchmark"] == "Ctrl+R"
    assert shortcuts["copy_cli"] == "Ctrl+Shift+C"
    assert shortcuts["open_package"] == "Ctrl+Shift+O"
    assert shortcuts["about"] == "F1"
    assert [shortcuts[f"tab_{i}"] for i in range(1, 6)] == [f"Ctrl+{i}" for i in range(1, 6)]
    assert shortcuts["cancel"] == "Esc"
    assert not window.menu_actions["cancel"].isEnabled()  # Esc stays with the widgets
    window.activateWindow()
    window.setFocus()
    qtbot.keyClick(window, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.config_editor
    assert QApplication.focusWidget() is not None
