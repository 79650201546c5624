"""The app's observable state: what the user chose, and the latest preview and package.

Windows and panels read it and call its setters; it emits a signal per change. It never
runs long work (controllers start workers for that) and holds no widgets.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import QObject, Signal

from engine.options import ExportOptions

SourceKind = Literal["preset", "folder", "cache"]
DEFAULT_PRESET = "gemma4-tiny"


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: a built-in preset, a checkpoint folder, or a folder in
    the Hugging Face cache."""

    kind: SourceKind
    value: str
    """The preset name, or the folder path."""
    label: str = ""

    @property
    def is_preset(self) -> bool:
        return self.kind == "preset"

    @property
    def display(self) -> str:
        if self.label:
            return self.label
        return f"preset {self.value}" if self.is_preset else Path(self.value).name

    def export_args(self) -> dict[str, str]:
        """``model_dir=`` or ``preset=`` for :func:`engine.pipeline.export`."""
        return {"preset": self.value} if self.is_preset else {"model_dir": self.value}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelSource | None:
        try:
            data = json.loads(text)
            if data.get("kind") in ("preset", "folder", "cache"):
                return cls(data["kind"], str(data["value"]), str(data.get("label", "")))
        except (ValueError, TypeError, AttributeError, KeyError):
            pass
        return None


def options_to_json(options: ExportOptions) -> str:
    return json.dumps(asdict(options))


def options_from_json(text: str) -> ExportOptions | None:
    """Options saved by an earlier run; unknown or stale fields are dropped."""
    try:
        data = json.loads(text)
        known = {f.name for f in fields(ExportOptions)}
        return ExportOptions(**{k: v for k, v in data.items() if k in known})
    except (ValueError, TypeError, AttributeError):
        return None


class StudioState(QObject):
    """The chosen model, options and output, and the latest preview, package and error."""

    sourceChanged = Signal(object)
    optionsChanged = Signal(object)
    outputChanged = Signal(str)
    previewChanged = Signal(object)
    packageChanged = Signal(str)
    errorChanged = Signal(str, str)
    """(where, message); an empty message means the error of ``where`` was cleared."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.source = ModelSource("preset", DEFAULT_PRESET)
        self.options = ExportOptions()
        self.output = ""
        self.overwrite = False
        self.preview: Any = None
        self.package = ""
        self.error: tuple[str, str] = ("", "")

    def set_source(self, source: ModelSource) -> None:
        if source != self.source:
            self.source = source
            self.sourceChanged.emit(source)

    def set_options(self, options: ExportOptions) -> None:
        if options != self.options:
            self.options = options
            self.optionsChanged.emit(options)

    def update_options(self, **changes: Any) -> None:
        """Change some option fields, e.g. ``update_options(ep="webgpu")``."""
        self.set_options(replace(self.options, **changes))

    def set_output(self, output: str) -> None:
        if output != self.output:
            self.output = output
            self.outputChanged.emit(output)

    def set_preview(self, preview: Any) -> None:
        self.preview = preview
        self.previewChanged.emit(preview)

    def set_package(self, folder: str) -> None:
        self.package = folder
        self.packageChanged.emit(folder)

    def export_options(self) -> ExportOptions:
        """The options an export uses: presets have no weights, so they get random ones."""
        if self.source.is_preset and not self.options.random_weights:
            return replace(self.options, random_weights=True)
        return self.options

    def report_error(self, where: str, message: str) -> None:
        """Show an error in the window's one error area (replacing any earlier one)."""
        self.error = (where, message)
        self.errorChanged.emit(where, message)

    def clear_error(self, where: str) -> None:
        """Clear the shown error if it came from ``where``."""
        if self.error[0] == where and self.error[1]:
            self.error = ("", "")
            self.errorChanged.emit(where, "")
