"""Benchmark: run the engine's bench in a worker, chart tok/s, keep a history to compare."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.controllers import error_text
from app.history import BenchHistory
from app.runtime_adapter import BenchRecord, BenchSettings, availability, run_bench
from app.state import StudioState
from app.widgets.charts import HistoryChart, TokensPerSecondChart
from app.widgets.tables import fill_table, read_only_table
from app.workers import Worker, start_worker
from engine.progress import CancelToken, Progress

CAPTURE_MODES = (("off and on", (False, True)), ("off", (False,)), ("on", (True,)))


def bench_job(package: Path, settings: list[BenchSettings]) -> Any:
    """One bench run per setting (capture off / on), as a plain job function."""

    def job(progress: Progress, cancel: CancelToken) -> list[BenchRecord]:
        records = []
        share = 1 / len(settings)
        for i, setting in enumerate(settings):

            def part(fraction: float, message: str, i: int = i) -> None:
                progress((i + fraction) * share, message)

            records.append(run_bench(package, setting, part, cancel))
            cancel.raise_if_cancelled()
        return records

    return job


class BenchPanel(QWidget):
    """The Benchmark tab."""

    finished = Signal(list)

    def __init__(self, state: StudioState, history: BenchHistory, parent: Any = None) -> None:
        super().__init__(parent)
        self._state = state
        self.history = history
        self.worker: Worker | None = None
        self.package = QLineEdit()
        self.package.setPlaceholderText("a package folder (the last export by default)")
        browse = QPushButton("Browse…")
        self.runtime = QComboBox()
        self.runtime.addItem("onnxruntime (our runner)", "ort")
        self.runtime.addItem("onnxruntime-genai", "genai")
        self.prompt_len = _spin(1, 8192, 64)
        self.new_tokens = _spin(1, 4096, 64)
        self.capture = QComboBox()
        for label, modes in CAPTURE_MODES:
            self.capture.addItem(label, modes)
        self.run_button = QPushButton("Run benchmark")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.clear_button = QPushButton("Clear history")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.tps_chart = TokensPerSecondChart()
        self.history_chart = HistoryChart()
        self.history_metric = QComboBox()
        self.history_metric.addItem("decode tokens/s", "decode_tps")
        self.history_metric.addItem("prefill tokens/s", "prefill_tps")
        self.table = read_only_table(
            [
                "When",
                "Package",
                "Runtime",
                "Capture",
                "Prompt",
                "New",
                "Prefill tok/s",
                "Decode tok/s",
            ],
            stretch=1,
        )

        settings = QGroupBox("Run")
        form = QFormLayout(settings)
        row = QHBoxLayout()
        row.addWidget(self.package, 1)
        row.addWidget(browse)
        form.addRow("Package", row)
        form.addRow("Runtime", self.runtime)
        form.addRow("Prompt tokens", self.prompt_len)
        form.addRow("New tokens", self.new_tokens)
        form.addRow("Graph capture", self.capture)
        buttons = QHBoxLayout()
        for button in (self.run_button, self.cancel_button, self.clear_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        form.addRow(buttons)
        form.addRow(self.progress)
        form.addRow(self.note)
        over_time = QWidget()
        history_layout = QVBoxLayout(over_time)
        history_layout.setContentsMargins(0, 0, 0, 0)
        history_layout.addWidget(self.history_chart, 1)
        history_layout.addWidget(self.history_metric)
        charts = QSplitter(Qt.Orientation.Horizontal)
        charts.addWidget(self.tps_chart)
        charts.addWidget(over_time)
        top = QHBoxLayout()
        top.addWidget(settings, 2)
        top.addWidget(charts, 5)
        history_box = QGroupBox("History")
        QVBoxLayout(history_box).addWidget(self.table)
        layout = QVBoxLayout(self)
        layout.addLayout(top, 3)
        layout.addWidget(history_box, 2)

        browse.clicked.connect(self._browse)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(lambda: self.worker and self.worker.cancel())
        self.clear_button.clicked.connect(self._clear)
        self.history_metric.currentIndexChanged.connect(self.refresh)
        state.packageChanged.connect(self.set_package)
        self._show_availability()
        self.refresh()

    def _show_availability(self) -> None:
        found = availability("bench")
        self.note.setText(
            "Runs engine.runtime.bench in a worker thread."
            if found.available
            else f"<span style='color:#8a6d3b'>Benchmark not available: {found.message}</span>"
        )

    def set_package(self, folder: str) -> None:
        self.package.setText(folder)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Package folder")
        if folder:
            self.package.setText(folder)

    def run(self) -> Worker | None:
        """Bench the package (capture off and/or on) in a worker."""
        text = self.package.text().strip()
        if not text:
            self._state.report_error("bench", "Choose a package folder to benchmark.")
            return None
        self._state.clear_error("bench")
        settings = [
            BenchSettings(
                self.runtime.currentData(),
                self.prompt_len.value(),
                self.new_tokens.value(),
                capture,
            )
            for capture in self.capture.currentData()
        ]
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setValue(0)
        self.worker = start_worker(
            bench_job(Path(text), settings),
            owner=self,
            name="bench",
            on_returned=self._returned,
            on_errored=self._errored,
            on_progress=self._on_progress,
            on_finished=self._finished,
        )
        return self.worker

    def _on_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.progress.setFormat(f"%p%  {message}")

    def _returned(self, records: list[BenchRecord]) -> None:
        self.progress.setValue(1000)
        self.progress.setFormat(f"%p%  done: {len(records)} run(s)")
        for record in records:
            self.history.add(record)
        self.refresh()
        self.finished.emit(records)

    def _errored(self, exc: BaseException) -> None:
        self._state.report_error("bench", f"Benchmark failed: {error_text(exc)}")
        self._show_availability()

    def _finished(self) -> None:
        self.worker = None
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)

    def _clear(self) -> None:
        self.history.clear()
        self.refresh()

    def refresh(self, *_: Any) -> None:
        """Redraw the charts and the table from the history."""
        records = self.history.records
        latest = {r.capture: r for r in records}
        self.tps_chart.set_runs(latest.get(False), latest.get(True))
        self.history_chart.set_history(records, self.history_metric.currentData())
        fill_table(
            self.table,
            [
                (
                    time.strftime("%Y-%m-%d %H:%M", time.localtime(r.timestamp)),
                    Path(r.package).name,
                    r.runtime,
                    "on" if r.capture else "off",
                    r.prompt_len,
                    r.new_tokens,
                    _tps(r.prefill_tps),
                    _tps(r.decode_tps),
                )
                for r in reversed(records)
            ],
        )


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _spin(low: int, high: int, value: int) -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value)
    return spin
