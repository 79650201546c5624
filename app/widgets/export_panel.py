"""Export: run it, watch the stages, cancel it; on success a summary and what to do next.

Export is enabled only when it can run; otherwise the reason stands beside the button.
The log can be saved, and the equivalent command line copied.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers import ExportController
from app.package_jobs import VerifyReport, verify_job
from app.state import StudioState
from app.widgets.messages import MessageLabel
from app.widgets.tables import fill_table, read_only_table
from app.wording import error_text, render
from app.workers import Worker, start_worker
from engine.caps import get_caps
from engine.units import format_bytes


def cli_command(state: StudioState) -> str:
    """The ``python -m engine build`` line equivalent to the current settings, with a
    comment naming any option the CLI has no flag for."""
    from engine.cli_line import build_line

    line = build_line(
        state.output or "OUT",
        options=state.export_options(),
        overwrite=state.overwrite,
        **state.source.export_args(),
    )
    note = f"  # the CLI has no flag for: {', '.join(line.missing)}" if line.missing else ""
    return line.text + note


class ExportPanel(QWidget):
    """Buttons, progress and log of :class:`ExportController`, plus the success summary."""

    benchmarkRequested = Signal(str)
    editConfigRequested = Signal(str)
    inspectRequested = Signal(str)
    verified = Signal(object)

    def __init__(self, state: StudioState, controller: ExportController, parent: Any = None):
        super().__init__(parent)
        self._state = state
        self.controller = controller
        self.verify_worker: Worker | None = None
        self.export_button = _button("Ex&port", "Export the package in the background (Ctrl+E)")
        self.export_button.setDefault(True)
        self.export_button.setMinimumWidth(110)
        font = self.export_button.font()
        font.setBold(True)
        self.export_button.setFont(font)
        self.cancel_button = _button("Cancel", "Stop the export; nothing is left behind (Esc)")
        self.cancel_button.setEnabled(False)
        self.copy_cli_button = _button(
            "Copy CLI co&mmand",
            "Copy the python -m engine build line for these settings (Ctrl+Shift+C)",
        )
        self.save_log_button = _button("Save lo&g…", "Save the export log to a text file")
        self.target = MessageLabel()
        self.blocker = MessageLabel()
        self.blocker.setAccessibleName("Why Export is unavailable")
        self.stage = MessageLabel("Ready.")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.setFormat("%p%")
        self.progress.setAccessibleName("Export progress")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setMaximumBlockCount(5000)
        self.log.setAccessibleName("Export log")
        self.log.setToolTip("What the export did, stage by stage")
        self.log.setTabChangesFocus(True)

        self.summary_box = QGroupBox("Package")
        self.package_path = MessageLabel()
        font = self.package_path.font()
        font.setBold(True)
        self.package_path.setFont(font)
        self.summary = MessageLabel()
        self.files = read_only_table(["File", "Size", "Bytes"], stretch=0)
        self.files.setMaximumHeight(130)
        self.open_button = _button("&Open folder", "Open the package folder in the file manager")
        self.verify_button = _button(
            "Ver&ify",
            "Load the package in onnxruntime; compare with transformers when exported "
            "from a checkpoint",
        )
        self.bench_button = _button("&Benchmark", "Benchmark this package")
        self.config_button = _button("Edit genai_&config", "Open its genai_config.json")
        self.inspect_button = _button("Inspec&t", "Every initializer's size, dtype and split")
        self.verify_result = MessageLabel()
        self.verify_result.setMinimumHeight(44)
        actions = QHBoxLayout()
        for button in (
            self.open_button,
            self.verify_button,
            self.bench_button,
            self.config_button,
            self.inspect_button,
        ):
            actions.addWidget(button)
        actions.addStretch(1)
        box = QVBoxLayout(self.summary_box)
        box.addWidget(self.package_path)
        box.addWidget(self.summary)
        box.addWidget(self.files)
        box.addLayout(actions)
        box.addWidget(self.verify_result)
        self.summary_box.setVisible(False)

        top = QHBoxLayout()
        for button in (self.export_button, self.cancel_button):
            top.addWidget(button)
        top.addStretch(1)
        top.addWidget(self.copy_cli_button)
        top.addWidget(self.save_log_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.blocker)
        layout.addWidget(self.target)
        layout.addWidget(self.stage)
        layout.addWidget(self.progress)
        layout.addWidget(self.log, 1)
        layout.addWidget(self.summary_box, 0)

        self.export_button.clicked.connect(self._export_clicked)
        self.cancel_button.clicked.connect(controller.cancel)
        self.copy_cli_button.clicked.connect(self.copy_cli)
        self.save_log_button.clicked.connect(self.choose_log_file)
        self.open_button.clicked.connect(self.open_folder)
        self.verify_button.clicked.connect(self.verify)
        self.bench_button.clicked.connect(lambda: self.benchmarkRequested.emit(self._package()))
        self.config_button.clicked.connect(lambda: self.editConfigRequested.emit(self._package()))
        self.inspect_button.clicked.connect(lambda: self.inspectRequested.emit(self._package()))
        controller.progress.connect(self._on_progress)
        controller.logged.connect(self.log.appendPlainText)
        controller.succeeded.connect(self._on_success)
        controller.cancelled.connect(lambda: self._stopped("Cancelled: nothing was written."))
        controller.failed.connect(lambda msg: self._stopped(f"Failed: {msg}", "error"))
        controller.finished.connect(self._on_finished)
        # The last export's stage, bar and summary are about what it was asked for: a
        # new model, options or folder starts from "Ready." again.
        for signal in (state.sourceChanged, state.optionsChanged, state.outputChanged):
            signal.connect(self._context_changed)
        for signal in (
            state.sourceChanged,
            state.optionsChanged,
            state.outputChanged,
            state.overwriteChanged,
            state.previewChanged,
            state.sourceProblemChanged,
            state.formProblemChanged,
        ):
            signal.connect(self.refresh)
        self.refresh()

    def refresh(self, *_: Any) -> None:
        """Enable Export when it can run, else say why beside it."""
        output = self._state.output or "(no output folder)"
        self.target.setText(f"{self._state.source.display}  →  {output}")
        blocker = "" if self.controller.running else self._state.export_blocker()
        self.export_button.setEnabled(not self.controller.running and not blocker)
        note, level = ("", "ready") if self.controller.running else self._state.export_note()
        self.blocker.say(note, level)
        self.blocker.setVisible(bool(blocker))
        self.export_button.setToolTip(
            f"Unavailable: {blocker}"
            if blocker
            else "Export the package in the background (Ctrl+E)"
        )

    def _package(self) -> str:
        result = self.controller.result
        return str(result.output) if result is not None else self._state.package

    def _export_clicked(self) -> None:
        if self.controller.start() is None:
            self.refresh()
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

    def _set_stage(self, text: str, level: str | None = None) -> None:
        self.stage.say(text, level)

    def _stopped(self, text: str, level: str | None = None) -> None:
        """An export that wrote nothing: the bar goes back to empty, not left at the share
        it had reached."""
        self.progress.setValue(0)
        self._set_stage(text, level)

    def _context_changed(self, *_: Any) -> None:
        """Forget the last export's status (not while one runs: it is that one's)."""
        if self.controller.running:
            return
        self.progress.setValue(0)
        self._set_stage("Ready.")
        self.summary_box.setVisible(False)
        self.verify_result.setText("")

    def _on_success(self, result: Any) -> None:
        self.progress.setValue(1000)
        self._set_stage(f"Exported in {result.seconds:.2f} s.")
        capture = "on" if result.graph_capture else "off"
        share = "on" if result.share_buffer else "off"
        self.package_path.setText(str(result.output))
        self.summary.setText(
            f"{format_bytes(result.total_bytes)} in "
            f"{len(result.files)} files, {result.seconds:.2f} s; plan total "
            f"{format_bytes(result.plan.nbytes)}; graph capture {capture}, "
            f"KV share buffer {share}" + "".join(f"\nnote: {render(n)}" for n in result.notes)
        )
        fill_table(
            self.files,
            [(name, format_bytes(size), f"{size:,}") for name, size in result.files.items()],
        )
        self.summary_box.setTitle("Package ready")
        self.summary_box.setVisible(True)

    def _on_finished(self) -> None:
        self.cancel_button.setEnabled(False)
        self.refresh()

    def copy_cli(self) -> str:
        """Put the equivalent command line on the clipboard; returns it."""
        text = cli_command(self._state)
        QGuiApplication.clipboard().setText(text)
        self.log.appendPlainText(f"copied: {text}")
        return text

    def save_log(self, path: str) -> Path:
        """Write the log to ``path`` (UTF-8 text)."""
        target = Path(path)
        target.write_text(self.log.toPlainText() + "\n", encoding="utf-8")
        return target

    def choose_log_file(self) -> None:
        """Ask where to save the log, and save it there."""
        start = str(Path(self._state.output or Path.home()).parent / "export-log.txt")
        path, _ = QFileDialog.getSaveFileName(self, "Save the export log", start, "Text (*.txt)")
        if path:
            try:
                self._set_stage(f"Log saved to {self.save_log(path)}.")
            except OSError as exc:
                self._state.report_error("export", f"Cannot save the log: {exc}")

    def open_folder(self) -> bool:
        """Open the package folder in the desktop's file manager."""
        return QDesktopServices.openUrl(QUrl.fromLocalFile(self._package()))

    def verify(self) -> None:
        """Load-check the package and compare it with transformers when there is a checkpoint."""
        package = Path(self._package())
        source = self._state.source
        model_dir = None if source.is_preset else Path(source.value)
        self.verify_button.setEnabled(False)
        self.verify_result.setText("Verifying…")
        self.verify_worker = start_worker(
            partial(verify_job, package, model_dir),
            owner=self,
            name="verify",
            on_returned=self._verified,
            on_errored=self._verify_failed,
            on_progress=lambda f, m: self.verify_result.setText(f"Verifying: {m}"),
            on_finished=lambda: self.verify_button.setEnabled(True),
        )

    def _verified(self, report: VerifyReport) -> None:
        lines = [f"✔ {report.load_check.summary}"]
        result = report.result
        if result is None:
            lines.append(f"against transformers: skipped ({report.skipped})")
        else:
            verdict = "PASS" if result.passed else "FAIL"
            lines.append(
                f"against transformers: {verdict}: top-1 agreement {result.agreement:.0%}, "
                f"max |Δlogit| {result.max_abs_diff:.2e}, min cosine {result.min_cosine:.6f}"
                + "".join(f"; {r}" for r in result.reasons)
            )
            lines += [f"note: {note}" for note in result.notes]
            if result.quality is not None:
                lines.append(f"quality {result.quality.summary()}")
        if report.built_for != "cpu":
            lines.append(
                f"checked on the CPU, the reference; the Benchmark tab runs it on "
                f"{get_caps(report.built_for).display_name}"
            )
        self.verify_result.setText("\n".join(lines))
        for line in lines:
            self.log.appendPlainText(f"verify: {line}")
        self.verified.emit(report)

    def _verify_failed(self, exc: BaseException) -> None:
        message = error_text(exc)
        self.verify_result.setText(f"✘ verification failed: {message}")
        self._state.report_error("verify", f"Verify failed: {message}")


def _button(text: str, tip: str) -> QPushButton:
    button = QPushButton(text)
    button.setToolTip(tip)
    return button
