"""Persistent settings (QSettings): recent models, last options and output, geometry.

Tests and the self-test pass their own :class:`QSettings` (an INI file in a temp folder)
so they never touch the user's settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, QStandardPaths

from app import APP_NAME, ORG_NAME
from app.state import ModelSource, StudioState, options_from_json, options_to_json
from engine.options import ExportOptions

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget  # the headless path reads settings without it

MAX_RECENT = 8


class AppSettings:
    """Typed access to the app's QSettings."""

    def __init__(self, qsettings: QSettings | None = None) -> None:
        self.qsettings = qsettings or QSettings(ORG_NAME, APP_NAME)

    def _text(self, key: str, default: str = "") -> str:
        value = self.qsettings.value(key, default)
        return value if isinstance(value, str) else default

    def recent_sources(self) -> list[ModelSource]:
        raw = self.qsettings.value("models/recent", [])
        items = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, list) else []
        sources = [ModelSource.from_json(str(item)) for item in items]
        return [s for s in sources if s is not None]

    def add_recent(self, source: ModelSource) -> None:
        sources = [source] + [s for s in self.recent_sources() if s != source]
        self.qsettings.setValue("models/recent", [s.to_json() for s in sources[:MAX_RECENT]])

    def last_source(self) -> ModelSource | None:
        return ModelSource.from_json(self._text("models/last"))

    def last_options(self) -> ExportOptions | None:
        return options_from_json(self._text("export/options"))

    def save_state(self, state: StudioState) -> None:
        """Remember the choices of the session (source, options, output)."""
        self.qsettings.setValue("models/last", state.source.to_json())
        self.qsettings.setValue("export/options", options_to_json(state.options))
        self.qsettings.setValue("export/output", "" if state.output_auto else state.output)
        # "Replace an existing folder" is deliberately not remembered: each launch starts
        # with it off, so no export replaces a folder because of an earlier session.
        self.qsettings.remove("export/overwrite")

    def restore_state(self, state: StudioState) -> None:
        """Put the last session's choices back into ``state``."""
        source = self.last_source()
        if source is not None and (source.is_preset or Path(source.value).is_dir()):
            state.set_source(source)
        options = self.last_options()
        if options is not None:
            state.set_options(options)
        state.set_output(self._text("export/output"))  # empty: it follows the model

    def save_geometry(self, window: QWidget) -> None:
        self.qsettings.setValue("window/geometry", window.saveGeometry())

    def restore_geometry(self, window: QWidget) -> bool:
        value = self.qsettings.value("window/geometry")
        return isinstance(value, QByteArray) and window.restoreGeometry(value)

    def data_dir(self) -> Path:
        """Where the app keeps data files (the benchmark history): beside an INI settings
        file, else the platform's app-data folder."""
        if self.qsettings.format() == QSettings.Format.IniFormat:
            folder = Path(self.qsettings.fileName()).parent
        else:
            location = QStandardPaths.StandardLocation.AppDataLocation
            folder = Path(
                QStandardPaths.writableLocation(location) or Path.home() / ".export-studio"
            )
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def sync(self) -> None:
        self.qsettings.sync()
