"""The charts' labels: every bar keeps its label at any window size; legends wrap between
entries, never inside one."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QFont, QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import QApplication

from app.widgets.charts import ChartBox, fit_labels, round_ticks
from app.windows.main_window import MainWindow
from tests.app.conftest import export_split_webgpu_tiny, make_settings, wait_for_preview

SIZES = ((1600, 1000), (1024, 700))
FOREIGN = Path(__file__).resolve().parents[1] / "engine" / "data" / "genai-builder-llama-int4"


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_split_webgpu_tiny(tmp_path_factory.mktemp("charts") / "tiny-webgpu").output


def drawn_texts(chart: ChartBox, axis: str = "left") -> list[tuple[QRectF, str]]:
    """The tick labels pyqtgraph really draws on an axis, with their rectangles (it skips
    those that do not fit the axis)."""
    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        _, _, texts = chart.plot.getAxis(axis).generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(rect, text) for rect, _, text in texts]


def drawn_labels(chart: ChartBox) -> list[str]:
    """The category labels drawn on the left axis."""
    return [text for _, text in drawn_texts(chart)]


def assert_every_bar_labelled(chart: ChartBox, bars: int) -> None:
    assert bars > 0
    assert len(chart.categories) == bars
    drawn = drawn_labels(chart)
    assert sorted(drawn) == sorted(chart.tick_labels), "a label was skipped"
    assert len(drawn) == bars
    for full, shown in zip(chart.categories, chart.tick_labels, strict=True):
        assert shown.strip("…").strip(), f"{full!r} drawn as {shown!r}"
        assert shown == full or "…" in shown
        assert shown[:3] == full[:3]  # elided in the middle: it still starts as it should


def test_session_names_shorten_before_tensor_names(qapp):
    """At 1024 px "embedding: embed_tokens_per_layer ×35" was drawn "embedding: …r_layer
    ×35": the session kept its whole word and the tensor lost what names it. Rooms here
    are measured from the font, so any font size gives the same cases."""
    metrics = QFontMetrics(QFont())
    width = metrics.horizontalAdvance
    parts = [
        ("embedding: ", "embed_tokens_per_layer", " ×35"),
        ("vision_encoder: ", "patch_embedder.weight", ""),
    ]
    whole = ["embedding: embed_tokens_per_layer ×35", "vision_encoder: patch_embedder.weight"]
    assert fit_labels(metrics, max(map(width, whole)), parts) == whole
    # the heads shorten a letter at a time, alike, while the names stay whole
    five = ["embed…: embed_tokens_per_layer ×35", "visio…: patch_embedder.weight"]
    assert fit_labels(metrics, max(map(width, five)), parts) == five
    three = ["emb…: embed_tokens_per_layer ×35", "vis…: patch_embedder.weight"]
    assert fit_labels(metrics, max(map(width, three)), parts) == three
    # narrower still: the names are elided in their middle, the heads and tails kept
    room = max(map(width, three)) - width("_tokens")
    narrow = fit_labels(metrics, room, parts)
    assert narrow[0].startswith("emb…: em") and narrow[0].endswith(" ×35")
    assert "…" in narrow[0][len("emb…: ") :] and narrow[1].startswith("vis…: ")
    assert all(width(text) <= room for text in narrow)
    # heads that three letters would make alike keep more; a word cut wider stays whole
    alike = [
        ("decoder: ", "a" * 40, ""),
        ("decoder_with_past: ", "b" * 40, ""),
        ("text: ", "c", ""),
    ]
    heads = [t.split(": ")[0] for t in fit_labels(metrics, width("decoder: " + "a" * 20), alike)]
    assert heads[0] != heads[1] and heads[0].startswith("dec") and heads[2] == "text"
    # one session: no heads, the name elided in the middle as before
    room = width("embed_tokens_per_layer ×35") - width("_tokens")
    (alone,) = fit_labels(metrics, room, [("", "embed_tokens_per_layer", " ×35")])
    assert alone.startswith("em") and alone.endswith(" ×35") and "…" in alone
    assert width(alone) <= room


def _window(qtbot, tmp_path: Path, size: tuple[int, int]) -> MainWindow:
    window = MainWindow(make_settings(tmp_path))
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    qtbot.waitUntil(lambda: window.width() == size[0] and window.state.preview is not None)
    return window


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_bar_has_its_label_in_the_preview(qtbot, tmp_path: Path, size: tuple[int, int]):
    window = _window(qtbot, tmp_path, size)
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    window.state.update_options(ep="webgpu", weight_bits=4)
    data = wait_for_preview(qtbot, window, lambda p: "gemma4-e2b → WebGPU" in p.title)
    window.tabs.setCurrentWidget(window.preview)
    QApplication.processEvents()
    tensors = window.preview.tensors
    assert_every_bar_labelled(tensors, len(tensors.categories))
    assert len(tensors.categories) >= min(8, len(data.largest))  # room for most of them
    assert_every_bar_labelled(window.preview.sizes, len(data.sessions))
    assert all(
        label.split(" ")[-1] in ("GiB", "MiB", "KiB") for label in window.preview.sizes.tick_labels
    )


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("preset", ["gemma4-tiny", "gemma4-e2b"])
def test_value_axis_labels_never_touch(qtbot, tmp_path: Path, size: tuple[int, int], preset: str):
    """The size axes tick at a round step their width has room for: in a narrow column
    pyqtgraph's own spacing drew "500", "1000" and "1500" as "500 10001500"."""
    window = _window(qtbot, tmp_path, size)
    window.model_panel.presets.setCurrentText(preset)
    wait_for_preview(qtbot, window, lambda p: p.title.startswith(preset))
    window.tabs.setCurrentWidget(window.preview)
    QApplication.processEvents()
    for chart in (window.preview.sizes, window.preview.tensors):
        assert_a_readable_scale(chart)


def assert_a_readable_scale(chart: ChartBox) -> None:
    """The bottom axis draws at least two tick labels (a scale, not one number), none
    touching the next."""
    texts = drawn_texts(chart, "bottom")
    rects = sorted((rect for rect, _ in texts), key=lambda r: r.left())
    labels = [text for _, text in texts]
    assert len(rects) >= 2, f"{chart.title.text()}: {labels}"
    gap = chart.fontMetrics().horizontalAdvance("0")
    for a, b in itertools.pairwise(rects):
        assert a.right() + gap <= b.left(), f"{chart.title.text()}: {labels} touch"


@pytest.mark.parametrize("room", [60, 88, 108, 150, 224, 400])
@pytest.mark.parametrize("top", [0.9, 7.3, 515.8, 980.0, 1234.5, 2047.0])
def test_round_ticks_stand_apart_and_end_inside_the_axis(qapp, room: int, top: float):
    """The last label is centred on its tick: "500" at 97% of an 88-pixel axis reached past
    its end, and pyqtgraph hid it (a scale of one "0")."""
    metrics = QFontMetrics(QFont())
    ticks = round_ticks(top, room, metrics)
    assert len(ticks) >= 2 and ticks[0] == 0 and ticks[-1] <= top, ticks
    centres = [room * v / top for v in ticks]
    halves = [metrics.horizontalAdvance(f"{v:g}") / 2 for v in ticks]
    assert centres[-1] + halves[-1] <= room, ticks
    for (a, ha), (b, hb) in itertools.pairwise(zip(centres, halves, strict=True)):
        assert a + ha < b - hb, ticks


def test_size_axes_keep_a_scale_in_narrow_columns(qtbot, tmp_path: Path, package: Path):
    """At 1024x700 the Inspector's bytes per session read "0 200400600800" (the room was
    measured before the left axis took its labels' width) and the preview's package size,
    with Advanced quantization open, only "0"."""
    window = _window(qtbot, tmp_path, (1024, 700))
    window.state.update_options(ep="webgpu", weight_bits=4)
    window.target_panel.advanced_button.click()
    wait_for_preview(qtbot, window, lambda p: "WebGPU" in p.title)
    window.tabs.setCurrentWidget(window.preview)
    QApplication.processEvents()
    assert_a_readable_scale(window.preview.sizes)
    window.tabs.setCurrentWidget(window.inspector)
    assert not window.inspector.body.isVisible()  # no blank 0-1 axes before a package
    with qtbot.waitSignal(window.inspector.inspected, timeout=30_000):
        window.inspect_package(str(package))
    QApplication.processEvents()
    assert window.inspector.body.isVisible()
    for chart in (window.inspector.sizes, window.inspector.tensors):
        assert_a_readable_scale(chart)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("which", ["ours", "foreign"])
def test_every_bar_has_its_label_in_the_inspector(
    qtbot, tmp_path: Path, size: tuple[int, int], which: str, package: Path
):
    window = _window(qtbot, tmp_path, size)
    folder = package if which == "ours" else FOREIGN
    with qtbot.waitSignal(window.inspector.inspected, timeout=30_000) as shown:
        window.inspect_package(str(folder))
    QApplication.processEvents()
    tensors = window.inspector.tensors
    assert_every_bar_labelled(tensors, len(tensors.categories))
    assert_every_bar_labelled(window.inspector.sizes, len(shown.args[0].sessions))


def test_labels_follow_the_width(qtbot, tmp_path: Path):
    """Narrower, the labels are elided further; wider again, they come back whole."""
    window = _window(qtbot, tmp_path, (1600, 1000))
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("gemma4-e2b"))
    tensors = window.preview.tensors
    wide = list(tensors.tick_labels)
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: tensors.tick_labels != wide)
    assert any("…" in label for label in tensors.tick_labels)
    qtbot.waitUntil(lambda: len(drawn_labels(tensors)) == len(tensors.categories))
    assert_every_bar_labelled(tensors, len(tensors.categories))
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: tensors.tick_labels == wide)
    qtbot.waitUntil(lambda: len(drawn_labels(tensors)) == len(tensors.categories))
    assert_every_bar_labelled(tensors, len(tensors.categories))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_legend_entries_never_wrap_inside_a_label(qtbot, tmp_path: Path, size: tuple[int, int]):
    window = _window(qtbot, tmp_path, size)
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    window.state.update_options(ep="webgpu", weight_bits=4)
    wait_for_preview(qtbot, window, lambda p: "gemma4-e2b → WebGPU" in p.title)
    window.tabs.setCurrentWidget(window.preview)
    QApplication.processEvents()
    for chart in (window.preview.sizes, window.preview.tensors):
        legend = chart.legend
        assert legend.entries
        for entry in legend.entries:
            label = entry.label
            assert not label.wordWrap()
            assert label.width() >= label.sizeHint().width(), f"clipped: {label.text()}"
            assert label.height() >= label.fontMetrics().height()  # one whole line
            assert legend.rect().contains(entry.geometry().translated(entry.parentWidget().pos()))
