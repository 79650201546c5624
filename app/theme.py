"""Colours that follow the palette (light or dark), a dark palette to check them with, and
a style whose check boxes show on either.

Nothing in the app hard-codes a text colour on the window's background: text uses the
palette's own roles, and the few semantic colours (status, chart series) come from here in
a light and a dark variant, chosen by the palette's window lightness.
"""

from __future__ import annotations

import zlib

from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleOption, QWidget

_STATUS = {
    # name: (on a light background, on a dark background)
    "ready": ("#2a7230", "#81c784"),
    "likely": ("#00796b", "#4db6ac"),
    "blocked": ("#c62828", "#ef9a9a"),
    "off": ("#616161", "#bdbdbd"),
    "unsupported": ("#616161", "#bdbdbd"),
    "warning": ("#7a5c1e", "#ffd54f"),
    "error": ("#c62828", "#ef9a9a"),
}

ROLE_COLORS = {
    "linear": "#0072B2",  # Okabe-Ito blue
    "embedding": "#D55E00",  # Okabe-Ito vermillion
    "ple_table": "#EE6677",  # Tol bright red
    "norm": "#DDDDDD",  # Tol light grey
    "rope_cache": "#E69F00",  # Okabe-Ito orange
    "scalar": "#CC79A7",  # Okabe-Ito reddish purple
    "lm_head": "#56B4E9",  # Okabe-Ito sky blue
    "experts": "#AA3377",  # Tol bright purple
    "router": "#FF9DA7",  # Tableau pink
    "scale": "#9C755F",  # Tableau brown
    "table": "#59A14F",  # Tableau green
    "conv": "#009E73",  # Okabe-Ito bluish green
    "clip": "#F0E442",  # Okabe-Ito yellow
    "bias": "#332288",  # Tol indigo (apart from the embedding for protanopes in a Qwen2 decoder)
}
"""One fill per weight role (``engine.logical.Role``), the same in every chart and package.

Okabe-Ito's seven colours plus distinct ones from Paul Tol's and Tableau's palettes, all
visible on a light and a dark chart background. They were assigned so that the roles one
session holds together (decoder, embedding, vision, speech) stay apart for deuteranopes
and protanopes too (CIEDE2000 >= 12 under Machado's simulation, tests/app/test_colors.py);
every role differs from every other by more than that for normal vision."""

DTYPE_COLORS = {
    "float32": "#0072B2",
    "float16": "#E69F00",
    "bfloat16": "#56B4E9",
    "uint8": "#009E73",
    "int8": "#D55E00",
    "int4": "#CC79A7",
    "uint4": "#AA3377",
    "int32": "#9C755F",
    "int64": "#DDDDDD",
    "bool": "#FF9DA7",
    "float64": "#117733",
    "int16": "#59A14F",
    "uint16": "#EE6677",
    "float8e4m3fn": "#F0E442",
}
"""One fill per initializer dtype (the Inspector's bars), fixed, so a dtype keeps its
colour from one package to the next."""

SERIES = tuple(dict.fromkeys(ROLE_COLORS.values()))
"""Every series fill; a name none of the maps knows gets one of these by a hash of it."""


def series_color(name: str) -> str:
    """The fill of a stacked series: a weight role (its key or its words), a dtype, or any
    other name (a stable pick: the same name has the same colour in every chart)."""
    from app.preview_data import ROLE_LABELS  # no Qt there; the words the charts show

    role = next((key for key, words in ROLE_LABELS.items() if words == name), name)
    if role in ROLE_COLORS:
        return ROLE_COLORS[role]
    if name in DTYPE_COLORS:
        return DTYPE_COLORS[name]
    return SERIES[zlib.crc32(name.encode()) % len(SERIES)]


FITS, SPLIT_GHOST_LIGHT, SPLIT_GHOST_DARK = "#4c72b0", "#c9d6ea", "#a9b8d0"
OVER, BINDING = "#c44e52", "#dd8452"
CAPTURE_OFF, CAPTURE_ON = "#8c9bb0", "#dd8452"


def palette_of(widget: QWidget | None = None) -> QPalette:
    if widget is not None:
        return widget.palette()
    app = QApplication.instance()
    return app.palette() if isinstance(app, QApplication) else QPalette()


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightnessF() < 0.5


def status_color(name: str, palette: QPalette) -> str:
    """A status colour with enough contrast on this palette's background."""
    light, dark = _STATUS[name]
    return dark if is_dark(palette) else light


def split_ghost(palette: QPalette) -> str:
    return SPLIT_GHOST_DARK if is_dark(palette) else SPLIT_GHOST_LIGHT


def chart_background(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.Base)


def chart_foreground(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.Text)


def contrast_ratio(a: QColor, b: QColor) -> float:
    """WCAG 2 contrast ratio of two colours (1 to 21; 4.5 is enough for body text)."""

    def luminance(c: QColor) -> float:
        def channel(v: float) -> float:
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

        return (
            0.2126 * channel(c.redF()) + 0.7152 * channel(c.greenF()) + 0.0722 * channel(c.blueF())
        )

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def dark_palette() -> QPalette:
    """A dark palette (as a desktop's dark theme gives), for users and for screenshots."""
    p = QPalette()
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    for r, color in (
        (role.Window, "#2b2b2b"),
        (role.WindowText, "#e6e6e6"),
        (role.Base, "#1f1f1f"),
        (role.AlternateBase, "#2a2a2a"),
        (role.ToolTipBase, "#3a3a3a"),
        (role.ToolTipText, "#f0f0f0"),
        (role.PlaceholderText, "#9a9a9a"),
        (role.Text, "#e6e6e6"),
        (role.Button, "#353535"),
        (role.ButtonText, "#e6e6e6"),
        (role.BrightText, "#ff6b6b"),
        (role.Light, "#4a4a4a"),
        (role.Midlight, "#3e3e3e"),
        (role.Mid, "#303030"),
        (role.Dark, "#1a1a1a"),
        (role.Shadow, "#000000"),
        (role.Highlight, "#3d6fb6"),
        (role.HighlightedText, "#ffffff"),
        (role.Link, "#8ab4f8"),
        (role.LinkVisited, "#c58af9"),
    ):
        p.setColor(r, QColor(color))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(group.Disabled, r, QColor("#7a7a7a"))
    return p


INDICATORS = (
    QStyle.PrimitiveElement.PE_IndicatorCheckBox,
    QStyle.PrimitiveElement.PE_IndicatorRadioButton,
)
FUSION_DARKER = 140
"""Fusion outlines a check box in the window colour ``darker(140)`` (a radio button a
shade darker still)."""
OUTLINE_MIX = 0.6
"""Where an indicator's outline sits from the window (0) to the window text (1)."""


def indicator_outline(palette: QPalette, group: QPalette.ColorGroup) -> QColor:
    """The outline a check box or radio button should have in ``group``: most of the way
    from the window to its text (drawn, 3.9:1 or more on the dark palette's window and
    on Fusion's light one; WCAG asks 3:1 of a control's edge). Disabled, it is fainter,
    as the disabled text is."""
    window = palette.color(group, QPalette.ColorRole.Window)
    text = palette.color(group, QPalette.ColorRole.WindowText)

    def between(a: int, b: int) -> int:
        return round(a + OUTLINE_MIX * (b - a))

    return QColor(
        between(window.red(), text.red()),
        between(window.green(), text.green()),
        between(window.blue(), text.blue()),
    )


class IndicatorStyle(QProxyStyle):
    """The style ``key`` names, with check box and radio button outlines that show.

    Fusion draws them in the window colour darkened: #222 on the dark palette's #2b2b2b
    window (1.2:1, all but invisible), 1.7:1 on its own light one. Under Fusion each
    indicator is drawn with its palette's window lifted to :func:`indicator_outline`
    ``.lighter(140)``, so that the darkening lands on that outline; an indicator uses the
    window colour for nothing else (its fill is the base, its mark the text). Other styles
    draw their own indicators, untouched."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self._fusion = key.lower() == "fusion"

    def drawPrimitive(
        self,
        element: QStyle.PrimitiveElement,
        option: QStyleOption,
        painter: QPainter,
        widget: QWidget | None = None,
    ) -> None:
        if self._fusion and element in INDICATORS:
            option = type(option)(option)  # a copy: the caller's option stays as it was
            palette = QPalette(option.palette)
            for group in (
                QPalette.ColorGroup.Active,
                QPalette.ColorGroup.Inactive,
                QPalette.ColorGroup.Disabled,
            ):
                lifted = indicator_outline(option.palette, group).lighter(FUSION_DARKER)
                palette.setColor(group, QPalette.ColorRole.Window, lifted)
            option.palette = palette
        super().drawPrimitive(element, option, painter, widget)
