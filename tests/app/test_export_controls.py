"""Starting an export from anywhere, and a form that cannot change under a running export."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import QLineEdit

from app.windows.main_window import MainWindow
from engine.errors import EngineError


class TakesCtrlE(QObject):
    """What a QLineEdit does where the platform binds Ctrl+E to End of line (X11, KDE,
    GNOME): it claims the key in the ShortcutOverride event. The offscreen platform binds
    only the End key, so the test puts the claim back."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and QKeySequence(event.keyCombination()) == QKeySequence("Ctrl+E")
        ):
            event.accept()
        return False


@pytest.mark.parametrize("field", ["output", "keep_float", "limit"])
def test_ctrl_e_starts_the_export_from_a_focused_line_edit(
    qtbot, window: MainWindow, tmp_path: Path, field: str
) -> None:
    window.state.set_output(str(tmp_path / "from-keyboard"))
    panel = window.target_panel
    if field == "limit":
        panel.limit_mode.setCurrentIndex(panel.limit_mode.findData("custom"))
    if field == "keep_float":
        panel.weight_bits.setCurrentIndex(panel.weight_bits.findData(4))
    line: QLineEdit = getattr(panel, field)
    assert line.isEnabled()
    claim = TakesCtrlE()
    line.installEventFilter(claim)
    window.activateWindow()
    line.setFocus()
    qtbot.waitUntil(line.hasFocus)
    with qtbot.waitSignal(window.exporter.started, timeout=10_000):
        qtbot.keyClick(line, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.export_panel
    qtbot.waitUntil(lambda: not window.exporter.running, timeout=180_000)
    assert window.exporter.result is not None, window.banner.text


def _form_enabled(window: MainWindow) -> bool:
    return window.model_panel.isEnabled() and window.target_panel.isEnabled()


def _hold_export(window: MainWindow) -> tuple[threading.Event, threading.Event]:
    """Hold the worker at its first tensor write until ``proceed`` is set."""
    reached, proceed = threading.Event(), threading.Event()
    window.exporter.progress_interval_s = 0.0
    window.exporter.isolation = "thread"

    def hold(fraction: float, message: str) -> None:  # on the worker thread
        if message.startswith("writing") and not reached.is_set():
            reached.set()
            proceed.wait(60)

    window.exporter.started.connect(
        lambda worker: worker.signals.progress.connect(hold, Qt.ConnectionType.DirectConnection)
    )
    return reached, proceed


def test_the_form_is_locked_while_an_export_runs_and_unlocked_on_cancel(
    qtbot, window: MainWindow, tmp_path: Path
) -> None:
    reached, proceed = _hold_export(window)
    window.state.set_output(str(tmp_path / "locked"))
    assert _form_enabled(window)
    window.export()
    qtbot.waitUntil(reached.is_set, timeout=60_000)
    assert not window.model_panel.isEnabled()
    assert not window.target_panel.isEnabled()
    assert not window.target_panel.output.isEnabled()  # every field of the form
    assert not window.model_panel.presets.isEnabled()
    assert not window.menu_actions["open_model"].isEnabled()
    with qtbot.waitSignal(window.exporter.finished, timeout=60_000):
        window.exporter.cancel()
        proceed.set()
    assert _form_enabled(window)
    assert window.menu_actions["open_model"].isEnabled()


def test_the_form_is_unlocked_after_a_finished_export(
    qtbot, window: MainWindow, tmp_path: Path
) -> None:
    locked: list[bool] = []
    window.exporter.progress.connect(lambda *_: locked.append(not _form_enabled(window)))
    window.state.set_output(str(tmp_path / "done"))
    with qtbot.waitSignal(window.exporter.finished, timeout=180_000):
        window.export()
    assert window.exporter.result is not None, window.banner.text
    assert locked and all(locked)
    assert _form_enabled(window)


def test_the_form_is_unlocked_after_a_failed_export(
    qtbot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(request: object, progress: object, cancel: object) -> None:
        raise EngineError("the disk is full")

    monkeypatch.setattr("app.controllers.run_export", fail)
    window.exporter.isolation = "thread"
    locked: list[bool] = []
    window.exporter.started.connect(lambda *_: locked.append(not _form_enabled(window)))
    window.state.set_output(str(tmp_path / "fails"))
    with qtbot.waitSignal(window.exporter.failed, timeout=60_000):
        window.export()
    qtbot.waitUntil(lambda: not window.exporter.running, timeout=10_000)
    assert "the disk is full" in window.banner.text
    assert locked == [True]
    assert _form_enabled(window)
