"""pyqtgraph charts of the preview: bytes per session, the largest tensors against the limits.

Each chart is a :class:`ChartBox`: a word-wrapped title, the plot, and a legend in a label
under it (so neither can clip or cover bars at any window size). Colours follow the
palette, light or dark, and the chart redraws when it changes. Every chart also carries a
plain-text summary of what it shows (tooltip and accessible description).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.preview_data import SessionSize, TensorBar
from app.theme import (
    BINDING,
    FITS,
    OVER,
    chart_background,
    chart_foreground,
    contrast_ratio,
    series_color,
    split_ghost,
)
from app.widgets.legend import Legend, LegendItem, Mark
from engine.units import format_bytes

MIB = 1024**2
LABEL_PAD = 18
"""Pixels of a category axis that are not label: the tick, its gap, rounding."""
PLOT_MARGIN = 2
"""Pixels of a plot widget's width beside its axes and view (its frame)."""
OFF_SCALE = 20
"""A limit more than this many times the largest tensor is named, not drawn: drawn, it would
squeeze every bar to a sliver."""


def unit_for(largest: float) -> tuple[float, str]:
    """The binary unit that keeps the largest value between about 1 and 2048."""
    for scale, unit in ((1024**3, "GiB"), (MIB, "MiB"), (1024, "KiB")):
        if largest >= 2 * scale:
            return scale, unit
    return 1, "B"


NOISE = ("model.", ".MatMul", ".weight")
"""Name parts that every tensor of a package shares (Hugging Face and builder naming)."""


def round_ticks(top: float, room: int, metrics: QFontMetrics) -> list[float]:
    """0, step, 2 * step, ... up to ``top`` on a horizontal axis ``room`` pixels wide: the
    least step of 1, 2 or 5 times a power of ten whose labels stand two digits apart, the
    last one whole before the axis' end (a label is centred on its tick: pyqtgraph hides
    one that reaches past the plot, so "500" near the end of a narrow axis left a scale of
    one "0"). Where even one step of the scale does not fit, 0 and the roundest value
    whose label fits (an axis with one label says nothing of its scale)."""
    if not math.isfinite(top) or top <= 0:
        return [0.0]
    gap = 2 * metrics.horizontalAdvance("0")

    def width(value: float) -> int:
        return metrics.horizontalAdvance(f"{value:g}") + 2  # the painter's box is a bit wider

    def fits_the_end(value: float) -> bool:
        return room * value / top + width(value) / 2 <= room

    exponent = math.floor(math.log10(top))
    steps = [f * 10.0**e for e in range(exponent - 2, exponent + 1) for f in (1, 2, 5)]
    steps = [step for step in steps if step <= top]
    for step in steps:
        values = [i * step for i in range(int(top / step + 1e-9) + 1)]
        while values and not fits_the_end(values[-1]):
            values.pop()
        if len(values) < 2:
            continue
        widest = max(width(v) for v in values[1:])
        if room * step / top >= widest + gap:
            return values
    for step in reversed(steps):  # the roundest first
        for k in range(int(top / step + 1e-9), 0, -1):
            value = k * step
            apart = room * value / top >= (width(0) + width(value)) / 2 + gap
            if fits_the_end(value) and apart:
                return [0.0, value]
    return [0.0]


def short_name(name: str, width: int = 30) -> str:
    """A tensor name for an axis label: shared noise dropped, middle elided past ``width``."""
    for part in NOISE:
        name = name.removeprefix(part) if part.endswith(".") else name.replace(part, "")
    if len(name) <= width:
        return name
    keep = (width - 1) // 2
    return f"{name[:keep]}…{name[-(width - 1 - keep) :]}"


HEAD_LETTERS = 3
"""A shortened head keeps at least this many letters ("emb…: ")."""


def fit_labels(
    metrics: QFontMetrics, room: int, parts: Sequence[tuple[str, str, str]]
) -> list[str]:
    """Each ``(head, label, tail)`` as one label of at most ``room`` pixels. Where one is too
    wide, every head's word ("embedding: ") is cut to the same length, down to
    :data:`HEAD_LETTERS` letters and an ellipsis (or more where fewer would make two heads
    alike; a word is cut only where that makes it narrower), so the tensors' names stay
    whole as long as they can; then a label still too wide is elided in the middle. Tails
    stay whole."""

    def width(text: str) -> int:
        return metrics.horizontalAdvance(text)

    whole = [head + label + tail for head, label, tail in parts]
    if all(width(text) <= room for text in whole):
        return whole
    words = [(head.rstrip(": "), head[len(head.rstrip(": ")) :]) for head, _, _ in parts]

    def cut(letters: int) -> list[str]:
        heads = []
        for word, sep in words:
            short = f"{word[:letters]}…{sep}"
            heads.append(short if width(short) < width(word + sep) else word + sep)
        return heads

    def joined(heads: list[str]) -> list[str]:
        return [head + label + tail for head, (_, label, tail) in zip(heads, parts, strict=True)]

    longest = max(len(word) for word, _ in words)
    floor = next(
        (k for k in range(HEAD_LETTERS, longest) if len(set(cut(k))) == len(set(words))), longest
    )
    for letters in range(longest - 1, floor - 1, -1):
        texts = joined(cut(letters))
        if all(width(text) <= room for text in texts):
            return texts
    heads = cut(floor)
    return [
        text
        if width(text) <= room
        else head
        + metrics.elidedText(label, Qt.TextElideMode.ElideMiddle, room - width(head + tail))
        + tail
        for text, head, (_, label, tail) in zip(joined(heads), heads, parts, strict=True)
    ]


class ChartBox(QWidget):
    """A titled plot with its legend below; subclasses draw in :meth:`draw`."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel(title)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.title.setWordWrap(True)
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.plot = pg.PlotWidget()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMinimumHeight(120)
        self.plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        for axis in ("bottom", "left"):
            self.plot.getAxis(axis).enableAutoSIPrefix(False)
        self.legend = Legend()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        self.setAccessibleName(title)
        self.summary = ""
        self.categories: list[str] = []
        self.tick_labels: list[str] = []
        self._left_width: int | None = None
        """The left axis' width as last set (its item has it only after the next layout)."""
        self._args: tuple[Any, ...] | None = None
        self._apply_theme()

    @property
    def foreground(self) -> QColor:
        return chart_foreground(self.palette())

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._apply_theme()
            if self._args is not None:
                self.draw(*self._args)
        super().changeEvent(event)

    def _apply_theme(self) -> None:
        fg = self.foreground
        self.plot.setBackground(chart_background(self.palette()))
        for axis in ("bottom", "left"):
            item = self.plot.getAxis(axis)
            item.setPen(pg.mkPen(fg))
            item.setTextPen(pg.mkPen(fg))

    def show_data(self, *args: Any) -> None:
        """Draw these data (and again whenever the palette changes)."""
        self._args = args
        self.draw(*args)

    def draw(self, *args: Any) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Empty the plot, category labels included (clear() keeps axis ticks)."""
        self.plot.clear()
        for axis in ("bottom", "left"):
            self.plot.getAxis(axis).setTicks(None)
            self.plot.setLabel(axis, "")
        self.legend.clear()
        self.describe("")

    def describe(self, summary: str) -> None:
        """The chart's content as text (tooltip and accessible description)."""
        self.summary = summary
        self.setToolTip(summary)
        self.setAccessibleDescription(summary)

    def text(
        self,
        value: str,
        x: float,
        y: float,
        anchor: tuple[float, float],
        on: QColor | None = None,
    ) -> None:
        """``value`` at (x, y); ``on``: the colour under it, for text that sits on a bar
        (the chart's foreground or background, whichever reads better there)."""
        color = self.foreground
        if on is not None:
            background = chart_background(self.palette())
            if contrast_ratio(background, on) > contrast_ratio(color, on):
                color = background
        item = pg.TextItem(value, color=color, anchor=anchor)
        item.setPos(x, y)
        self.plot.addItem(item)

    def category_axis(
        self,
        axis: str,
        labels: Sequence[str],
        tails: Sequence[str] | None = None,
        heads: Sequence[str] | None = None,
    ) -> None:
        """One label per category (``heads[i] + labels[i] + tails[i]``). On the left axis each
        is fitted to the axis' width (:func:`fit_labels`): its head (a session name) shortens
        first, then the label is elided in the middle, never the tail (a size or a piece
        count): pyqtgraph silently skips a tick label that does not fit its axis."""
        item = self.plot.getAxis(axis)
        ends = list(tails) if tails is not None else [""] * len(labels)
        starts = list(heads) if heads is not None else [""] * len(labels)
        parts = list(zip(starts, labels, ends, strict=True))
        self.categories = [head + label + end for head, label, end in parts]
        shown = list(self.categories)
        if axis == "left":
            font = self.font()
            item.setTickFont(font)  # the font measured here is the font drawn
            metrics = QFontMetrics(font)
            widest = max((metrics.horizontalAdvance(c) for c in self.categories), default=20)
            share = max(min(150, int(self.width() * 0.6)), int(self.width() * 0.45))
            width = min(widest + LABEL_PAD, share)
            item.setWidth(width)
            self._left_width = width  # the axis takes it at the next layout
            shown = fit_labels(metrics, width - LABEL_PAD, parts)
        self.tick_labels = shown
        """The labels as drawn (elided where the full one does not fit)."""
        item.setTicks([list(enumerate(shown))])

    def value_axis(self, axis: str, top: float) -> None:
        """Ticks 0..``top`` on a horizontal value axis at a round step (:func:`round_ticks`)
        wide enough that no two labels touch at the plot's present width: pyqtgraph's own
        spacing ran "500", "1000" and "1500" together in a narrow column."""
        item = self.plot.getAxis(axis)
        metrics = QFontMetrics(item.style.get("tickFont") or self.font())
        left = self._left_width or self.plot.getAxis("left").width()
        # the left axis' width as set, not as laid out: read from its item, the width it
        # had before its labels changed gave "0 200400600800" in a narrow column
        room = int(self.plot.width() - left) - PLOT_MARGIN
        # "0" centred on the axis' left end reaches past it by half its width, which
        # pyqtgraph would hide (leaving a scale of one number); the corner has room
        item.setStyle(hideOverlappingLabels=metrics.horizontalAdvance("0"))
        ticks = round_ticks(top, max(room, 1), metrics)
        item.setTicks([[(v, f"{v:g}") for v in ticks]])

    def minimumSizeHint(self) -> QSize:
        """Room for the title, the plot's least height and the legend's rows at this
        width: a layout never squeezes the legend over the plot's axis."""
        hint = super().minimumSizeHint()
        layout = self.layout()
        if layout is None:
            return hint
        margins = layout.contentsMargins()
        inner = max(self.width(), hint.width()) - margins.left() - margins.right()
        parts = [self.plot.minimumHeight()]
        for widget in (self.title, self.legend):
            if widget.isVisibleTo(self):
                parts.append(max(widget.heightForWidth(inner), widget.minimumSizeHint().height()))
        height = sum(parts) + layout.spacing() * (len(parts) - 1) + margins.top()
        return QSize(hint.width(), max(hint.height(), height + margins.bottom()))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()  # the legend's rows (and so the least height) follow it
            if self._args is not None:
                self.draw(*self._args)  # the labels' room follows the width


class SessionSizeChart(ChartBox):
    """One stacked horizontal bar per session (any number of them), split by role."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Package size per session", parent)

    def set_sessions(self, sessions: Sequence[SessionSize]) -> None:
        self.show_data(tuple(sessions))

    def draw(self, sessions: tuple[SessionSize, ...]) -> None:
        self.reset()
        if not sessions:
            return
        scale, unit = unit_for(max(s.total for s in sessions))
        roles: list[str] = []
        for s in sessions:
            roles += [r for r in s.by_role if r not in roles]
        ordered = list(reversed(sessions))  # the first session at the top
        left = [0.0] * len(ordered)
        legend = []
        # A hairline of the background between segments: neighbours never merge.
        edge = pg.mkPen(chart_background(self.palette()), width=1)
        for role in roles:
            color = series_color(role)  # by name: the same role, the same colour everywhere
            widths = [s.by_role.get(role, 0) / scale for s in ordered]
            self.plot.addItem(
                pg.BarGraphItem(
                    x0=list(left),
                    y=list(range(len(ordered))),
                    height=0.5,
                    width=widths,
                    brush=color,
                    pen=edge,
                )
            )
            legend.append(LegendItem(role, color))
            left = [a + b for a, b in zip(left, widths, strict=True)]
        self.category_axis(
            "left", [s.name for s in ordered], [f" {format_bytes(s.total)}" for s in ordered]
        )
        self.plot.setLabel("bottom", unit)
        self.plot.setXRange(0, max(left) * 1.05, padding=0)
        self.value_axis("bottom", max(left) * 1.05)
        self.plot.setYRange(-0.7, len(ordered) - 0.3, padding=0)
        self.legend.set_items(legend)
        self.updateGeometry()
        self.describe(
            "; ".join(
                f"{s.name} ({s.filename}): {format_bytes(s.total)}"
                + "".join(f", {r} {format_bytes(b)}" for r, b in s.by_role.items())
                for s in sessions
            )
        )


class LargestTensorsChart(ChartBox):
    """The largest weights' biggest single buffer after splitting (solid) and before (pale),
    against the EP's buffer limit and storage binding limit (dashed / dotted lines)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Largest tensors vs. the buffer limit", parent)
        self.bars: Sequence[TensorBar] = ()
        self._shown = 0
        self.drawn_limits: list[str] = []
        """Which limit lines are on the plot (the others are off the scale)."""

    def set_tensors(
        self, bars: Sequence[TensorBar], limit: int | None, binding: int | None
    ) -> None:
        self.bars = bars
        self.show_data(tuple(bars), limit, binding)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)  # redraws when the width changed
        same_width = event.size().width() == event.oldSize().width()
        if self._args is not None and same_width and self.fitting_bars() != self._shown:
            self.draw(*self._args)

    def fitting_bars(self) -> int:
        """As many bars as the plot's height shows readably (a label's height each)."""
        row = QFontMetrics(self.font()).height() + 4
        return max(4, min(len(self.bars) or 1, (self.plot.height() - 40) // row))

    def draw(self, bars: tuple[TensorBar, ...], limit: int | None, binding: int | None) -> None:
        self.reset()
        self.drawn_limits = []
        self._shown = self.fitting_bars()
        if not bars:
            return
        bars = bars[: self._shown]
        ordered = list(reversed(bars))  # the largest at the top
        y = list(range(len(ordered)))
        written = max(b.largest for b in bars)
        limits = [
            (value, name, color, style)
            for value, name, color, style in (
                (limit, "buffer limit", OVER, Qt.PenStyle.DashLine),
                (binding, "storage binding limit", BINDING, Qt.PenStyle.DotLine),
            )
            if value
        ]
        shown = [lim for lim in limits if lim[0] <= OFF_SCALE * written]
        top = max([written] + [lim[0] for lim in shown]) * 1.15
        scale, unit = unit_for(top)
        clipped = [b for b in ordered if b.unsplit > top]
        ghost = pg.BarGraphItem(
            x0=0,
            y=y,
            height=0.7,
            width=[min(b.unsplit, top) / scale for b in ordered],
            brush=split_ghost(self.palette()),
            pen=pg.mkPen(None),
        )
        colors = [OVER if b.over_limit else BINDING if b.over_binding else FITS for b in ordered]
        solid = pg.BarGraphItem(
            x0=0,
            y=y,
            height=0.7,
            width=[b.largest / scale for b in ordered],
            brushes=colors,
            pen=pg.mkPen(None),
        )
        self.plot.addItem(ghost)
        self.plot.addItem(solid)
        for i, b in enumerate(ordered):
            if b in clipped:
                label = f"{format_bytes(b.unsplit)} unsplit ▸"
                self.text(label, top / scale, i, (1, 0.5), on=QColor(split_ghost(self.palette())))
        legend = [LegendItem("fits", FITS)]
        notes = []
        if OVER in colors:
            legend.append(LegendItem("over the buffer limit", OVER))
        if BINDING in colors:
            legend.append(LegendItem("over the storage binding limit", BINDING))
        if any(b.pieces > 1 for b in bars):
            legend.append(LegendItem("before splitting (×N: pieces)", split_ghost(self.palette())))
        for value, name, color, style in limits:
            if (value, name, color, style) in shown:
                self.plot.addItem(
                    pg.InfiniteLine(
                        pos=value / scale, angle=90, pen=pg.mkPen(color, width=2, style=style)
                    )
                )
                mark: Mark = "dash" if style == Qt.PenStyle.DashLine else "dot"
                legend.append(LegendItem(f"{name} {format_bytes(value)}", color, mark))
                self.drawn_limits.append(name)
            else:
                share = written / value
                notes.append(
                    f"{name} {format_bytes(value)}: off the scale (the largest tensor is "
                    f"{share * 100:.2g}% of it)"
                )
        several = len({b.session for b in bars}) > 1
        self.category_axis(
            "left",
            [short_name(b.name, width=200) for b in ordered],  # then fitted to the axis' pixels
            [f" ×{b.pieces}" if b.pieces > 1 else "" for b in ordered],
            [f"{b.session}: " if several else "" for b in ordered],
        )
        self.plot.setLabel("bottom", unit)
        self.plot.setXRange(0, top / scale, padding=0)
        self.value_axis("bottom", top / scale)
        self.plot.setYRange(-0.7, len(ordered) - 0.3, padding=0)
        self.legend.set_items(legend, "\n".join(notes))
        self.updateGeometry()
        self.describe(
            "Over the storage binding limit: only adapters that grant more can bind it. "
            + "; ".join(
                f"{b.name}: {format_bytes(b.largest)}"
                + (
                    f" in {b.pieces} pieces ({format_bytes(b.unsplit)} unsplit)"
                    if b.pieces > 1
                    else ""
                )
                + (" over the buffer limit" if b.over_limit else "")
                for b in bars
            )
        )
