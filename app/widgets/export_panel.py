"""Export: run it, watch the stages, cancel it; on success a summary and what to do next."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices, QFontDatabase
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers import ExportController, error_text
from app.state import StudioState
from app.widgets.tables import fill_table, read_only_table
from app.workers import Worker, start_worker
from engine.units import format_bytes


class ExportPanel(QWidget):
    """Buttons, progress and log of :class:`ExportController`, plus the success summary."""

    benchmarkRequested = Signal(str)
    editConfigRequested = Signal(str)
    verified = Signal(object)

    def __init__(self, state: StudioState, controller: ExportController, parent: Any = None):
        super().__init__(parent)
        self._state = state
        self.controller = controller
        self.verify_worker: Worker | None = None
        self.export_button = QPushButton("Export")
        self.export_button.setDefault(True)
        self.export_button.setMinimumWidth(120)
        self.export_button.setStyleSheet("font-weight: 600;")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.target = QLabel()
        self.target.setStyleSheet("color: #555;")
        self.stage = QLabel("Ready.")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.setFormat("%p%")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setMaximumBlockCount(5000)

        self.summary_box = QGroupBox("Package")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(self.summary.textInteractionFlags())
        self.files = read_only_table(["File", "Size", "Bytes"], stretch=0)
        self.files.setMaximumHeight(130)
        self.open_button = QPushButton("Open folder")
        self.verify_button = QPushButton("Verify")
        self.bench_button = QPushButton("Benchmark")
        self.config_button = QPushButton("Edit genai_config")
        self.verify_result = QLabel()
        self.verify_result.setWordWrap(True)
        self.verify_result.setMinimumHeight(44)
        actions = QHBoxLayout()
        for button in (self.open_button, self.verify_button, self.bench_button, self.config_button):
            actions.addWidget(button)
        actions.addStretch(1)
        box = QVBoxLayout(self.summary_box)
        box.addWidget(self.summary)
        box.addWidget(self.files)
        box.addLayout(actions)
        box.addWidget(self.verify_result)
        self.summary_box.setVisible(False)

        top = QHBoxLayout()
        top.addWidget(self.export_button)
        top.addWidget(self.cancel_button)
        top.addWidget(self.target, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.stage)
        layout.addWidget(self.progress)
        layout.addWidget(self.log, 1)
        layout.addWidget(self.summary_box, 0)

        self.export_button.clicked.connect(self._export_clicked)
        self.cancel_button.clicked.connect(controller.cancel)
        self.open_button.clicked.connect(self.open_folder)
        self.verify_button.clicked.connect(self.verify)
        self.bench_button.clicked.connect(lambda: self.benchmarkRequested.emit(self._package()))
        self.config_button.clicked.connect(lambda: self.editConfigRequested.emit(self._package()))
        controller.progress.connect(self._on_progress)
        controller.logged.connect(self.log.appendPlainText)
        controller.succeeded.connect(self._on_success)
        controller.cancelled.connect(lambda: self._set_stage("Cancelled: nothing was written."))
        controller.failed.connect(lambda msg: self._set_stage("Failed (see the message above)."))
        controller.finished.connect(self._on_finished)
        state.outputChanged.connect(self._show_target)
        state.sourceChanged.connect(lambda *_: self._show_target(state.output))
        self._show_target(state.output)

    def _show_target(self, output: str) -> None:
        self.target.setText(f"{self._state.source.display}  →  {output or '(no output folder)'}")

    def _package(self) -> str:
        result = self.controller.result
        return str(result.output) if result is not None else self._state.package

    def _export_clicked(self) -> None:
        if self.controller.start() is None:
            return
        self.summary_box.setVisible(False)
        self.verify_result.setText("")
        self.progress.setValue(0)
        self.export_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self._set_stage("Starting…")

    def _on_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self._set_stage(message)

    def _set_stage(self, text: str) -> None:
        self.stage.setText(text)

    def _on_success(self, result: Any) -> None:
        self.progress.setValue(1000)
        self._set_stage(f"Exported in {result.seconds:.2f} s.")
        capture = "on" if result.graph_capture else "off"
        share = "on" if result.share_buffer else "off"
        self.summary.setText(
            f"<b>{result.output}</b><br>{format_bytes(result.total_bytes)} in "
            f"{len(result.files)} files, {result.seconds:.2f} s; plan total "
            f"{format_bytes(result.plan.nbytes)}; graph capture {capture}, "
            f"KV share buffer {share}" + "".join(f"<br>note: {n}" for n in result.notes)
        )
        fill_table(
            self.files,
            [(name, format_bytes(size), f"{size:,}") for name, size in result.files.items()],
        )
        self.summary_box.setTitle("Package ready")
        self.summary_box.setVisible(True)

    def _on_finished(self) -> None:
        self.export_button.setEnabled(True)
        self.cancel_button.setEnabled(False)

    def open_folder(self) -> bool:
        """Open the package folder in the desktop's file manager."""
        return QDesktopServices.openUrl(QUrl.fromLocalFile(self._package()))

    def verify(self) -> None:
        """Load-check the package and compare it with transformers when the engine can."""
        from app.runtime_adapter import run_verify

        package = Path(self._package())
        source = self._state.source
        model_dir = None if source.is_preset else Path(source.value)
        self.verify_button.setEnabled(False)
        self.verify_result.setText("Verifying…")
        self.verify_worker = start_worker(
            lambda progress, cancel: run_verify(package, model_dir, progress, cancel),
            owner=self,
            name="verify",
            on_returned=self._verified,
            on_errored=self._verify_failed,
            on_progress=lambda f, m: self.verify_result.setText(f"Verifying: {m}"),
            on_finished=lambda: self.verify_button.setEnabled(True),
        )

    def _verified(self, report: dict[str, Any]) -> None:
        lines = [f"✔ {report['load_check']}"]
        verdict = report.get("verdict") or report.get("verify")
        lines.append(f"against transformers: {verdict}")
        self.verify_result.setText("<br>".join(lines))
        self.log.appendPlainText(f"verify: {report['load_check']}")
        self.log.appendPlainText(f"verify: {report.get('verdict') or report.get('verify')}")
        self.verified.emit(report)

    def _verify_failed(self, exc: BaseException) -> None:
        self.verify_result.setText("✘ verification failed (see the message above)")
        self._state.report_error("verify", f"Verify failed: {error_text(exc)}")
