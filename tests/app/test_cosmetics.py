"""Small things a first look catches: whole tab labels, dialogs that start where the
packages are."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog, QStyle, QTabBar

from app.windows.main_window import MainWindow


def _tab_bars(window: MainWindow) -> list[QTabBar]:
    return [
        window.tabs.tabBar(),
        window.bench_panel.history_tabs.tabBar(),
        window.inspector.details.tabBar(),
    ]


def test_inactive_tabs_have_room_for_their_shifted_label(window: MainWindow):
    """An inactive tab's label is drawn PM_TabBarTabShiftVertical lower: the tab must hold
    the text, its spacing and that shift on both sides, or descenders and "_" are cut."""
    for bar in _tab_bars(window):
        style = bar.style()
        shift = style.pixelMetric(QStyle.PixelMetric.PM_TabBarTabShiftVertical, None, bar)
        space = style.pixelMetric(QStyle.PixelMetric.PM_TabBarTabVSpace, None, bar)
        needed = bar.fontMetrics().height() + space + 2 * shift
        for i in range(bar.count()):
            assert bar.tabRect(i).height() >= needed, (bar.tabText(i), bar.tabRect(i))
    window.tabs.setCurrentIndex(0)
    bar = window.tabs.tabBar()
    config = window.tabs.indexOf(window.config_editor)
    assert bar.tabText(config) == "genai_config"
    assert bar.tabRect(config).width() >= bar.fontMetrics().horizontalAdvance("genai_config")


@pytest.mark.parametrize("where", ["menu", "inspector", "benchmark"])
def test_package_dialogs_start_beside_the_last_export(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
):
    exports = tmp_path / "exports"
    package = exports / "gemma4-tiny-cpu-fp32"
    package.mkdir(parents=True)
    window.state.set_package(str(package))
    asked: list[str] = []

    def dialog(parent: object, caption: str = "", folder: str = "", *args: object) -> str:
        asked.append(folder)
        return ""

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(dialog))
    if where == "menu":
        window.menu_actions["open_package"].trigger()
    elif where == "inspector":
        window.inspector.browse.click()
    else:
        window.bench_panel.browse.click()
    assert asked == [str(exports)]


def test_without_an_export_the_dialog_starts_beside_the_output_folder(
    window: MainWindow, tmp_path: Path
):
    window.state.set_output(str(tmp_path / "out" / "tiny"))
    (tmp_path / "out").mkdir()
    assert window.state.package == ""
    assert window.state.package_folder_start() == str(tmp_path / "out")
