"""Every screen at 1600x1000 and 1024x700, light and dark: saved for people to look at, and
checked for what a look would catch (clipped text, a panel wider than the window, text
without contrast).

The PNGs go to $EXPORT_STUDIO_SCREENS (default /tmp/app-screens) as
``screen-<size>-<palette>-<nn>-<name>.png``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QLabel,
    QStyle,
    QStyleOptionComboBox,
    QWidget,
)

from app.state import ModelSource
from app.theme import IndicatorStyle, contrast_ratio, dark_palette
from app.windows.about import AboutDialog
from app.windows.main_window import MainWindow
from tests.app.conftest import export_split_webgpu_tiny, make_settings, wait_for_preview

SCREENS = Path(os.environ.get("EXPORT_STUDIO_SCREENS", "/tmp/app-screens"))
SIZES = ((1600, 1000), (1024, 700))
FOREIGN = Path(__file__).resolve().parents[1] / "engine" / "data" / "genai-builder-llama-int4"


@pytest.fixture(params=["light", "dark"])
def palette(request, qapp) -> Iterator[str]:
    original = QPalette(qapp.palette())
    style = qapp.style().name()
    studio = IndicatorStyle("Fusion" if request.param == "dark" else style)  # as app.__main__
    qapp.setStyle(studio)
    if request.param == "dark":
        qapp.setPalette(dark_palette())
    yield request.param
    qapp.setPalette(original)
    qapp.setStyle(style)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return export_split_webgpu_tiny(tmp_path_factory.mktemp("screens") / "tiny-webgpu").output


def _visible_labels(root: QWidget) -> list[QLabel]:
    return [w for w in root.findChildren(QLabel) if w.isVisible() and w.text().strip()]


def _combo_clipped(box: QComboBox) -> bool:
    """Whether a combo box's chosen text is wider than the field that shows it."""
    option = QStyleOptionComboBox()
    box.initStyleOption(option)
    field = box.style().subControlRect(
        QStyle.ComplexControl.CC_ComboBox, option, QStyle.SubControl.SC_ComboBoxEditField, box
    )
    return box.fontMetrics().horizontalAdvance(box.currentText()) > field.width()


def check(window: QWidget, name: str) -> list[str]:
    """What a person would see wrong on this screen."""
    problems = []
    for box in window.findChildren(QComboBox):
        if box.isVisible() and not box.isEditable() and _combo_clipped(box):
            problems.append(f"{name}: combo box text clipped: {box.currentText()[:60]!r}")
    for label in _visible_labels(window):
        if not label.wordWrap() and label.width() + 2 < label.minimumSizeHint().width():
            problems.append(f"{name}: label clipped: {label.text()[:60]!r}")
        if label.wordWrap() and label.height() + 2 < label.heightForWidth(label.width()):
            problems.append(f"{name}: wrapped label cut short: {label.text()[:60]!r}")
        palette = label.palette()
        ratio = contrast_ratio(
            palette.color(QPalette.ColorRole.WindowText), palette.color(label.backgroundRole())
        )
        if ratio < 4.5 and label.objectName() != "errorText":
            problems.append(f"{name}: low contrast {ratio:.1f} for {label.text()[:40]!r}")
    return problems


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_screen_fits_and_reads(qtbot, tmp_path, palette, size, package, monkeypatch):
    width, height = size
    window = MainWindow(make_settings(tmp_path))
    qtbot.addWidget(window)
    window.resize(width, height)
    window.show()
    qtbot.waitUntil(lambda: window.width() == width and window.state.preview is not None)
    problems: list[str] = []
    shots: list[Path] = []
    SCREENS.mkdir(parents=True, exist_ok=True)

    def shoot(widget: QWidget, name: str) -> None:
        QApplication.processEvents()
        path = SCREENS / f"screen-{width}x{height}-{palette}-{len(shots) + 1:02d}-{name}.png"
        assert widget.grab().save(str(path))
        shots.append(path)
        problems.extend(check(widget, path.stem))

    assert window.minimumSizeHint().width() <= width, "the window cannot get this narrow"
    left = window.left_scroll
    assert left.widget().minimumSizeHint().width() <= left.viewport().width() + 1, (
        "the left panel is wider than its column (its right edge would be clipped)"
    )
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    window.state.update_options(ep="webgpu", weight_bits=4)
    wait_for_preview(qtbot, window, lambda p: "gemma4-e2b → WebGPU" in p.title)
    window.tabs.setCurrentWidget(window.preview)
    shoot(window, "preview-e2b-webgpu")
    window.state.set_source(ModelSource("preset", "gemma4-tiny"))
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("gemma4-tiny → WebGPU"))
    shoot(window, "preview-tiny-webgpu")
    window.target_panel.advanced_button.setChecked(True)
    shoot(window, "target-advanced")
    window.target_panel.advanced_button.setChecked(False)

    window.state.update_options(ep="cpu", weight_bits=None)
    window.state.set_output(str(tmp_path / "out" / "tiny"))
    with qtbot.waitSignal(window.exporter.finished, timeout=120_000):
        window.export()
    shoot(window, "export-done")

    window.edit_config(str(package))
    shoot(window, "genai-config")

    window.show_bench(str(package))
    qtbot.waitUntil(lambda: window.bencher.facts is not None, timeout=30_000)
    shoot(window, "benchmark-empty")
    bench = window.bench_panel
    bench.prompt_len.setValue(8)
    bench.new_tokens.setValue(8)
    with qtbot.waitSignal(bench.finished, timeout=120_000):
        bench.run()
    shoot(window, "benchmark-run")

    with qtbot.waitSignal(window.inspector.inspected, timeout=30_000):
        window.inspect_package(str(package))
    shoot(window, "inspector-ours")
    with qtbot.waitSignal(window.inspector.inspected, timeout=30_000):
        window.inspect_package(str(FOREIGN))
    shoot(window, "inspector-foreign")

    about = AboutDialog(window)
    qtbot.addWidget(about)
    about.show()
    shoot(about, "about")
    about.close()
    assert len(shots) == 10 and all(p.stat().st_size > 10_000 for p in shots)
    assert not problems, "\n".join(problems)
