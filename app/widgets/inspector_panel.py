"""Inspector: open any ONNX package folder (ours or another exporter's) and see what it holds.

Sessions from its genai_config, every initializer's size, dtype and shape (read without
the weight data), the splits, the largest tensors against the EP's limits; from here its
genai_config opens in the editor, the graph-capture audit runs, and the benchmark starts.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.findings import audit_lines
from app.inspect_data import limits_for, session_sizes, tensor_bars
from app.package_jobs import inspect_job, package_audit_job
from app.state import StudioState
from app.widgets.controls import allow
from app.widgets.deferred import Deferred
from app.widgets.messages import MessageLabel
from app.widgets.tables import fill_table, read_only_table
from app.widgets.tabs import roomy_tabs
from app.wording import error_text
from app.workers import Worker, start_worker
from engine.caps import get_caps
from engine.inspect import PackageInfo
from engine.units import format_bytes

if TYPE_CHECKING:
    from app.widgets.charts import LargestTensorsChart, SessionSizeChart


CONFIG_TIP = "Open its genai_config.json"
AUDIT_TIP = "Which nodes would break graph capture on the package's EP"
BENCH_TIP = "Benchmark this package"


def _sizes_chart() -> SessionSizeChart:
    from app.widgets.charts import SessionSizeChart

    chart = SessionSizeChart()
    chart.title.setText("Bytes per session, by dtype")
    return chart


def _tensors_chart() -> LargestTensorsChart:
    from app.widgets.charts import LargestTensorsChart

    return LargestTensorsChart()


class InspectorPanel(QWidget):
    """The Inspector tab."""

    inspected = Signal(object)
    """The :class:`engine.inspect.PackageInfo` now shown."""
    audited = Signal(list)
    editConfigRequested = Signal(str)
    benchmarkRequested = Signal(str)

    def __init__(self, state: StudioState, parent: Any = None) -> None:
        super().__init__(parent)
        self._state = state
        self.info: PackageInfo | None = None
        self.worker: Worker | None = None
        self.folder = QLineEdit()
        self.folder.setPlaceholderText("any ONNX package folder (genai_config.json + .onnx files)")
        self.folder.setToolTip("A package folder: ours, or one from another exporter")
        self.folder.setAccessibleName("Package folder to inspect")
        self.browse = _button("Bro&wse…", "Choose a package folder to inspect")
        self.summary = MessageLabel(
            "Open a package folder (File ▸ Open package…, or drop one here)."
        )
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.config_button = _button("Edit genai_&config", CONFIG_TIP)
        self.audit_button = _button("&Audit graph capture", AUDIT_TIP)
        self.bench_button = _button("&Benchmark", BENCH_TIP)
        self._sizes = Deferred(_sizes_chart)
        self._tensors = Deferred(_tensors_chart)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter by name, e.g. embed or .scales")
        self.filter.setToolTip("Show only initializers whose name contains this text")
        self.filter.setAccessibleName("Filter initializers")
        self.filter.setClearButtonEnabled(True)
        self.initializers = read_only_table(
            ["Session", "Initializer", "Dtype", "Shape", "Size", "Bytes", "Stored in"], stretch=1
        )
        self.initializers.setSortingEnabled(True)
        self.splits = read_only_table(
            ["Session", "Tensor", "Pieces", "Largest piece", "Total"], stretch=1
        )
        self.sessions = read_only_table(
            ["Session", "File", "Nodes", "Initializers", "Bytes", "Opsets", "Producer"], stretch=1
        )
        self.audit = QListWidget()
        self.audit.setWordWrap(True)
        self.audit.setAccessibleName("Graph-capture audit")

        top = QHBoxLayout()
        top.addWidget(self.folder, 1)
        top.addWidget(self.browse)
        actions = QHBoxLayout()
        for button in (self.config_button, self.audit_button, self.bench_button):
            actions.addWidget(button)
        self._allow_actions(None)
        actions.addStretch(1)
        charts = QSplitter(Qt.Orientation.Horizontal)
        charts.addWidget(self._sizes)
        charts.addWidget(self._tensors)
        charts.setSizes([380, 620])
        listing = QWidget()
        listing_layout = QVBoxLayout(listing)
        listing_layout.setContentsMargins(0, 0, 0, 0)
        listing_layout.addWidget(self.filter)
        listing_layout.addWidget(self.initializers, 1)
        self.details = roomy_tabs()
        self.details.addTab(listing, "Initializers")
        self.details.addTab(self.sessions, "Sessions")
        self.details.addTab(self.splits, "Splits")
        self.details.addTab(self.audit, "Audit")
        self.body = body = QSplitter(Qt.Orientation.Vertical)
        body.addWidget(charts)
        body.addWidget(self.details)
        body.setSizes([330, 400])
        # Until a package is open, charts and tables would only show blank 0-1 axes and
        # empty rows: the sentence above says what to do, at the top of an empty page.
        body.hide()
        self._filler = QWidget()
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.summary)
        layout.addLayout(actions)
        layout.addWidget(body, 1)
        layout.addWidget(self._filler, 1)

        self.browse.clicked.connect(self._browse)
        self.folder.returnPressed.connect(lambda: self.open(self.folder.text()))
        self.filter.textChanged.connect(self._filter)
        self.audit_button.clicked.connect(self.run_audit)
        self.config_button.clicked.connect(lambda: self.editConfigRequested.emit(self.path))
        self.bench_button.clicked.connect(lambda: self.benchmarkRequested.emit(self.path))

    @property
    def sizes(self) -> SessionSizeChart:
        return self._sizes.widget

    @property
    def tensors(self) -> LargestTensorsChart:
        return self._tensors.widget

    @property
    def path(self) -> str:
        """The folder shown (empty when none)."""
        return str(self.info.path) if self.info is not None else ""

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Package folder to inspect", self._state.package_folder_start()
        )
        if folder:
            self.open(folder)

    def open(self, folder: str) -> Worker | None:
        """Inspect a package folder in a worker; errors go to the error banner."""
        if not folder.strip():
            return None
        self.folder.setText(folder)
        self.summary.setText(f"Reading {folder}…")
        self.worker = start_worker(
            partial(inspect_job, Path(folder).expanduser()),
            owner=self,
            name="inspect",
            on_returned=self._show,
            on_errored=self._failed,
        )
        return self.worker

    def _failed(self, exc: BaseException) -> None:
        message = error_text(exc)
        self.summary.setText(f"Not inspected: {message}")
        self._state.report_error("inspect", f"Cannot inspect the folder: {message}")

    def _show(self, info: PackageInfo) -> None:
        self._state.clear_error("inspect")
        self.info = info
        self._filler.hide()
        self.body.show()
        limits = limits_for(info)
        ep = info.ep
        problems = "".join(f"\n⚠ {p}" for p in info.problems)
        self.summary.setText(
            f"{info.path.name}: {len(info.sessions)} session(s), "
            f"{format_bytes(info.nbytes)} of initializers in {len(info.files)} files; "
            f"made by {info.producer}; EP {get_caps(ep).display_name if ep else 'not named'}; "
            f"limit: {format_bytes(limits.buffer) if limits.buffer else 'none'} "
            f"({limits.source}){problems}"
        )
        self.sizes.set_sessions(session_sizes(info))
        self.tensors.set_tensors(tensor_bars(info, limits), limits.buffer, limits.binding)
        table = self.initializers
        table.setSortingEnabled(False)
        fill_table(
            table,
            [
                (
                    s.name,
                    t.name,
                    t.dtype,
                    "×".join(map(str, t.shape)) or "scalar",
                    format_bytes(t.nbytes),
                    f"{t.nbytes:,}",
                    t.location or "(inside the .onnx)",
                )
                for s in info.sessions
                for t in s.initializers
            ],
        )
        table.setSortingEnabled(True)
        fill_table(
            self.sessions,
            [
                (
                    s.name,
                    s.filename,
                    s.nodes,
                    len(s.initializers),
                    format_bytes(s.nbytes),
                    ", ".join(f"{d} {v}" for d, v in s.opsets.items()),
                    s.producer or "?",
                )
                for s in info.sessions
            ],
        )
        rows = [
            (s.name, g.base, g.pieces, format_bytes(g.largest), format_bytes(g.nbytes))
            for s in info.sessions
            for g in s.splits()
        ]
        fill_table(self.splits, rows or [("", "nothing is split", "", "", "")])
        self.audit.clear()
        self.audit.addItem("Press Audit graph capture to check every session's graph.")
        self._allow_actions(info)
        self._filter(self.filter.text())
        self.inspected.emit(info)

    def _allow_actions(self, info: PackageInfo | None) -> None:
        """The actions a package allows; a disabled one says why in its tooltip."""
        why: str | None = None
        if info is None:
            why = "Open a package folder first (File ▸ Open package…, or drop one here)."
        elif info.genai_config is None:
            why = "This folder has no genai_config.json: only genai packages have one."
        audit_why = why
        if info is not None and why is None and info.ep is None:
            audit_why = (
                "The package does not say which execution provider it is for (no "
                "export_studio.json, no provider in its genai_config): the audit checks "
                "the graphs against one."
            )
        allow(self.config_button, CONFIG_TIP, why)
        allow(self.bench_button, BENCH_TIP, why)
        allow(self.audit_button, AUDIT_TIP, audit_why)

    def _filter(self, text: str) -> None:
        needle = text.strip().lower()
        table = self.initializers
        for row in range(table.rowCount()):
            item = table.item(row, 1)
            name = item.text().lower() if item is not None else ""
            table.setRowHidden(row, bool(needle) and needle not in name)

    def run_audit(self) -> Worker | None:
        if self.info is None or self.info.ep is None:
            return None
        self.audit_button.setEnabled(False)
        self.audit.clear()
        self.audit.addItem("Auditing…")
        self.details.setCurrentIndex(3)
        return start_worker(
            partial(package_audit_job, self.info.path, self.info.ep),
            owner=self,
            name="package-audit",
            on_returned=self._audited,
            on_errored=self._failed,
            on_finished=lambda: self.audit_button.setEnabled(True),
        )

    def _audited(self, result: tuple[list[Any], dict[str, str]]) -> None:
        audits, never = result
        self.audit.clear()
        for audit in audits:
            nodes = sum(audit.op_counts.values())
            if audit.session in never:  # by design (input shapes), not a finding
                self.audit.addItem(
                    f"{audit.session} on {audit.ep}: never captured: "
                    f"{never[audit.session]} ({nodes} nodes)"
                )
                continue
            state = "ready" if audit.capture_ready else "NOT ready"
            self.audit.addItem(
                f"{audit.session} on {audit.ep}: graph capture {state} ({nodes} nodes)"
            )
            shown = audit_lines(audit)  # findings grouped by op type; node names as tooltips
            for line, detail in zip(shown.lines, shown.details, strict=True):
                item = QListWidgetItem(f"    {line}")
                item.setToolTip(detail)
                self.audit.addItem(item)
        if not audits:
            self.audit.addItem("genai_config names none of the sessions the audit knows.")
        self.audited.emit(audits)


def _button(text: str, tip: str) -> QPushButton:
    button = QPushButton(text)
    button.setToolTip(tip)
    return button
