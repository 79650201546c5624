"""Colours that follow the palette (light or dark), and a dark palette to check them with.

Nothing in the app hard-codes a text colour on the window's background: text uses the
palette's own roles, and the few semantic colours (status, chart series) come from here in
a light and a dark variant, chosen by the palette's window lightness.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QWidget

_STATUS = {
    # name: (on a light background, on a dark background)
    "ready": ("#2e7d32", "#81c784"),
    "likely": ("#00796b", "#4db6ac"),
    "blocked": ("#c62828", "#ef9a9a"),
    "off": ("#616161", "#bdbdbd"),
    "unsupported": ("#616161", "#bdbdbd"),
    "warning": ("#8a6d3b", "#ffd54f"),
    "error": ("#c62828", "#ef9a9a"),
}

SERIES = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")
"""Bar fills (stacked roles); readable on white and on dark grey."""
FITS, SPLIT_GHOST_LIGHT, SPLIT_GHOST_DARK = "#4c72b0", "#c9d6ea", "#3b4a63"
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
