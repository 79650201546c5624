"""The app's observable state: what the user chose, and the latest preview and package.

Windows and panels read it and call its setters; it emits a signal per change. It never
runs long work (controllers start workers for that) and holds no widgets.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from app.choices import (
    Constraints,
    default_output,
    ep_constraints,
    fit_options,
    source_constraints,
)
from app.source import DEFAULT_PRESET, ModelSource
from app.wording import CONTROLS, error_text
from engine.caps import get_caps
from engine.options import ExportOptions

if TYPE_CHECKING:
    from engine.sensitivity import Tradeoff

__all__ = ["DEFAULT_PRESET", "ModelSource", "StudioState"]


def options_to_json(options: ExportOptions) -> str:
    return json.dumps(asdict(options))


def options_from_json(text: str) -> ExportOptions | None:
    """Options saved by an earlier run; unknown or stale fields are dropped."""
    try:
        data = json.loads(text)
        known = {f.name for f in fields(ExportOptions)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("modalities"), list):  # JSON has no tuples
            values["modalities"] = tuple(values["modalities"])
        return ExportOptions(**values)
    except (ValueError, TypeError, AttributeError):
        return None


class StudioState(QObject):
    """The chosen model, options and output; the latest preview, package and error; and
    what cannot be chosen now (:class:`app.choices.Constraints`) with what was adjusted."""

    sourceChanged = Signal(object)
    optionsChanged = Signal(object)
    outputChanged = Signal(str)
    overwriteChanged = Signal(bool)
    previewChanged = Signal(object)
    packageChanged = Signal(str)
    constraintsChanged = Signal(object)
    adjusted = Signal(str)
    """Why the options were moved onto allowed values (empty: nothing to explain)."""
    sourceProblemChanged = Signal(str)
    """Why the chosen model cannot be exported (empty: no known problem)."""
    formProblemChanged = Signal(str)
    """Which field of the form holds a value that is not applied (empty: none)."""
    errorChanged = Signal(str, str)
    """(where, message); an empty message means the error of ``where`` was cleared."""
    tradeoffsChanged = Signal()
    """A size-against-quality measurement was added (:meth:`tradeoff_for` finds it)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.source = ModelSource("preset", DEFAULT_PRESET)
        self.options = ExportOptions()
        self.output = ""
        self.output_auto = True
        """The output folder follows the model and options until the user sets one."""
        self.overwrite = False
        self.preview: Any = None
        self.package = ""
        self.error: tuple[str, str] = ("", "")
        self.source_problem = ""
        self.plan_problem = ""
        """Why the current options cannot be planned (empty: they can, or not known yet)."""
        self.form_problem = ""
        """A field whose text cannot be read (a custom buffer limit of "lots"): the options
        keep their last good value, so the preview would not show what the field does."""
        self.adjustment = ""
        self._tradeoffs: dict[tuple[ModelSource, ExportOptions], Tradeoff] = {}
        """Measurements (“Compare sizes and quality…”) by source and options, their size
        budget and target KLD set aside: one measurement serves every budget."""
        self._ep_constraints = ep_constraints(get_caps(self.options.ep))
        self._model_constraints = Constraints()
        self._source_constraints = source_constraints(self.source.is_preset)
        self.constraints = self._ep_constraints.merged(self._source_constraints)
        self._follow_output()

    def set_source(self, source: ModelSource) -> None:
        if source != self.source:
            self.source = source
            self._model_constraints = Constraints()
            self._source_constraints = source_constraints(source.is_preset)
            self._set_constraints()
            fitted, notes = fit_options(self.options, self.constraints)
            if notes:  # GPTQ chosen for a folder, then a preset: back to round to nearest
                self._apply(fitted, notes)
            self.set_source_problem(source_problem(source))
            self.sourceChanged.emit(source)
            self._follow_output()

    def set_source_problem(self, problem: str) -> None:
        if problem != self.source_problem:
            self.source_problem = problem
            self.sourceProblemChanged.emit(problem)

    def set_options(self, options: ExportOptions) -> None:
        """Set the options, moved onto allowed values (the reason goes to ``adjusted``)."""
        if options.ep != self.options.ep:
            self._ep_constraints = ep_constraints(get_caps(options.ep))
            self._set_constraints()
        fitted, notes = fit_options(options, self.constraints)
        self._apply(fitted, notes)

    def update_options(self, **changes: Any) -> None:
        """Change some option fields, e.g. ``update_options(ep="webgpu")``."""
        self.set_options(replace(self.options, **changes))

    def set_model_constraints(self, constraints: Constraints) -> None:
        """What the model's dimensions rule out (from the preview worker)."""
        self._model_constraints = constraints
        self._set_constraints()
        fitted, notes = fit_options(self.options, self.constraints)
        if notes:
            self._apply(fitted, notes)

    def _set_constraints(self) -> None:
        constraints = self._ep_constraints.merged(self._model_constraints).merged(
            self._source_constraints
        )
        if constraints != self.constraints:
            self.constraints = constraints
            self.constraintsChanged.emit(constraints)

    def _apply(self, options: ExportOptions, notes: list[str]) -> None:
        """Take ``options``; say why they differ from what was asked, or clear the last
        explanation when a change needed none."""
        adjustment = "; ".join(notes) + "." if notes else ""
        if (options != self.options or adjustment) and adjustment != self.adjustment:
            self.adjustment = adjustment
            self.adjusted.emit(adjustment)
        if options != self.options:
            self.options = options
            self.optionsChanged.emit(options)
            self._follow_output()

    def set_output(self, output: str, auto: bool = False) -> None:
        """Set the output folder; one the user chose (``auto`` False) stops it following
        the model and options, an empty one makes it follow again."""
        self.output_auto = auto or not output.strip()
        if self.output_auto and not auto:
            self._follow_output()
            return
        if output != self.output:
            self.output = output
            self.outputChanged.emit(output)

    def _follow_output(self) -> None:
        if self.output_auto:
            self.set_output(default_output(self.source, self.options), auto=True)

    def set_overwrite(self, overwrite: bool) -> None:
        if overwrite != self.overwrite:
            self.overwrite = overwrite
            self.overwriteChanged.emit(overwrite)

    def set_form_problem(self, problem: str) -> None:
        if problem != self.form_problem:
            self.form_problem = problem
            self.formProblemChanged.emit(problem)

    def set_preview(self, preview: Any, plan_problem: str = "") -> None:
        """The latest preview, or None with why the options cannot be planned."""
        self.preview = preview
        self.plan_problem = plan_problem if preview is None else ""
        self.previewChanged.emit(preview)

    def set_package(self, folder: str) -> None:
        self.package = folder
        self.packageChanged.emit(folder)

    def set_tradeoff(self, source: ModelSource, options: ExportOptions, tradeoff: Tradeoff) -> None:
        """Keep a measurement of ``source`` under ``options`` for the rest of the session."""
        self._tradeoffs[_measured_as(source, options)] = tradeoff
        self.tradeoffsChanged.emit()

    def tradeoff_for(self, source: ModelSource, options: ExportOptions) -> Tradeoff | None:
        """The measurement of ``source`` under ``options`` (any size budget or target KLD),
        or None when there is none in this session."""
        return self._tradeoffs.get(_measured_as(source, options))

    def export_options(self) -> ExportOptions:
        """The options an export uses: presets have no weights, so they get random ones."""
        if self.source.is_preset and not self.options.random_weights:
            return replace(self.options, random_weights=True)
        return self.options

    def export_blocker(self) -> str:
        """Why Export cannot run now, in a sentence (empty when it can)."""
        if self.source_problem:
            return f"the model cannot be exported: {self.source_problem}"
        if self.form_problem:
            return self.form_problem
        if self.plan_problem:
            return f"the current options cannot be planned: {self.plan_problem}"
        if not self.output.strip():
            return "choose an output folder"
        from engine.package import occupied, resolve_output

        output = Path(self.output).expanduser()
        if output.exists() and not output.is_dir():
            return f"{output} is a file, not a folder"
        if not output.exists():
            return ""
        if occupied(resolve_output(output)) and not self.overwrite:
            return (
                f"{output} exists: tick “{CONTROLS['overwrite'].name}” to export over it, "
                "or choose another folder"
            )
        # What the engine will refuse anyway (not our package, a file the user put in it,
        # the input folder), said before the click, in the engine's own check.
        from engine.errors import PackageError
        from engine.package import check_destination

        protect = [] if self.source.is_preset else [self.source.value]
        try:
            check_destination(output, overwrite=True, protect=protect)
        except PackageError as exc:
            return error_text(exc).rstrip(".")
        return ""

    def package_folder_start(self) -> str:
        """Where a dialog choosing a package starts: beside the last export (its parent
        folder), else beside the output folder, else the home folder."""
        for folder in (self.package, self.output):
            if folder.strip():
                parent = Path(folder).expanduser().parent
                if parent.is_dir():
                    return str(parent)
        return str(Path.home())

    def export_note(self) -> tuple[str, str]:
        """What stands beside Export, and its status colour: why it cannot run
        ("warning"), or, when the output is the package just written, that it was written
        and how to export there again ("ready"); empty when Export can run."""
        blocker = self.export_blocker()
        if not blocker:
            return "", "ready"
        output = Path(self.output).expanduser()
        written = (
            bool(self.package)
            and output == Path(self.package).expanduser()
            and output.is_dir()
            and not (self.source_problem or self.plan_problem or self.overwrite)
        )
        if written:
            return (
                f"Exported to {output}. To export there again, tick "
                f"“{CONTROLS['overwrite'].name}”, or choose another folder.",
                "ready",
            )
        return f"Export is unavailable: {blocker}.", "warning"

    def report_error(self, where: str, message: str) -> None:
        """Show an error in the window's one error area (replacing any earlier one)."""
        self.error = (where, message)
        self.errorChanged.emit(where, message)

    def clear_error(self, where: str) -> None:
        """Clear the shown error if it came from ``where``."""
        if self.error[0] == where and self.error[1]:
            self.error = ("", "")
            self.errorChanged.emit(where, "")


def _measured_as(source: ModelSource, options: ExportOptions) -> tuple[ModelSource, ExportOptions]:
    """What a measurement depends on: the budget and target only pick from it."""
    return source, replace(options, size_budget=None, target_kld=None)


def source_problem(source: ModelSource) -> str:
    """What is visibly wrong with a model source without reading it (a stat or two)."""
    if source.is_preset:
        return ""
    folder = Path(source.value).expanduser()
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not (folder / "config.json").is_file():
        return f"{folder} has no config.json (not a Hugging Face checkpoint folder)"
    return ""
