"""pyqtgraph charts: session sizes, the largest tensors against the buffer limit, tok/s."""

from __future__ import annotations

from collections.abc import Sequence

import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.preview_data import SessionSize, TensorBar
from app.runtime_adapter import BenchRecord
from engine.units import format_bytes

pg.setConfigOptions(antialias=True, background="w", foreground="#333")

MIB = 1024**2
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")
OK, SPLIT_GHOST, OVER, BINDING = "#4c72b0", "#c9d6ea", "#c44e52", "#dd8452"
CAPTURE_OFF, CAPTURE_ON = "#8c9bb0", "#dd8452"


def _unit(largest: float) -> tuple[float, str]:
    """The binary unit that keeps the largest value between about 1 and 2048."""
    for scale, unit in ((1024**3, "GiB"), (MIB, "MiB"), (1024, "KiB")):
        if largest >= 2 * scale:
            return scale, unit
    return 1, "B"


class _Chart(pg.PlotWidget):
    """A plot with a title, no mouse zoom (these are read, not explored) and a legend."""

    def __init__(self, title: str, parent: object = None) -> None:
        super().__init__(parent=parent)
        self.setTitle(title, size="10pt")
        self.setMouseEnabled(x=False, y=False)
        self.setMenuEnabled(False)
        self.hideButtons()
        self.showGrid(x=True, y=False, alpha=0.25)
        self.setMinimumHeight(180)
        for axis in ("bottom", "left"):
            self.getAxis(axis).enableAutoSIPrefix(False)
        self.legend_offset = (-10, 10)

    def reset(self) -> None:
        """Empty the chart, category labels included (clear() keeps axis ticks)."""
        self.clear()
        self._legend()
        for axis in ("bottom", "left"):
            self.getAxis(axis).setTicks(None)

    def _legend(self) -> pg.LegendItem:
        legend = self.getPlotItem().legend
        if legend is None:
            legend = self.addLegend(offset=self.legend_offset, labelTextSize="8pt")
            legend.setBrush(pg.mkBrush(255, 255, 255, 220))
        legend.clear()
        return legend

    def _category_axis(self, labels: Sequence[str], width: int = 190) -> None:
        axis = self.getAxis("left")
        axis.setTicks([list(enumerate(labels))])
        axis.setWidth(width)


class SessionSizeChart(_Chart):
    """One stacked horizontal bar per session, split by what the bytes are."""

    def __init__(self, parent: object = None) -> None:
        super().__init__("Package size per session", parent)

    def set_sessions(self, sessions: Sequence[SessionSize]) -> None:
        self.reset()
        legend = self._legend()
        if not sessions:
            return
        scale, unit = _unit(max(s.total for s in sessions))
        roles: list[str] = []
        for s in sessions:
            roles += [r for r in s.by_role if r not in roles]
        left = [0.0] * len(sessions)
        for i, role in enumerate(roles):
            widths = [s.by_role.get(role, 0) / scale for s in sessions]
            bars = pg.BarGraphItem(
                x0=list(left),
                y=list(range(len(sessions))),
                height=0.4,
                width=widths,
                brush=PALETTE[i % len(PALETTE)],
                pen=pg.mkPen("w", width=0.5),
            )
            self.addItem(bars)
            legend.addItem(bars, role)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        for i, s in enumerate(sessions):
            label = pg.TextItem(f" {format_bytes(s.total)}", color="#333", anchor=(0, 0.5))
            label.setPos(left[i], i)
            self.addItem(label)
        self._category_axis([f"{s.name} ({s.filename})" for s in sessions], 130)
        self.setLabel("bottom", unit)
        self.setXRange(0, max(left) * 1.45, padding=0)
        self.setYRange(-0.8, len(sessions) - 0.2 + 0.8 * (len(sessions) == 1), padding=0)


class LargestTensorsChart(_Chart):
    """The largest weights' biggest single buffer, after (solid) and before (pale) splitting,
    against the EP's buffer limit and storage binding limit."""

    def __init__(self, parent: object = None) -> None:
        super().__init__("Largest tensors vs. the buffer limit", parent)
        self.legend_offset = (-10, -30)  # bottom right: the smallest bars are there
        self.bars: Sequence[TensorBar] = ()

    def set_tensors(
        self, bars: Sequence[TensorBar], limit: int | None, binding: int | None
    ) -> None:
        self.reset()
        legend = self._legend()
        self.bars = bars
        if not bars:
            return
        ordered = list(reversed(bars))  # the largest at the top
        y = list(range(len(ordered)))
        scale, unit = _unit(max([b.unsplit for b in bars] + [limit or 0]))
        ghost = pg.BarGraphItem(
            x0=0,
            y=y,
            height=0.7,
            width=[b.unsplit / scale for b in ordered],
            brush=SPLIT_GHOST,
            pen=pg.mkPen(None),
        )
        solid = pg.BarGraphItem(
            x0=0,
            y=y,
            height=0.7,
            width=[b.largest / scale for b in ordered],
            brush=OK,
            brushes=[OVER if b.over_limit else BINDING if b.over_binding else OK for b in ordered],
            pen=pg.mkPen(None),
        )
        self.addItem(ghost)
        self.addItem(solid)
        legend.addItem(solid, "largest buffer as written")
        if any(b.pieces > 1 for b in bars):
            legend.addItem(ghost, "before splitting")
        for value, color, style, text in (
            (limit, OVER, Qt.PenStyle.DashLine, "buffer limit"),
            (binding, BINDING, Qt.PenStyle.DotLine, "binding limit"),
        ):
            if value:
                line = pg.InfiniteLine(
                    pos=value / scale,
                    angle=90,
                    pen=pg.mkPen(color, width=2, style=style),
                    label=f"{text} {value / MIB:,.0f} MiB",
                    labelOpts={
                        "position": 0.04 if text == "buffer limit" else 0.12,
                        "color": color,
                        "anchors": [(0, 1), (0, 1)],
                    },
                )
                self.addItem(line)
        labels = [
            b.name.removesuffix(".weight") + (f" ×{b.pieces}" if b.pieces > 1 else "")
            for b in ordered
        ]
        self._category_axis(labels)
        self.setLabel("bottom", unit)
        top = max([b.unsplit for b in bars] + [limit or 0, binding or 0]) / scale
        self.setXRange(0, top * 1.05, padding=0)
        self.setYRange(-0.6, len(ordered) - 0.4, padding=0)


class TokensPerSecondChart(_Chart):
    """Prefill and decode tokens/s of the latest runs, capture off vs on."""

    def __init__(self, parent: object = None) -> None:
        super().__init__("Tokens per second (latest runs)", parent)
        self.showGrid(x=False, y=True, alpha=0.25)

    def set_runs(self, off: BenchRecord | None, on: BenchRecord | None) -> None:
        self.clear()
        legend = self._legend()
        for offset, record, color, name in (
            (-0.18, off, CAPTURE_OFF, "capture off"),
            (0.18, on, CAPTURE_ON, "capture on"),
        ):
            if record is None:
                continue
            values = [record.prefill_tps or 0.0, record.decode_tps or 0.0]
            bars = pg.BarGraphItem(x=[offset, 1 + offset], height=values, width=0.34, brush=color)
            self.addItem(bars)
            legend.addItem(bars, name)
            for x, v in zip((offset, 1 + offset), values, strict=True):
                text = pg.TextItem(f"{v:,.1f}", color="#333", anchor=(0.5, 1))
                text.setPos(x, v)
                self.addItem(text)
        self.getAxis("bottom").setTicks([[(0, "prefill"), (1, "decode")]])
        self.setLabel("left", "tokens/s")
        self.setXRange(-0.6, 1.6, padding=0)
        peaks = [v for r in (off, on) if r for v in (r.prefill_tps or 0, r.decode_tps or 0)]
        self.setYRange(0, max(peaks or [1]) * 1.2, padding=0)


class HistoryChart(_Chart):
    """One metric (decode or prefill tokens/s) of every run, capture off vs on."""

    def __init__(self, parent: object = None) -> None:
        super().__init__("Runs over time", parent)
        self.showGrid(x=True, y=True, alpha=0.25)
        self.legend_offset = (-10, -30)

    def set_history(self, records: Sequence[BenchRecord], field: str = "decode_tps") -> None:
        self.clear()
        legend = self._legend()
        for capture, color in ((False, CAPTURE_OFF), (True, CAPTURE_ON)):
            points = [
                (i + 1, getattr(r, field))
                for i, r in enumerate(records)
                if r.capture == capture and getattr(r, field)
            ]
            if points:
                item = self.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    pen=pg.mkPen(color, width=2),
                    symbol="o",
                    symbolSize=7,
                    symbolBrush=color,
                    symbolPen=None,
                )
                legend.addItem(item, "capture on" if capture else "capture off")
        runs = len(records)
        step = max(1, runs // 10)
        self.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, runs + 1, step)]])
        self.setTitle(f"Runs over time: {field.split('_')[0]} tokens/s", size="10pt")
        self.setLabel("left", "tokens/s")
        self.setLabel("bottom", "run")
        values = [getattr(r, field) or 0 for r in records]
        self.setYRange(0, max(values or [1]) * 1.15, padding=0)
        self.setXRange(0.5, max(runs, 1) + 0.5, padding=0)
