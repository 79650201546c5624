"""Benchmark tab: layout and wiring only (the runs live in :mod:`app.bench_controller`, the
job in :mod:`app.package_jobs`, the history in :mod:`app.history`).

Only what the package's EP supports here is offered: EPs this onnxruntime lacks, runtimes
that are not installed and graph capture where it cannot run are disabled, each with the
reason as its tooltip.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.bench_controller import BenchController
from app.bench_metrics import METRICS
from app.history import BenchRun
from app.package_jobs import BenchOutcome, BenchRequest, PackageFacts, slow_bench_note
from app.state import StudioState
from app.widgets.controls import combo, described
from app.widgets.deferred import Deferred
from app.widgets.media_inputs import MediaInputs, media_words
from app.widgets.messages import MessageLabel
from app.widgets.tables import fill_table, read_only_table
from app.widgets.tabs import roomy_tabs
from app.wording import CONTROLS
from engine.caps import get_caps, list_eps
from engine.units import format_bytes

if TYPE_CHECKING:
    from app.widgets.bench_charts import HistoryChart, LatestRunsChart


def _latest_chart() -> LatestRunsChart:
    from app.widgets.bench_charts import LatestRunsChart

    return LatestRunsChart()


def _history_chart() -> HistoryChart:
    from app.widgets.bench_charts import HistoryChart

    return HistoryChart()


CAPTURE_CHOICES = (("off", "off"), ("on", "on"), ("off and on, side by side", "both"))
COLUMNS = (
    "When",
    "Package",
    "Run",
    "Tokens",
    "Load\ns",
    "TTFT\nms",
    "Prefill\ntok/s",
    "Decode\ntok/s",
    "Peak\nRSS",
)
"""The history's columns: numbers under two-line headers, runtime, EP and capture in one
column, prompt and new tokens in another, so that at 1024 px every metric shows beside a
readable package name."""


class _FittingPage(QWidget):
    """A scroll area's page that fills the viewport and scrolls only below its least
    height: its wrapped labels make its layout height-for-width, and QScrollArea gives
    such a page its preferred height, which let the charts push the history out of sight
    in a window that fits them."""

    def heightForWidth(self, width: int) -> int:
        layout = self.layout()
        if layout is None:
            return super().heightForWidth(width)
        return layout.totalMinimumHeightForWidth(width)


class BenchPanel(QWidget):
    """The Benchmark tab."""

    finished = Signal(object)
    """The :class:`BenchOutcome` of a run that produced results."""

    def __init__(self, state: StudioState, controller: BenchController, parent: Any = None):
        super().__init__(parent)
        self._state = state
        self.controller = controller
        self.latest: BenchOutcome | None = None
        self.package = QLineEdit()
        self.package.setPlaceholderText("a package folder (the last export by default)")
        self.package.setToolTip("The package folder to benchmark (any genai package)")
        self.package.setAccessibleName("Package folder to benchmark")
        self.browse = QPushButton("Bro&wse…")
        self.browse.setToolTip("Choose a package folder")
        self.runtime = combo("runtime")
        self.ep = combo("ep", [("as built", None)])
        for name in list_eps():
            self.ep.addItem(get_caps(name).display_name, name)
        self.ep.setToolTip(
            "Where to run: the EP the package was built for, or another one this "
            "onnxruntime offers (EPs it lacks are disabled, with the reason)."
        )
        self.prompt_len = _spin("prompt_len", 1, 8192, 64)
        self.new_tokens = _spin("new_tokens", 2, 4096, 64)
        self.repeats = QSpinBox()
        self.repeats.setRange(1, 20)
        self.repeats.setValue(3)
        self.repeats.setToolTip("Timed runs; decode tok/s is their median, with min and max")
        self.repeats.setAccessibleName("Repeats")
        self.warmup = _spin("warmup", 0, 5, 1)
        self.capture = described(QComboBox(), "graph_capture")
        for label, data in CAPTURE_CHOICES:
            self.capture.addItem(label, data)
        self.capture.setToolTip(
            "Benchmark without graph capture, with it, or both (the capture run is then "
            "checked against the other: same greedy tokens). Offered only where the "
            "package and the EP can capture."
        )
        self.media = MediaInputs()
        self.run_button = QPushButton("Run &benchmark")
        self.run_button.setToolTip("Run the benchmark in the background (Ctrl+R)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the run under way at once; finished runs are kept")
        self.cancel_button.setEnabled(False)
        self.clear_button = QPushButton("C&lear history")
        self.clear_button.setToolTip("Forget every recorded run")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setAccessibleName("Benchmark progress")
        self.note = MessageLabel()
        self.note.setAccessibleName("Benchmark status")
        self._latest_chart = Deferred(_latest_chart)
        self._history_chart = Deferred(_history_chart)
        self.history_metric = QComboBox()
        for metric in METRICS:
            self.history_metric.addItem(f"{metric.title} ({metric.unit})", metric.key)
        self.history_metric.setToolTip("Which metric the runs-over-time chart shows")
        self.history_metric.setAccessibleName("History metric")
        self.table = read_only_table(COLUMNS, stretch=1)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a name's end tells most
        run_header = self.table.horizontalHeaderItem(2)
        if run_header is not None:
            run_header.setToolTip("runtime · execution provider · graph capture")
        tokens_header = self.table.horizontalHeaderItem(3)
        if tokens_header is not None:
            tokens_header.setToolTip("prompt tokens (and images, audio) → new tokens")

        for box in (self.runtime, self.ep, self.capture, self.history_metric):
            box.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            box.setMinimumContentsLength(8)  # long entries must not widen a small window
        settings = QGroupBox("Run")
        grid = QGridLayout()
        # the note below the grid, not in it: a grid gives a wrapped label spanning its
        # columns the height of a narrower one (the third line of a note was cut at 1024x700)
        rows = QVBoxLayout(settings)
        rows.addLayout(grid)
        rows.addWidget(self.note)
        package_label = QLabel("P&ackage")
        package_label.setBuddy(self.package)
        grid.addWidget(package_label, 0, 0)
        grid.addWidget(self.package, 0, 1, 1, 3)
        grid.addWidget(self.browse, 0, 4)
        for row, pairs in enumerate(
            (
                (("R&untime", self.runtime), (CONTROLS["ep"].label, self.ep)),
                (
                    (CONTROLS["prompt_len"].label, self.prompt_len),
                    (CONTROLS["new_tokens"].label, self.new_tokens),
                ),
                (("Repea&ts", self._runs()), ("&Graph capture", self.capture)),
            ),
            start=1,
        ):
            for column, (text, widget) in enumerate(pairs):
                buddy = QLabel(text)
                buddy.setBuddy(widget)
                grid.addWidget(buddy, row, column * 2)
                grid.addWidget(widget, row, column * 2 + 1, 1, 1 + column)
        grid.addWidget(self.media, 4, 0, 1, 5)
        buttons = QHBoxLayout()
        for button in (self.run_button, self.cancel_button, self.clear_button):
            buttons.addWidget(button)
        buttons.addWidget(self.progress, 1)
        grid.addLayout(buttons, 5, 0, 1, 5)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        over_time = QWidget()
        history_layout = QVBoxLayout(over_time)
        history_layout.setContentsMargins(0, 0, 0, 0)
        history_layout.addWidget(self._history_chart, 1)
        self.history_tabs = roomy_tabs()
        self.history_tabs.addTab(self.table, "History")
        self.history_tabs.addTab(over_time, "Runs over time")
        # the chart's metric beside its tab (a row of its own cost the plot its height)
        self.history_tabs.setCornerWidget(self.history_metric)
        self.history_metric.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.history_metric.setVisible(False)
        self.history_tabs.currentChanged.connect(
            lambda index: self.history_metric.setVisible(index == 1)
        )
        body = QSplitter(Qt.Orientation.Vertical)
        body.addWidget(self._latest_chart)
        body.addWidget(self.history_tabs)
        body.setStretchFactor(0, 3)
        body.setStretchFactor(1, 2)
        # the runs-over-time chart whole (tab bar, title, a 100 px plot, axis, legend): at
        # 140 px a 1280x800 window squeezed its plot to 60 px under its legend; more than
        # 190 and the window no longer fits a 1366x768 screen at 150% scaling
        self.history_tabs.setMinimumHeight(190)
        body.setChildrenCollapsible(False)
        body.setSizes([500, 260])
        page = _FittingPage()
        layout = QVBoxLayout(page)
        layout.addWidget(settings)
        layout.addWidget(body, 1)
        # The page scrolls where the window is shorter than run settings, charts and history
        # together (1024x700 after a run): its least height no longer grows the window.
        self.page_scroll = QScrollArea()
        self.page_scroll.setWidget(page)
        self.page_scroll.setWidgetResizable(True)
        self.page_scroll.setFrameShape(QFrame.Shape.NoFrame)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.page_scroll)

        self.browse.clicked.connect(self._browse)
        self.package.editingFinished.connect(lambda: controller.inspect(self.package.text()))
        self.ep.currentIndexChanged.connect(lambda *_: self._show_capture_choices())
        self.media.changed.connect(self._show_runtime_choices)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.clear_button.clicked.connect(controller.clear_history)
        self.history_metric.currentIndexChanged.connect(self.refresh)
        controller.factsChanged.connect(self._show_facts)
        controller.progress.connect(self._on_progress)
        controller.completed.connect(self._completed)
        controller.cancelled.connect(self._cancelled)
        controller.failed.connect(lambda message: self._say(f"Failed: {message}", "error"))
        controller.packageChanged.connect(self._package_changed)
        controller.finished.connect(self._finished)
        controller.historyChanged.connect(self.refresh)
        state.packageChanged.connect(self.set_package)
        self._loaded = False
        self._show_facts(None)
        if state.package:  # exported before this tab was first shown
            self.set_package(state.package)

    @property
    def latest_chart(self) -> LatestRunsChart:
        return self._latest_chart.widget

    @property
    def history_chart(self) -> HistoryChart:
        return self._history_chart.widget

    # wiring
    def set_package(self, folder: str) -> None:
        self.package.setText(folder)
        self.controller.inspect(folder)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Package folder", self._state.package_folder_start()
        )
        if folder:
            self.set_package(folder)

    def _show_facts(self, facts: PackageFacts | None) -> None:
        self.run_button.setEnabled(facts is not None and not self.controller.running)
        self.media.set_facts(facts)
        if facts is None:
            self.run_button.setToolTip("Choose a package folder first")
            return
        self.run_button.setToolTip("Run the benchmark in the background (Ctrl+R)")
        # the EP first: a narrow window cuts a combo's text at its end
        self.ep.setItemText(0, f"{get_caps(facts.ep).display_name} (as built)")
        _disable(self.ep, {None: facts.eps.get(facts.ep), **facts.eps})
        _keep_enabled_choice(self.ep)
        self._show_runtime_choices()
        self._show_capture_choices()

    def _show_runtime_choices(self) -> None:
        """Prompts with images or audio run through genai, whose processors read them; their
        length comes from the processor, not from the prompt-tokens setting."""
        facts = self.controller.facts
        if facts is None:
            return
        media = self.media.any
        reasons = dict(facts.runtimes)
        if media and not reasons.get("ort"):
            reasons["ort"] = "prompts with images or audio run through onnxruntime-genai"
        _disable(self.runtime, reasons)
        _keep_enabled_choice(self.runtime)
        self.prompt_len.setEnabled(not media)
        self.prompt_len.setToolTip(
            "Not used: the prompt is the text with the image and audio, as genai's "
            "processor makes it"
            if media
            else CONTROLS["prompt_len"].help
        )

    def _show_capture_choices(self) -> None:
        facts = self.controller.facts
        if facts is None:
            return
        problem = facts.capture_problem(self.ep.currentData())
        _disable(self.capture, {"on": problem, "both": problem})
        wanted = "off" if problem else "both"
        self.capture.setCurrentIndex(self.capture.findData(wanted))

    def _runs(self) -> QWidget:
        """The timed runs' count, then the warm-up runs', in one cell (one row less)."""
        cell = QWidget()
        row = QHBoxLayout(cell)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.repeats, 1)
        warmup = QLabel(CONTROLS["warmup"].label)
        warmup.setBuddy(self.warmup)
        row.addWidget(warmup)
        row.addWidget(self.warmup, 1)
        cell.setFocusProxy(self.repeats)  # the "Repeats" label's buddy
        return cell

    def run(self) -> Any:
        """Benchmark the package with the chosen settings (in a worker)."""
        if self.controller.facts is None:
            self._state.report_error("bench", "Choose a package folder to benchmark.")
            return None
        request = BenchRequest(
            self.controller.facts.path,
            self.runtime.currentData(),
            self.ep.currentData(),
            prompt_len=self.prompt_len.value(),
            new_tokens=self.new_tokens.value(),
            repeats=self.repeats.value(),
            warmup=self.warmup.value(),
            capture=self.capture.currentData(),
            images=self.media.images,
            audios=self.media.audios,
            prompt=self.media.text,
        )
        worker = self.controller.run(request)
        if worker is not None:
            self.run_button.setEnabled(False)
            self.cancel_button.setEnabled(True)
            self.progress.setValue(0)
            slow = slow_bench_note(request)
            if slow is None:
                self._say("Running…", "off")
            else:  # minutes on a software adapter: say so, and what a quick look takes
                text, advice = slow  # a warning only where quicker settings are offered
                self._say(f"Running… {text}.", "warning" if advice else "off")
        return worker

    def cancel(self) -> None:
        """Stop the run: its process is ended at once (:mod:`engine.child`), so the answer
        comes within a poll, however long the prompt pass under way."""
        if not self.controller.running:
            return
        self.controller.cancel()
        self.cancel_button.setEnabled(False)
        self._say("Cancelling: the run under way stops at once; finished runs are kept.", "off")

    def _cancelled(self) -> None:
        self.progress.setValue(0)
        self.progress.setFormat("%p%")
        self._say("Cancelled: no run finished.", "off")

    def _package_changed(self, path: Path | None) -> None:
        """What was said of the last package (its run, its failure) goes with it."""
        if self.controller.running:
            return
        self.latest = None
        self.progress.setValue(0)
        self.progress.setFormat("%p%")
        self._say("", None)
        if self._loaded:
            self.refresh()

    def _on_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.progress.setFormat(f"%p%  {message}")

    def _completed(self, outcome: BenchOutcome) -> None:
        self.latest = outcome
        if self._loaded:  # the history redrew before this outcome was the latest
            self.refresh()
        runs = len(outcome.results)
        # the last report's "run 2/3" goes: a cancelled or failed capture run stopped there
        planned = len(outcome.request.captures)
        self.progress.setValue(1000 * runs // planned)
        self.progress.setFormat("%p%" if runs == planned else "%p%  stopped")
        recorded = f"{runs} run{'s' * (runs != 1)} recorded"
        lines = [
            f"Cancelled during the capture-on run: the capture-off results are kept, {recorded}."
            if outcome.cancelled
            else f"Done: {recorded}."
        ]
        if outcome.results and outcome.results[0].media:
            first = outcome.results[0]
            lines.append(
                f"Prompt with {media_words(first.media)} ({first.prompt_length} tokens after "
                f"genai's processor): first token in "
                f"{first.time_to_first_token_seconds * 1e3:,.0f} ms with the encoders, then "
                f"{first.decode_tokens_per_second:,.1f} tok/s."
            )
        adapters = {r.adapter for r in outcome.results if r.adapter}
        lines += [f"Ran on the {adapter}." for adapter in sorted(adapters)]
        if outcome.agreement is not None:
            a = outcome.agreement
            lines.append(
                "Capture on generates the same tokens as off."
                if a.same_tokens
                else f"Capture on DIFFERS from off from token {a.first_difference}."
            )
        if outcome.problem and not outcome.cancelled:
            kept = "the capture-off results are kept" if runs else "nothing was kept"
            lines.append(f"Not run: {outcome.problem} ({kept}).")
        level = (
            "off"
            if outcome.cancelled
            else "warning"
            if outcome.problem or (outcome.agreement and not outcome.agreement.same_tokens)
            else "ready"
        )
        self._say(" ".join(lines), level)
        self.finished.emit(outcome)

    def _say(self, text: str, level: str | None) -> None:
        self.note.say(text, level)

    def _finished(self) -> None:
        self.run_button.setEnabled(self.controller.facts is not None)
        self.cancel_button.setEnabled(False)

    def showEvent(self, event: QShowEvent) -> None:
        if not self._loaded:  # the history (and the engine's runtime records) on first view
            self._loaded = True
            self.refresh()
        super().showEvent(event)

    def refresh(self, *_: Any) -> None:
        """Redraw the charts and the table from the history."""
        self._loaded = True
        runs = self.controller.history.runs
        latest: dict[bool, Any] = {}
        for run in self.controller.runs_of_package():  # another package's runs are not these
            latest[run.result.graph_capture] = run.result
        if self.latest is not None and self.latest.results:
            latest = {r.graph_capture: r for r in self.latest.results}
        package = self.controller.package
        self.latest_chart.set_runs(
            latest.get(False), latest.get(True), package.name if package else ""
        )
        self.history_chart.set_history(runs, self.history_metric.currentData())
        rows = [(run, run.result) for run in reversed(runs)]
        fill_table(
            self.table,
            [
                (
                    time.strftime("%m-%d %H:%M", time.localtime(run.timestamp)),
                    Path(r.package).name,
                    f"{r.runtime} · {r.ep} · {'on' if r.graph_capture else 'off'}",
                    _tokens(r),
                    f"{r.load_seconds:.2f}",
                    f"{r.time_to_first_token_seconds * 1e3:,.1f}",
                    _rate(r.prefill_tokens_per_second, 0),
                    _rate(r.decode_tokens_per_second, 1),
                    format_bytes(r.peak_rss_bytes),
                )
                for run, r in rows
            ],
            tooltips=[_run_tooltip(run) for run, _ in rows],
        )


def _rate(value: float, decimals: int) -> str:
    """tok/s as the table shows them: three significant digits under 10 (a software
    adapter's 0.079 tok/s decode is not "0.1", its 0.29 tok/s prefill not "0")."""
    return f"{value:.3g}" if 0 < value < 10 else f"{value:,.{decimals}f}"


def _tokens(r: Any) -> str:
    """``64 → 64``: the prompt's tokens (and media) and the new tokens."""
    prompt = f"{r.prompt_length} + {media_words(r.media)}" if r.media else str(r.prompt_length)
    return f"{prompt} → {r.new_tokens}"


def _run_tooltip(run: BenchRun) -> str:
    """Everything the row shortens or leaves out: the full date and path, the spread."""
    r = run.result
    capture = "on" if r.graph_capture else "off"
    return (
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.timestamp))}\n"
        f"{r.package}\n"
        f"runtime {r.runtime}, EP {r.ep} ({r.provider}), graph capture {capture}\n"
        f"{r.prompt_length} prompt tokens, {r.new_tokens} new tokens, after {r.warmup} "
        f"warm-up run{'s' * (r.warmup != 1)}\n"
        f"prefill {_rate(r.prefill_tokens_per_second, 1)} tok/s\n"
        f"decode {_rate(r.decode_tokens_per_second, 1)} tok/s (min-max "
        f"{_rate(r.decode_tokens_per_second_min, 1)}-{_rate(r.decode_tokens_per_second_max, 1)} "
        f"over {len(r.decode_tokens_per_second_runs) or r.repeats} runs)"
    )


def _spin(key: str, low: int, high: int, value: int) -> QSpinBox:
    spin = described(QSpinBox(), key)
    spin.setRange(low, high)
    spin.setValue(value)
    return spin


def _disable(box: QComboBox, reasons: dict[Any, str | None]) -> None:
    """Disable the items whose data has a reason (the reason becomes the item's tooltip)."""
    model = box.model()
    assert isinstance(model, QStandardItemModel)
    for i in range(box.count()):
        reason = reasons.get(box.itemData(i))
        model.item(i).setEnabled(not reason)
        model.item(i).setToolTip(f"Not available: {reason}" if reason else "")


def _keep_enabled_choice(box: QComboBox) -> None:
    """Move off a disabled item onto the first enabled one."""
    model = box.model()
    assert isinstance(model, QStandardItemModel)
    if model.item(box.currentIndex()).isEnabled():
        return
    for i in range(box.count()):
        if model.item(i).isEnabled():
            box.setCurrentIndex(i)
            return
