"""The main window: model and target on the left; preview, export, config and benchmark tabs.

It only lays out and wires: state is in :class:`StudioState`, work in the controllers'
workers, and every error shows in the one banner above the tabs.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QThreadPool, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QMainWindow,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import APP_NAME
from app.controllers import ExportController, PreviewController
from app.history import BenchHistory
from app.settings import AppSettings
from app.state import StudioState
from app.warmup import start_warm_up
from app.widgets.bench_panel import BenchPanel
from app.widgets.config_editor import ConfigEditor
from app.widgets.error_banner import ErrorBanner
from app.widgets.export_panel import ExportPanel
from app.widgets.model_panel import ModelPanel
from app.widgets.preview_panel import PreviewPanel
from app.widgets.target_panel import TargetPanel

TABS = ("Preview", "Export", "genai_config", "Benchmark")


class MainWindow(QMainWindow):
    """Export Studio's one window."""

    def __init__(self, settings: AppSettings | None = None) -> None:
        super().__init__()
        self.setWindowTitle(APP_NAME)
        self.settings = settings or AppSettings()
        self.state = StudioState(self)
        self.settings.restore_state(self.state)
        self.previewer = PreviewController(self.state)
        self.exporter = ExportController(self.state)

        self.model_panel = ModelPanel(self.state, self.settings.recent_sources())
        self.target_panel = TargetPanel(self.state)
        self.export_shortcut = QPushButton("Export…")
        self.export_shortcut.setStyleSheet("font-weight: 600; padding: 6px;")
        self.banner = ErrorBanner(self.state)
        self.preview = PreviewPanel()
        self.export_panel = ExportPanel(self.state, self.exporter)
        self.config_editor = ConfigEditor(self.state)
        self.bench_panel = BenchPanel(self.state, BenchHistory(self.settings.data_dir()))
        self.tabs = QTabWidget()
        for widget, name in zip(
            (self.preview, self.export_panel, self.config_editor, self.bench_panel),
            TABS,
            strict=True,
        ):
            self.tabs.addTab(widget, name)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addWidget(self.model_panel)
        left_layout.addWidget(self.target_panel)
        left_layout.addWidget(self.export_shortcut)
        left_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(420)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 6, 6, 0)
        right_layout.addWidget(self.banner)
        right_layout.addWidget(self.tabs, 1)
        split = QSplitter()
        split.addWidget(scroll)
        split.addWidget(right)
        split.setSizes([430, 1010])
        split.setStretchFactor(1, 1)
        self.setCentralWidget(split)
        self._menus()

        self.state.previewChanged.connect(self.preview.show_preview)
        self.previewer.computed.connect(
            lambda ms: self.statusBar().showMessage(f"Preview planned in {ms:.1f} ms", 4000)
        )
        self.export_shortcut.clicked.connect(self._export_from_left)
        self.export_panel.benchmarkRequested.connect(self.show_bench)
        self.export_panel.editConfigRequested.connect(self.edit_config)
        self.exporter.succeeded.connect(lambda _: self.settings.add_recent(self.state.source))
        if not self.settings.restore_geometry(self):
            self.resize(1440, 900)
        self.previewer.request()
        self.warmed_up = False
        QTimer.singleShot(300, self, lambda: start_warm_up(self, self._warmed_up))

    def _warmed_up(self) -> None:
        self.warmed_up = True

    def _menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        for text, slot, shortcut in (
            ("Open model folder…", self.model_panel.browse_folder, QKeySequence.StandardKey.Open),
            ("Open genai_config.json…", self.config_editor.choose_file, None),
            ("Scan Hugging Face cache", self.model_panel.scan_cache, None),
            ("Quit", self.close, QKeySequence.StandardKey.Quit),
        ):
            action = QAction(text, self)
            action.triggered.connect(slot)
            if shortcut is not None:
                action.setShortcut(shortcut)
            file_menu.addAction(action)

    def _export_from_left(self) -> None:
        self.tabs.setCurrentWidget(self.export_panel)
        self.export_panel.export_button.click()

    def show_bench(self, package: str) -> None:
        self.bench_panel.set_package(package)
        self.tabs.setCurrentWidget(self.bench_panel)

    def edit_config(self, package: str) -> None:
        if self.config_editor.open(str(Path(package) / "genai_config.json")):
            self.tabs.setCurrentWidget(self.config_editor)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Cancel running work (exports leave nothing behind) and remember the session."""
        self.exporter.cancel()
        for worker in (self.bench_panel.worker, self.export_panel.verify_worker):
            if worker is not None:
                worker.cancel()
        QThreadPool.globalInstance().waitForDone(10_000)
        self.settings.save_state(self.state)
        self.settings.save_geometry(self)
        self.settings.sync()
        super().closeEvent(event)
