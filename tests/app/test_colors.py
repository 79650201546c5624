"""Chart colours: one per weight role and one per dtype, fixed by name, told apart with
normal and colour-blind vision, visible on light and dark charts; status text and check
box outlines that read on the window."""

from __future__ import annotations

import itertools
from functools import cache
from typing import get_args

import pyqtgraph as pg
import pytest
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QCheckBox, QRadioButton, QStyle, QStyleOptionButton

from app.preview_data import ROLE_LABELS, SessionSize, TensorBar, preview_from_plan
from app.theme import (
    _STATUS,
    DTYPE_COLORS,
    FITS,
    ROLE_COLORS,
    IndicatorStyle,
    chart_background,
    contrast_ratio,
    dark_palette,
    series_color,
    split_ghost,
)
from app.widgets.charts import LargestTensorsChart, SessionSizeChart
from engine.logical import Role
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import list_presets, load_preset
from tests.app.colorsci import difference

OPTIONS = (ExportOptions(), ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4))
CVD = ("deutan", "protan")


@cache
def sessions_roles() -> tuple[frozenset[str], ...]:
    """The roles each session of each preset's plans holds together (engine role keys)."""
    words = {label: role for role, label in ROLE_LABELS.items()}
    found = set()
    for preset in list_presets():
        for options in OPTIONS:
            for session in preview_from_plan(plan(load_preset(preset), options)).sessions:
                found.add(frozenset(words[label] for label in session.by_role))
    return tuple(found)


def test_every_role_has_one_colour_of_its_own():
    assert set(ROLE_COLORS) == set(get_args(Role))
    colors = [c.lower() for c in ROLE_COLORS.values()]
    assert len(set(colors)) == len(colors), "two roles share a colour"


def test_every_role_of_the_presets_plans_is_coloured_by_name():
    used = set().union(*sessions_roles())
    assert used <= set(ROLE_COLORS)
    for role in used:
        assert series_color(ROLE_LABELS[role]) == ROLE_COLORS[role]  # the words the chart shows
        assert series_color(role) == ROLE_COLORS[role]


def test_role_colours_differ_clearly_for_normal_vision():
    worst = min(
        (difference(a, b), ra, rb)
        for (ra, a), (rb, b) in itertools.combinations(ROLE_COLORS.items(), 2)
    )
    assert worst[0] >= 11, f"{worst[1]} and {worst[2]} look alike (CIEDE2000 {worst[0]:.1f})"


@pytest.mark.parametrize("deficiency", CVD)
def test_roles_of_one_session_stay_apart_for_colour_blind_vision(deficiency: str):
    """Deuteranopia and protanopia (about 6% of men): the roles one bar stacks together
    still differ by a clear CIEDE2000 margin."""
    pairs = {frozenset(p) for roles in sessions_roles() for p in itertools.combinations(roles, 2)}
    worst = min(
        (difference(ROLE_COLORS[a], ROLE_COLORS[b], deficiency), a, b)
        for a, b in (tuple(p) for p in pairs)
    )
    assert worst[0] >= 10, f"{worst[1]} and {worst[2]} look alike ({worst[0]:.1f})"


@pytest.mark.parametrize("deficiency", CVD)
def test_every_role_stays_distinguishable_for_colour_blind_vision(deficiency: str):
    worst = min(
        difference(a, b, deficiency) for a, b in itertools.combinations(ROLE_COLORS.values(), 2)
    )
    assert worst >= 5


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_series_colours_are_visible_on_the_chart_background(qapp, theme: str):
    palette = dark_palette() if theme == "dark" else QPalette(qapp.palette())
    if theme == "light":
        palette.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    background = chart_background(palette)
    for name, color in {**ROLE_COLORS, **DTYPE_COLORS}.items():
        ratio = contrast_ratio(QColor(color), background)
        assert ratio >= 1.3, f"{name} {color} on {background.name()}: {ratio:.2f}"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_before_splitting_ghost_shows_on_the_background_and_beside_its_bar(qapp, theme: str):
    """The pale bar behind a split tensor's piece: a dark blue one (#3b4a63, 1.8:1)
    vanished on the dark chart background (a new user's walk)."""
    palette = dark_palette() if theme == "dark" else QPalette(qapp.palette())
    if theme == "light":
        palette.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    ghost = QColor(split_ghost(palette))
    assert contrast_ratio(ghost, QColor(FITS)) >= 2  # where the piece ends
    assert contrast_ratio(ghost, chart_background(palette)) >= (3 if theme == "dark" else 1.4)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_unsplit_size_reads_on_the_ghost_bar_it_sits_on(qtbot, theme: str):
    """A split tensor far larger than the scale: its unsplit size is written at the plot's
    right end, on its ghost bar, in whichever of the chart's colours reads there."""
    chart = LargestTensorsChart()
    qtbot.addWidget(chart)
    if theme == "dark":
        chart.setPalette(dark_palette())
    gib = 1024**3
    bars = [TensorBar("embed_tokens_per_layer", "per_layer", 4 * gib, gib // 4, 35, False)]
    chart.set_tensors(bars, 256 * 1024**2, None)
    (label,) = [i for i in chart.plot.items() if isinstance(i, pg.TextItem)]
    assert "unsplit" in label.toPlainText()
    ghost = QColor(split_ghost(chart.palette()))
    assert contrast_ratio(label.color, ghost) >= 4.5, (label.color.name(), ghost.name())


def test_dtype_colours_are_fixed_and_distinct():
    colors = [c.lower() for c in DTYPE_COLORS.values()]
    assert len(set(colors)) == len(colors)
    for dtype, color in DTYPE_COLORS.items():
        assert series_color(dtype) == color
    assert series_color("float8e5m2") == series_color("float8e5m2")  # unknown: still stable


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_status_text_colours_read_on_the_window(qapp, theme: str):
    palette = dark_palette() if theme == "dark" else qapp.palette()
    window = palette.color(QPalette.ColorRole.Window)
    for name, variants in _STATUS.items():
        color = QColor(variants[1 if theme == "dark" else 0])
        assert contrast_ratio(color, window) >= 4.5, name


def test_a_role_keeps_its_colour_whatever_else_the_chart_shows(qtbot):
    """The same role, the same colour: in a decoder with other roles, in another order,
    in another package (here, another chart)."""
    first, second = SessionSizeChart(), SessionSizeChart()
    for chart in (first, second):
        qtbot.addWidget(chart)
    first.set_sessions(
        [SessionSize("decoder", "model.onnx", 6, {"linear layers": 3, "token embedding": 3})]
    )
    second.set_sessions(
        [
            SessionSize("vision", "vision.onnx", 2, {"position tables": 1, "norms": 1}),
            SessionSize("decoder", "model.onnx", 9, {"token embedding": 4, "RoPE caches": 5}),
        ]
    )
    for chart in (first, second):
        for words, color in chart.legend.colors.items():
            assert color == series_color(words), words
    assert first.legend.colors["token embedding"] == second.legend.colors["token embedding"]
    assert len(set(second.legend.colors.values())) == 4


def test_a_dtype_keeps_its_colour_from_one_package_to_the_next(qtbot):
    first, second = SessionSizeChart(), SessionSizeChart()
    for chart in (first, second):
        qtbot.addWidget(chart)
    first.set_sessions([SessionSize("decoder", "model.onnx", 3, {"float16": 2, "uint8": 1})])
    second.set_sessions([SessionSize("decoder", "model.onnx", 3, {"uint8": 2, "float32": 1})])
    assert first.legend.colors["uint8"] == second.legend.colors["uint8"] == DTYPE_COLORS["uint8"]
    assert second.legend.colors["float32"] == DTYPE_COLORS["float32"]


@pytest.mark.parametrize("kind", [QCheckBox, QRadioButton], ids=["check box", "radio button"])
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_an_unchecked_indicator_stands_out_from_the_window(qtbot, qapp, theme: str, kind):
    """WCAG 2.1's non-text contrast, 3:1, for the edge of an unchecked box against the
    window behind it: rendered as the studio draws it (its style over Fusion, on the dark
    palette and on Fusion's light one), the outline sampled mid-way along each side."""
    style = IndicatorStyle("Fusion")
    palette = dark_palette() if theme == "dark" else style.standardPalette()
    button = kind("Symmetric quantization")
    qtbot.addWidget(button)
    button.setStyle(style)
    button.setPalette(palette)
    button.resize(button.sizeHint())
    option = QStyleOptionButton()
    button.initStyleOption(option)
    element = (
        QStyle.SubElement.SE_CheckBoxIndicator
        if kind is QCheckBox
        else QStyle.SubElement.SE_RadioButtonIndicator
    )
    box = style.subElementRect(element, option, button)
    image = button.grab().toImage()
    window = palette.color(QPalette.ColorRole.Window)
    assert QColor(image.pixel(box.right() + 2, box.top())) == window  # beside it: the window
    middle = box.center()
    edges = {
        "left": (box.left(), middle.y()),
        "right": (box.right(), middle.y()),
        "top": (middle.x(), box.top()),
        "bottom": (middle.x(), box.bottom()),
    }
    ratios = {side: contrast_ratio(QColor(image.pixel(*xy)), window) for side, xy in edges.items()}
    assert min(ratios.values()) >= 3, ratios
