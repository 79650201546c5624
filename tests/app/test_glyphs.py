"""Every character the app writes on screen is in the app's font: one it lacks is drawn as
a box (the note under the form once began with "ⓘ", which DejaVu Sans has not)."""

from __future__ import annotations

import ast
from pathlib import Path

from PySide6.QtGui import QFont, QFontInfo, QFontMetrics
from PySide6.QtWidgets import QApplication

APP = Path(__file__).resolve().parents[2] / "app"


def shown_characters() -> dict[str, list[str]]:
    """Each non-ASCII character of the app's string literals (labels, messages, tooltips,
    f-strings; not docstrings or other bare strings), with where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bare = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in bare
            ):
                for char in {c for c in node.value if ord(c) > 127}:
                    where = f"{path.relative_to(APP.parent)}:{node.lineno}"
                    found.setdefault(char, []).append(where)
    return found


def test_the_app_writes_characters_beyond_ascii():
    """The scan finds what it looks for (the arrows, marks and quotes the app uses)."""
    chars = shown_characters()
    assert {"“", "”", "…", "⚠", "→"} <= set(chars)


def test_every_character_the_app_shows_is_in_its_font(qapp):
    """The application font offscreen (DejaVu Sans, the usual Linux UI font), regular and
    bold (titles), has a glyph for each: none falls back to another font or a box."""
    regular = QApplication.font()
    bold = QFont(regular)
    bold.setBold(True)
    missing = {
        f"{char} U+{ord(char):04X} in {QFontInfo(font).family()}{' bold' * font.bold()}": where
        for font in (regular, bold)
        for char, where in shown_characters().items()
        if not QFontMetrics(font).inFontUcs4(ord(char))
    }
    assert not missing, missing
