"""The genai_config editor in the UI: faithful round trip, refused values, capture, lint."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit

from app import dialogs
from app.widgets.config_editor import PATH_ROLE, ConfigEditor
from app.windows.main_window import MainWindow

FOREIGN = {
    "model": {
        "bos_token_id": 2,
        "context_length": 4096,
        "decoder": {
            "session_options": {
                "log_id": "onnxruntime-genai",
                "provider_options": [{"webgpu": {"enableGraphCapture": "1", "futureKnob": "x"}}],
                "custom_session_knob": 7,
            },
            "filename": "model.onnx",
            "head_size": 256,
            "hidden_size": 1536,
            "num_attention_heads": 8,
            "num_hidden_layers": 15,
            "num_key_value_heads": 1,
            "x_vendor": {"nested": [1, 2.5, 1e-05], "note": "kept"},
        },
        "embedding": {
            "filename": "embed.onnx",
            "session_options": {"provider_options": [{"webgpu": {"enableGraphCapture": "0"}}]},
        },
        "eos_token_id": [1, 106],
        "pad_token_id": 0,
        "type": "gemma4_text",
        "vocab_size": 262144,
    },
    "search": {"max_length": 4096, "num_beams": 1, "past_present_share_buffer": True, "top_p": 1.0},
    "producer_notes": ["kept", {"as": "is"}],
}


def write_foreign(folder: Path) -> Path:
    path = folder / "genai_config.json"
    # Two-space indent and no trailing newline: not how json.dumps(indent=4) would write it.
    path.write_text(json.dumps(FOREIGN, indent=2))
    return path


def value_index(editor: ConfigEditor, path: tuple):
    item = editor._values[path]
    index = item.index()
    assert index.data(PATH_ROLE) == path
    return index


def type_into(qtbot, editor: ConfigEditor, path: tuple, text: str) -> None:
    """Edit a value cell the way a user does: open the editor, type, press Enter."""
    index = value_index(editor, path)
    editor.tree.setCurrentIndex(index)
    editor.tree.edit(index)
    open_editors = [w for w in editor.tree.viewport().findChildren(QLineEdit) if w.isVisible()]
    assert len(open_editors) == 1, "no cell editor opened"
    line = open_editors[0]
    line.selectAll()
    qtbot.keyClicks(line, text)
    qtbot.keyClick(line, Qt.Key.Key_Return)
    qtbot.waitUntil(
        lambda: not any(w.isVisible() for w in editor.tree.viewport().findChildren(QLineEdit))
    )


def test_unchanged_save_is_byte_identical(qtbot, window: MainWindow, tmp_path):
    path = write_foreign(tmp_path)
    original = path.read_bytes()
    editor = window.config_editor
    assert editor.open(str(path))
    qtbot.mouseClick(editor.save_button, Qt.MouseButton.LeftButton)
    assert path.read_bytes() == original
    assert "byte for byte" in editor.message.text()


def test_edits_keep_unknown_fields_and_invalid_values_are_refused(
    qtbot, window: MainWindow, tmp_path, screens
):
    path = write_foreign(tmp_path)
    editor = window.config_editor
    window.tabs.setCurrentWidget(editor)
    assert editor.open(str(path))

    with qtbot.waitSignal(editor.refused) as refused:
        type_into(qtbot, editor, ("search", "max_length"), "0")
    assert ">= 1" in refused.args[0]
    assert "Refused" in editor.message.text()
    assert editor._values[("search", "max_length")].text() == "4096"
    assert not editor.doc.modified

    with qtbot.waitSignal(editor.refused):
        type_into(qtbot, editor, ("search", "top_p"), "2.5")
    assert editor.doc.get(("search", "top_p")) == 1.0

    type_into(qtbot, editor, ("search", "max_length"), "2048")
    assert editor._values[("search", "max_length")].text() == "2048"
    assert editor.save_button.text() == "Save *"
    qtbot.mouseClick(editor.save_button, Qt.MouseButton.LeftButton)
    saved = json.loads(path.read_text())
    expected = json.loads(json.dumps(FOREIGN))
    expected["search"]["max_length"] = 2048
    assert saved == expected  # every field the editor does not know is still there
    assert path.read_text().startswith('{\n  "model"')  # and the file keeps its indent

    # Capture toggles per session, and the lint that follows them.
    assert editor.captures["decoder"].isChecked()
    assert not editor.captures["embedding"].isChecked()
    type_into(qtbot, editor, ("search", "past_present_share_buffer"), "false")
    assert "capture-without-share-buffer" in editor.lint_codes()
    assert any("share buffer off" in editor.lint.item(i).text() for i in range(editor.lint.count()))
    editor.captures["embedding"].setChecked(True)
    assert editor.doc.capture("embedding") is True
    screens(window, "06-config-editor")
    editor.captures["decoder"].setChecked(False)
    editor.captures["embedding"].setChecked(False)
    assert "capture-without-share-buffer" not in editor.lint_codes()


def test_opening_a_broken_file_reports_in_the_banner(qtbot, window: MainWindow, tmp_path):
    bad = tmp_path / "genai_config.json"
    bad.write_text("{ not json")
    assert not window.config_editor.open(str(bad))
    assert "not valid JSON" in window.banner.text
    assert window.config_editor.doc is None


class Answers:
    """Stands in for the app's dialogs: records each question, gives a set answer."""

    def __init__(self, monkeypatch, answer: str) -> None:
        self.asked: list[tuple[str, str]] = []
        self.answer = answer
        monkeypatch.setattr(dialogs, "ask", self)

    def __call__(self, parent, title, text, buttons) -> str:
        self.asked.append((title, text))
        assert self.answer in buttons, (self.answer, buttons)
        return self.answer


def test_reload_and_quit_ask_before_dropping_edits(
    qtbot, window: MainWindow, tmp_path, monkeypatch
):
    path = write_foreign(tmp_path)
    editor = window.config_editor
    window.tabs.setCurrentWidget(editor)
    assert editor.open(str(path))
    type_into(qtbot, editor, ("search", "max_length"), "2048")
    answers = Answers(monkeypatch, "Cancel")
    qtbot.mouseClick(editor.reload_button, Qt.MouseButton.LeftButton)
    assert answers.asked and answers.asked[0][0] == "Unsaved changes"
    assert editor.doc.get(("search", "max_length")) == 2048  # kept
    assert not window.close()  # Ctrl+Q (Quit) asks too; Cancel keeps the window open
    assert window.isVisible() and len(answers.asked) == 2

    answers.answer = "Discard changes"
    qtbot.mouseClick(editor.reload_button, Qt.MouseButton.LeftButton)
    assert editor.doc.get(("search", "max_length")) == 4096 and not editor.doc.modified
    assert json.loads(path.read_text())["search"]["max_length"] == 4096

    type_into(qtbot, editor, ("search", "max_length"), "1024")
    answers.answer = "Save"
    window.menu_actions["quit"].trigger()
    assert json.loads(path.read_text())["search"]["max_length"] == 1024  # saved, then closed
    assert not window.isVisible()


def test_saving_values_the_lint_flags_asks_first(qtbot, window: MainWindow, tmp_path, monkeypatch):
    data = json.loads(json.dumps(FOREIGN))
    data["search"]["temperature"] = -1  # hand-edited: the rules refuse it in the editor
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(data, indent=2))
    editor = window.config_editor
    window.tabs.setCurrentWidget(editor)
    assert editor.open(str(path))
    assert any("temperature" in editor.lint.item(i).text() for i in range(editor.lint.count()))
    type_into(qtbot, editor, ("search", "max_length"), "8192")  # above context_length 4096
    assert "max-length-over-context" in editor.lint_codes()
    before = path.read_bytes()
    answers = Answers(monkeypatch, "Cancel")
    assert not editor.save()
    assert path.read_bytes() == before
    title, text = answers.asked[0]
    assert "flagged" in title and "temperature" in text and "context_length" in text
    assert "Not saved" in editor.message.text()
    answers.answer = "Save anyway"
    assert editor.save()
    assert json.loads(path.read_text())["search"]["max_length"] == 8192
