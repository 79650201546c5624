"""genai_config.json editor: a typed tree, per-session capture toggles, lint, faithful save.

All rules live in :mod:`engine.genai_doc`; this widget shows the document, forwards edits
and shows the reason when one is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPalette, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QListWidget,
    QPushButton,
    QSplitter,
    QStyledItemDelegate,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from app import dialogs
from app.state import StudioState
from app.theme import is_dark, status_color
from app.widgets.messages import MessageLabel
from engine.genai_doc import ConfigValueError, GenaiConfigError, GenaiDoc, JsonPath, rule_for

PATH_ROLE = Qt.ItemDataRole.UserRole + 1


def lint_brush(palette: QPalette) -> QBrush:
    """The background of a field the lint flags: amber, dark enough for light text in a
    dark palette."""
    return QBrush(QColor("#5c4a00" if is_dark(palette) else "#fff3cd"))


def is_container(value: Any) -> bool:
    """Objects, and lists holding objects or lists, are branches; the rest are edited whole."""
    return isinstance(value, dict) or (
        isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)
    )


def display(value: Any) -> str:
    """How a value reads in the tree (strings bare, everything else as JSON)."""
    if is_container(value):
        count, noun = len(value), "key" if isinstance(value, dict) else "item"
        text = f"{count} {noun}{'' if count == 1 else 's'}"
        return f"{{{text}}}" if isinstance(value, dict) else f"[{text}]"
    return value if isinstance(value, str) else json.dumps(value)


class _ValueDelegate(QStyledItemDelegate):
    """Sends an edit through the document; a refused value never reaches the model."""

    def __init__(self, editor: ConfigEditor) -> None:
        super().__init__(editor)
        self._editor = editor

    def setModelData(
        self,
        widget: QWidget,
        model: QAbstractItemModel,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        text = widget.property("text")
        path = index.data(PATH_ROLE)
        if isinstance(text, str) and path is not None:
            self._editor.set_value_text(tuple(path), text)


class ConfigEditor(QWidget):
    """Opens, edits and saves one genai_config.json at a time."""

    opened = Signal(str)
    saved = Signal(str)
    refused = Signal(str)

    def __init__(self, state: StudioState, parent: Any = None) -> None:
        super().__init__(parent)
        self._state = state
        self.doc: GenaiDoc | None = None
        self._keys: dict[JsonPath, QStandardItem] = {}
        self._values: dict[JsonPath, QStandardItem] = {}
        self.open_button = _button("&Open…", "Open a genai_config.json (or a package folder)")
        self.save_button = _button("&Save", "Save the file (Ctrl+S); asks first if lint flags it")
        self.save_as_button = _button("Save &as…", "Save to another file")
        self.reload_button = _button("Reloa&d", "Read the file again (asks before losing edits)")
        self.path_label = MessageLabel(
            "No file open. Export a package or open any genai_config.json."
        )
        self.model = QStandardItemModel(0, 3)
        self.model.setHorizontalHeaderLabels(["Field", "Value", "Type"])
        self.tree = QTreeView()
        self.tree.setModel(self.model)
        self.tree.setAccessibleName("genai_config fields")
        self.tree.setToolTip("Double-click (or F2) a value to edit it; Enter applies, Esc cancels")
        self.tree.setAlternatingRowColors(True)
        self.tree.setItemDelegateForColumn(1, _ValueDelegate(self))
        self.tree.setColumnWidth(0, 250)
        self.tree.setColumnWidth(1, 200)
        self.capture_box = QGroupBox("Graph capture per session")
        self.capture_layout = QVBoxLayout(self.capture_box)
        self.captures: dict[str, QCheckBox] = {}
        self.lint = QListWidget()
        self.lint.setWordWrap(True)
        self.lint.setAccessibleName("Lint: known traps")
        self.message = MessageLabel()
        self.message.setAccessibleName("genai_config message")

        bar = QHBoxLayout()
        for button in (self.open_button, self.save_button, self.save_as_button, self.reload_button):
            bar.addWidget(button)
        bar.addWidget(self.path_label, 1)
        lint_box = QGroupBox("Lint: known traps")
        QVBoxLayout(lint_box).addWidget(self.lint)
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(self.capture_box)
        side_layout.addWidget(lint_box, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.tree)
        split.addWidget(side)
        split.setSizes([720, 300])
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(split, 1)
        layout.addWidget(self.message)

        self.open_button.clicked.connect(self.choose_file)
        self.save_button.clicked.connect(lambda: self.save())
        self.save_as_button.clicked.connect(self._save_as)
        self.reload_button.clicked.connect(self.reload)
        state.packageChanged.connect(self._package_changed)
        self._refresh_buttons()

    # ------------------------------------------------------------------ file

    def open(self, path: str) -> bool:
        """Open a genai_config.json (or a package folder); errors go to the error banner.
        Unsaved edits of the open file are not dropped without asking."""
        if not self.maybe_keep_edits():
            return False
        try:
            doc = GenaiDoc.load(path)
        except GenaiConfigError as exc:
            self._state.report_error("config", f"Cannot open the config: {exc}")
            return False
        self._state.clear_error("config")
        self.doc = doc
        self._rebuild()
        self.message.say("")
        self.opened.emit(str(doc.path))
        return True

    def _package_changed(self, folder: str) -> None:
        """A new package (an export, or one chosen to benchmark): its config is opened
        here when no file is, so the tab shows it rather than "No file open"."""
        config = Path(folder) / "genai_config.json"
        if self.doc is None and folder and config.is_file():
            self.open(str(config))

    def reload(self) -> bool:
        """Read the file again; asks before dropping unsaved edits."""
        if self.doc is None or self.doc.path is None:
            return False
        path = str(self.doc.path)
        if not self.maybe_keep_edits():
            return False
        self.doc = None  # the edits are saved or given up: nothing left to ask about
        return self.open(path)

    def maybe_keep_edits(self) -> bool:
        """True when it is fine to drop the open document: nothing unsaved, or the user
        saved or discarded it; False when the user cancelled (or saving failed)."""
        if self.doc is None or not self.doc.modified:
            return True
        answer = dialogs.unsaved_changes(self, str(self.doc.path or "genai_config.json"))
        if answer == "save":
            return self.save()
        return answer == "discard"

    def save(self, path: str | None = None) -> bool:
        """Save (to ``path`` or the file it came from); unchanged files stay byte-identical.
        When the lint flags values, the user is asked first."""
        if self.doc is None:
            return False
        flagged = self.doc.problems() + self.doc.lint()
        if flagged and not dialogs.confirm(
            self,
            "Save a flagged genai_config?",
            f"The lint flags {len(flagged)} value(s):\n\n"
            + "\n".join(f"• {lint.message}" for lint in flagged)
            + "\n\nonnxruntime-genai may refuse or misbehave with them. Save anyway?",
            "Save anyway",
        ):
            self.message.say("Not saved: the flagged values are still in the editor.")
            return False
        unchanged = not self.doc.modified
        try:
            written = self.doc.save(path)
        except GenaiConfigError as exc:
            self._state.report_error("config", f"Cannot save the config: {exc}")
            return False
        note = " (no changes: written byte for byte as read)" if unchanged else ""
        self.message.say(f"Saved {written}{note}.")
        self._refresh_buttons()
        self.saved.emit(str(written))
        return True

    def choose_file(self) -> None:
        """Pick a genai_config.json with a dialog."""
        start = self._state.package or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(
            self, "Open genai_config.json", start, "genai config (genai_config.json *.json)"
        )
        if path:
            self.open(path)

    def _save_as(self) -> None:
        if self.doc is None:
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Save genai_config.json as", str(self.doc.path or "")
        )
        if path:
            self.save(path)

    # ------------------------------------------------------------------ edits

    def set_value_text(self, path: JsonPath, text: str) -> bool:
        """Apply what the user typed at ``path``; a refused value leaves everything as it was."""
        if self.doc is None:
            return False
        try:
            value = self.doc.set_text(path, text)
        except ConfigValueError as exc:
            self.message.say(f"Refused {exc}", "error")
            self.refused.emit(exc.reason)
            return False
        item = self._values.get(path)
        if item is not None:
            item.setText(display(value))
        self.message.say(f"Set {'.'.join(map(str, path))} = {json.dumps(value)}")
        self._refresh_lint()
        return True

    def set_capture(self, session: str, on: bool) -> bool:
        """Toggle one session's graph capture."""
        if self.doc is None:
            return False
        try:
            self.doc.set_capture(session, on)
        except ConfigValueError as exc:
            self.message.say(f"Refused {exc}", "error")
            self.refused.emit(exc.reason)
            return False
        self._rebuild(keep_message=True)
        return True

    # ------------------------------------------------------------------ view

    def _rebuild(self, keep_message: bool = False) -> None:
        assert self.doc is not None
        expanded = {p for p, item in self._keys.items() if self.tree.isExpanded(item.index())}
        self.model.removeRows(0, self.model.rowCount())
        self._keys, self._values = {}, {}
        self._add_children(self.model.invisibleRootItem(), self.doc.data, ())
        if not expanded:
            self.tree.expandAll()
            self.tree.resizeColumnToContents(0)
        for path, item in self._keys.items():
            if path in expanded:
                self.tree.setExpanded(item.index(), True)
        self.path_label.setText(str(self.doc.path))
        self._rebuild_captures()
        self._refresh_lint()

    def _add_children(self, parent: QStandardItem, node: Any, path: JsonPath) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            child_path = (*path, key)
            rule = rule_for(child_path)
            key_item = QStandardItem(str(key) if isinstance(key, str) else f"[{key}]")
            value_item = QStandardItem(display(value))
            type_item = QStandardItem(_type_text(value, rule))
            container = is_container(value)
            for item in (key_item, value_item, type_item):
                item.setData(child_path, PATH_ROLE)
                item.setEditable(item is value_item and not container)
            type_item.setForeground(
                QColor(status_color("ready" if rule else "off", self.palette()))
            )
            parent.appendRow([key_item, value_item, type_item])
            self._keys[child_path] = key_item
            self._values[child_path] = value_item
            if container:
                self._add_children(key_item, value, child_path)

    def _rebuild_captures(self) -> None:
        assert self.doc is not None
        for box in self.captures.values():
            box.deleteLater()
        self.captures = {}
        for session in self.doc.sessions():
            state = self.doc.capture(session)
            box = QCheckBox(session)
            box.setChecked(bool(state))
            box.setEnabled(state is not None)
            box.setToolTip(
                "this session's provider has no graph-capture option (CPU?)"
                if state is None
                else "writes the provider's own capture option"
            )
            box.toggled.connect(lambda on, s=session: self.set_capture(s, on))
            self.capture_layout.addWidget(box)
            self.captures[session] = box

    def _refresh_lint(self) -> None:
        assert self.doc is not None
        for item in [*self._keys.values(), *self._values.values()]:
            item.setBackground(QBrush())
        self.lint.clear()
        found = self.doc.problems() + self.doc.lint()
        for lint in found:
            self.lint.addItem(f"⚠ {lint.message}")
            for items in (self._keys, self._values):
                if lint.path in items:
                    items[lint.path].setBackground(lint_brush(self.palette()))
        if not found:
            self.lint.addItem("No known traps.")
        self._refresh_buttons()

    def _refresh_buttons(self) -> None:
        has_doc = self.doc is not None
        for button in (self.save_button, self.save_as_button, self.reload_button):
            button.setEnabled(has_doc)
        if self.doc is not None:
            self.save_button.setText("Save *" if self.doc.modified else "Save")

    def lint_codes(self) -> list[str]:
        return [lint.code for lint in self.doc.lint()] if self.doc else []


def _type_text(value: Any, rule: Any) -> str:
    """The Type column: the rule of a known field, or what an unknown one holds."""
    if rule is not None:
        return str(rule.describe())
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    kinds = {bool: "true/false", int: "integer", float: "number", str: "text"}
    return f"{kinds.get(type(value), 'null')} (not checked, kept as is)"


def _button(text: str, tip: str) -> QPushButton:
    button = QPushButton(text)
    button.setToolTip(tip)
    return button
