"""The main window: model and target on the left; preview, export, config, benchmark and
inspector tabs on the right.

It only lays out and wires: state is in :class:`StudioState`, work in the controllers'
workers, and every error shows in the one banner above the tabs. Menus carry every action
with its shortcut; a model or package folder can be dropped on the window.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from PySide6.QtCore import QEvent, QThreadPool, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QKeySequence,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QMainWindow,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app import APP_NAME, dialogs
from app.bench_controller import BenchController
from app.controllers import ExportController, PreviewController
from app.history import BenchHistory
from app.settings import AppSettings
from app.source import ModelSource
from app.state import StudioState
from app.warmup import start_warm_up
from app.widgets.bench_panel import BenchPanel
from app.widgets.config_editor import ConfigEditor
from app.widgets.error_banner import ErrorBanner
from app.widgets.export_panel import ExportPanel
from app.widgets.inspector_panel import InspectorPanel
from app.widgets.messages import MessageLabel
from app.widgets.model_panel import ModelPanel
from app.widgets.preview_panel import PreviewPanel
from app.widgets.tabs import roomy_tabs
from app.widgets.target_panel import TargetPanel
from app.windows.shortcuts import WindowShortcuts

TABS = ("Preview", "Export", "genai_config", "Benchmark", "Inspector")
DEFAULT_SIZE = (1440, 900)
LEFT_WIDTH = (300, 430)
"""The left panel's least and preferred widths."""


def folder_kind(folder: Path) -> str:
    """What a dropped folder is: "model" (config.json), "package" (genai_config.json or
    .onnx files), or "" (neither)."""
    if (folder / "genai_config.json").is_file() or any(folder.glob("*.onnx")):
        return "package"
    if (folder / "config.json").is_file():
        return "model"
    return ""


class MainWindow(QMainWindow):
    """Export Studio's one window."""

    firstPainted = Signal()
    """The window is on screen (its first paint); the first preview starts then."""

    def __init__(
        self, settings: AppSettings | None = None, source: ModelSource | None = None
    ) -> None:
        """``source`` (e.g. from ``--preset``) replaces the last session's model."""
        super().__init__()
        self.setWindowTitle(APP_NAME)
        self.setAcceptDrops(True)
        self.settings = settings or AppSettings()
        self.state = StudioState(self)
        self.settings.restore_state(self.state)
        if source is not None:
            self.state.set_source(source)
        self.previewer = PreviewController(self.state)
        self.exporter = ExportController(self.state)
        self.exporter.confirm_replace = self._confirm_replace
        self.bencher = BenchController(self.state, BenchHistory(self.settings.data_dir()))

        self.model_panel = ModelPanel(self.state, self.settings.recent_sources())
        self.target_panel = TargetPanel(self.state)
        self.export_shortcut = QPushButton("Export…")
        font = self.export_shortcut.font()
        font.setBold(True)
        self.export_shortcut.setFont(font)
        self.export_reason = MessageLabel()
        self.banner = ErrorBanner(self.state)
        self.preview = PreviewPanel()
        self.export_panel = ExportPanel(self.state, self.exporter)
        self.config_editor = ConfigEditor(self.state)
        self.bench_panel = BenchPanel(self.state, self.bencher)
        self.inspector = InspectorPanel(self.state)
        self.tabs = roomy_tabs()
        pages = (self.preview, self.export_panel, self.config_editor, self.bench_panel)
        for widget, name in zip((*pages, self.inspector), TABS, strict=True):
            self.tabs.addTab(widget, name)
        for i in range(self.tabs.count()):
            self.tabs.setTabToolTip(i, f"{TABS[i]} (Ctrl+{i + 1})")

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addWidget(self.model_panel)
        left_layout.addWidget(self.target_panel)
        left_layout.addStretch(1)
        self.left_scroll = QScrollArea()
        self.left_scroll.setWidget(left)
        self.left_scroll.setWidgetResizable(True)
        self._fit_left_column()
        # Export stays in sight under the form, whatever its length (the form scrolls).
        left_column = QWidget()
        column_layout = QVBoxLayout(left_column)
        column_layout.setContentsMargins(0, 0, 0, 0)
        column_layout.addWidget(self.left_scroll, 1)
        footer = QVBoxLayout()
        footer.setContentsMargins(9, 4, 9, 6)
        footer.addWidget(self.export_shortcut)
        footer.addWidget(self.export_reason)
        column_layout.addLayout(footer)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 6, 6, 0)
        right_layout.addWidget(self.banner)
        right_layout.addWidget(self.tabs, 1)
        self.split = QSplitter()
        self.split.addWidget(left_column)
        self.split.addWidget(right)
        self.split.setStretchFactor(1, 1)
        self.split.setChildrenCollapsible(False)
        self._columns_moved = False
        self.split.splitterMoved.connect(lambda *_: setattr(self, "_columns_moved", True))
        self.setCentralWidget(self.split)
        self._menus()
        # the advanced quantization rows are wider than the form: widen the column to them
        self.target_panel.advanced_button.toggled.connect(
            lambda *_: QTimer.singleShot(0, self, self._refit_left_column)
        )

        self.state.previewChanged.connect(self.preview.show_preview)
        self.state.previewChanged.connect(self._forget_planned_status)
        self.previewer.computed.connect(
            lambda ms: self.statusBar().showMessage(f"Preview planned in {ms:.1f} ms", 4000)
        )
        self.export_shortcut.clicked.connect(self.export)
        for signal in (
            self.state.sourceChanged,
            self.state.optionsChanged,
            self.state.outputChanged,
            self.state.overwriteChanged,
            self.state.previewChanged,
            self.state.sourceProblemChanged,
            self.state.formProblemChanged,
            self.exporter.finished,
            self.exporter.started,
        ):
            signal.connect(self._mirror_export_button)
        self.export_panel.benchmarkRequested.connect(self.show_bench)
        self.export_panel.editConfigRequested.connect(self.edit_config)
        self.export_panel.inspectRequested.connect(self.inspect_package)
        self.inspector.editConfigRequested.connect(self.edit_config)
        self.inspector.benchmarkRequested.connect(self.show_bench)
        self.exporter.succeeded.connect(lambda _: self.settings.add_recent(self.state.source))
        # The model and target form is what the running export was asked for: locked
        # until it ends (done, cancelled or failed), so it cannot drift from the package.
        self.exporter.started.connect(lambda *_: self._lock_form(True))
        self.exporter.finished.connect(lambda: self._lock_form(False))
        self._mirror_export_button()
        if not self.settings.restore_geometry(self):
            self.resize(*DEFAULT_SIZE)
        self.fit_to_screen()
        self.painted = False
        self.warmed_up = False
        # The first preview and the warm-up wait for the first frame: their workers would
        # compete with it for the GIL. A window never painted (a script) still previews.
        QTimer.singleShot(500, self, self._on_first_paint)

    def event(self, event: QEvent) -> bool:
        handled = super().event(event)
        if event.type() == QEvent.Type.Paint and not self.painted:
            QTimer.singleShot(0, self, self._on_first_paint)
        return handled

    def _on_first_paint(self) -> None:
        if self.painted:
            return
        self.painted = True
        # Said before the preview's worker starts: that thread imports the engine (numpy),
        # and on a busy machine it could do so before a later emit reached its listeners.
        self.firstPainted.emit()
        self.previewer.request()
        QTimer.singleShot(300, self, lambda: start_warm_up(self, self._warmed_up))

    def _warmed_up(self) -> None:
        self.warmed_up = True

    # ------------------------------------------------------------------ layout

    def fit_to_screen(self) -> None:
        """Keep the window inside the screen's available area (a restored or default size
        can be larger at 150% scaling or on a small screen); give the left panel its
        preferred width when there is room."""
        screen = self.screen()
        if screen is not None:
            area = screen.availableGeometry()
            self.winId()  # the native window: its frame (title bar, borders) is known now
            frame = self.frameGeometry()
            extra_w, extra_h = frame.width() - self.width(), frame.height() - self.height()
            width = min(self.width(), area.width() - extra_w)
            height = min(self.height(), area.height() - extra_h)
            if (width, height) != (self.width(), self.height()):
                self.resize(width, height)
            if not area.contains(self.frameGeometry()):
                self.move(
                    max(area.left(), min(self.x(), area.right() - width - extra_w)),
                    max(area.top(), min(self.y(), area.bottom() - height - extra_h)),
                )
        self._size_columns()

    def _forget_planned_status(self, preview: object) -> None:
        """The status "Preview planned in ..." was about the last plan, not a failed one."""
        planned = self.statusBar().currentMessage().startswith("Preview planned")
        if preview is None and planned:
            self.statusBar().clearMessage()

    def _fit_left_column(self) -> None:
        """Never narrower than the form plus the vertical scroll bar, whatever is shown
        (the advanced quantization rows are wider): no clipped right edge."""
        form = self.left_scroll.widget()
        assert form is not None
        bar = self.left_scroll.verticalScrollBar().sizeHint().width()
        frame = 2 * self.left_scroll.frameWidth()
        self.left_scroll.setMinimumWidth(
            max(LEFT_WIDTH[0], form.minimumSizeHint().width() + bar + frame)
        )

    def _refit_left_column(self) -> None:
        self._fit_left_column()
        if self.split.sizes()[0] < self.left_scroll.minimumWidth():
            self._size_columns()

    def _size_columns(self) -> None:
        """The left column a third of the window, between its least and preferred widths."""
        left = max(self.left_scroll.minimumWidth(), min(LEFT_WIDTH[1], self.width() // 3))
        self.split.setSizes([left, max(self.width() - left, 1)])

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if not self._columns_moved:  # until the user drags the divider
            self._size_columns()

    def _menus(self) -> None:
        bar = self.menuBar()
        menus = {name: bar.addMenu(f"&{name}") for name in ("File", "Edit", "Run", "View", "Help")}
        self.menu_actions: dict[str, QAction] = {}
        std = QKeySequence.StandardKey
        model, config, panel = self.model_panel, self.config_editor, self.export_panel
        table: list[tuple[str, str, str, Callable[[], object], object]] = [
            ("File", "open_model", "Open &model folder…", model.browse_folder, std.Open),
            (
                "File",
                "open_package",
                "Open &package to inspect…",
                self.choose_package,
                "Ctrl+Shift+O",
            ),
            ("File", "open_config", "Open &genai_config.json…", config.choose_file, None),
            ("File", "scan_cache", "Scan the &Hugging Face cache", model.scan_cache, None),
            ("File", "save_config", "&Save genai_config", config.save, std.Save),
            ("File", "save_log", "Save the export &log…", panel.choose_log_file, "Ctrl+L"),
            ("File", "quit", "&Quit", self.close, std.Quit),
            (
                "Edit",
                "copy_cli",
                "Copy the equivalent &CLI command",
                panel.copy_cli,
                "Ctrl+Shift+C",
            ),
            ("Run", "export", "&Export", self.export, "Ctrl+E"),
            ("Run", "cancel", "&Cancel the export", self.exporter.cancel, "Esc"),
            ("Run", "verify", "&Verify the package", panel.verify, None),
            ("Run", "benchmark", "Run the &benchmark", self.run_benchmark, "Ctrl+R"),
            ("Help", "about", "&About Export Studio", self.show_about, "F1"),
        ]
        table += [
            (
                "View",
                f"tab_{i + 1}",
                f"&{i + 1} {name}",
                partial(self.tabs.setCurrentIndex, i),
                f"Ctrl+{i + 1}",
            )
            for i, name in enumerate(TABS)
        ]
        for menu, key, text, slot, shortcut in table:
            action = QAction(text, self)
            action.triggered.connect(lambda *_, slot=slot: slot())
            if shortcut is not None:
                action.setShortcut(QKeySequence(shortcut))  # type: ignore[call-overload]
            menus[menu].addAction(action)
            self.menu_actions[key] = action
        # Esc cancels an export only while one runs; otherwise it stays with the widgets
        # (closing a cell editor, a popup).
        # Run and view shortcuts work from every field (a line edit takes Ctrl+E on X11).
        self.shortcuts = WindowShortcuts(
            self,
            [
                action
                for key, action in self.menu_actions.items()
                if key in ("export", "benchmark", "copy_cli", "save_log", "about")
                or key.startswith("tab_")
            ],
        )
        cancel = self.menu_actions["cancel"]
        cancel.setEnabled(False)
        self.exporter.started.connect(lambda *_: cancel.setEnabled(True))
        self.exporter.finished.connect(lambda: cancel.setEnabled(False))

    def _mirror_export_button(self, *_: object) -> None:
        """The left Export button is the tab's: same state, same reason."""
        self.export_panel.refresh()
        button = self.export_panel.export_button
        self.export_shortcut.setEnabled(button.isEnabled())
        self.export_shortcut.setToolTip(button.toolTip())
        self.export_reason.say(self.export_panel.blocker.text(), self.export_panel.blocker.level)
        self.export_reason.setVisible(not self.export_panel.blocker.isHidden())

    def _lock_form(self, locked: bool) -> None:
        """Disable the model and target form (and the actions that change the model)."""
        for widget in (self.model_panel, self.target_panel):
            widget.setEnabled(not locked)
        for key in ("open_model", "scan_cache"):
            self.menu_actions[key].setEnabled(not locked)

    # ------------------------------------------------------------------ actions

    def export(self) -> None:
        """Show the Export tab and start an export (when it can run)."""
        self.tabs.setCurrentWidget(self.export_panel)
        if self.export_panel.export_button.isEnabled():
            self.export_panel.export_button.click()

    def run_benchmark(self) -> None:
        """Show the Benchmark tab and run it with its settings."""
        self.tabs.setCurrentWidget(self.bench_panel)
        self.bench_panel.run()

    def _confirm_replace(self, folder: Path) -> bool:
        files = sum(1 for p in folder.rglob("*") if p.is_file())
        return dialogs.confirm(
            self,
            "Replace the existing folder?",
            f"{folder} exists ({files} files). It will be replaced by the new package once "
            "that is complete; until then nothing in it changes.",
            "Replace",
        )

    def show_bench(self, package: str) -> None:
        self.bench_panel.set_package(package)
        self.tabs.setCurrentWidget(self.bench_panel)

    def edit_config(self, package: str) -> None:
        if self.config_editor.open(str(Path(package) / "genai_config.json")):
            self.tabs.setCurrentWidget(self.config_editor)

    def inspect_package(self, folder: str) -> None:
        self.tabs.setCurrentWidget(self.inspector)
        self.inspector.open(folder)

    def choose_package(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        folder = QFileDialog.getExistingDirectory(
            self, "Package folder to inspect", self.state.package_folder_start()
        )
        if folder:
            self.inspect_package(folder)

    def show_about(self) -> None:
        from app.windows.about import AboutDialog

        AboutDialog(self).exec()

    # ------------------------------------------------------------------ drag and drop

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self._dropped_folder(event) is not None:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        folder = self._dropped_folder(event)
        if folder is None:
            event.ignore()
            return
        event.acceptProposedAction()
        if folder_kind(folder) == "package":
            self.inspect_package(str(folder))
        elif self.exporter.running:  # the form is locked: the model stays
            self.statusBar().showMessage("The model cannot change while an export runs.", 4000)
        else:  # a checkpoint, or a folder that is not one: the model panel says which
            self.model_panel.choose_folder(str(folder))
            self.tabs.setCurrentWidget(self.preview)

    @staticmethod
    def _dropped_folder(event: QDragEnterEvent | QDropEvent) -> Path | None:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        local = [Path(u.toLocalFile()) for u in urls if u.isLocalFile()]
        folders = [p if p.is_dir() else p.parent for p in local]
        return folders[0] if len(folders) == 1 else None

    # ------------------------------------------------------------------ closing

    def closeEvent(self, event: QCloseEvent) -> None:
        """Ask about unsaved genai_config edits, cancel running work (exports leave
        nothing behind) and remember the session."""
        if not self.config_editor.maybe_keep_edits():
            event.ignore()
            return
        self.exporter.cancel()
        self.bencher.cancel()
        if self.export_panel.verify_worker is not None:
            self.export_panel.verify_worker.cancel()
        QThreadPool.globalInstance().waitForDone(10_000)
        self.settings.save_state(self.state)
        self.settings.save_geometry(self)
        self.settings.sync()
        super().closeEvent(event)
