"""The export pipeline: model -> plan -> graph -> rewrites -> package, as one plain function.

``export`` takes ``progress(fraction, message)`` and a :class:`CancelToken`; the CLI drives
it with a progress bar and the app from a worker thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from engine import sensitivity
from engine.activation_scaling import ScaledSource
from engine.audit import SessionAudit, audit_model, decide_capture
from engine.errors import OptionsError, option, render_message
from engine.genai_config import make_genai_config, processor_files
from engine.genai_doc import GenaiDoc
from engine.models import (
    Session,
    build_session,
    family_for,
    load_spec,
    model_summary,
    plan_sessions,
)
from engine.options import ExportOptions
from engine.package import (
    MANIFEST,
    copy_tokenizer,
    folder_files,
    staging_folder,
    write_json,
)
from engine.plan import ExportPlan, plan
from engine.preflight import check_buffer_limit, check_resources, preflight
from engine.presets import load_preset
from engine.processors import read_processing
from engine.progress import CancelToken, Progress, no_progress
from engine.rewrites import apply_rewrites
from engine.spec import ModelSpec
from engine.tokenizer_files import check_tokenizer_files
from engine.units import format_bytes
from engine.weights import stream_writer
from engine.weights.factory import TensorFactory
from engine.weights.sources import CheckpointSource, RandomSource, WeightSource

if TYPE_CHECKING:
    from engine.calibration import Calibration

DATA_FILE_SUFFIX = ".data"


@dataclass(frozen=True)
class ExportResult:
    """What an export produced."""

    output: Path
    plan: ExportPlan
    files: dict[str, int]
    seconds: float
    capture: dict[str, bool]
    """Graph capture per session, as genai_config sets it."""
    share_buffer: bool
    tokenizer_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def graph_capture(self) -> bool:
        """Graph capture of the decoder (the session it matters for)."""
        return self.capture.get("decoder", False)

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def __repr__(self) -> str:
        """A line, not the whole plan (``result.plan`` has it)."""
        capture = ", ".join(f"{s} {'on' if on else 'off'}" for s, on in self.capture.items())
        return (
            f"ExportResult(output={str(self.output)!r}, {len(self.files)} files, "
            f"{format_bytes(self.total_bytes)}, {self.seconds:.2f} s, ep={self.plan.caps.name!r}, "
            f"graph capture: {capture or 'none'})"
        )


def load_model_spec(model_dir: str | os.PathLike[str] | None, preset: str | None) -> ModelSpec:
    """The spec of a checkpoint folder or a built-in preset (exactly one of them)."""
    if model_dir is None and preset is None:
        raise OptionsError(
            f"give a model folder ({option('model')}) or a preset ({option('preset')})"
        )
    if model_dir is not None and preset is not None:
        raise OptionsError(
            f"give a model folder ({option('model')}) or a preset ({option('preset')}), not both"
        )
    return load_spec(model_dir) if model_dir is not None else load_preset(str(preset))


def export(
    output: str | os.PathLike[str],
    *,
    model_dir: str | os.PathLike[str] | None = None,
    preset: str | None = None,
    options: ExportOptions | None = None,
    overwrite: bool = False,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> ExportResult:
    """Export a model (a checkpoint folder or a preset) to an onnxruntime-genai package folder.

    Args:
        output: The package folder to create.
        model_dir: A Hugging Face checkpoint folder (config.json + safetensors).
        preset: A built-in architecture preset instead of a folder (needs random weights).
        options: Export options; EP defaults fill what is left unset.
        overwrite: Replace ``output`` if it exists (only once the new package is complete).
        progress: Receives (fraction, stage message).
        cancel: Checked between tensors; a cancel leaves nothing behind.

    Raises:
        EngineError: With a message that says what to change.
    """
    started = time.perf_counter()
    cancel = cancel or CancelToken()
    options = options or ExportOptions()
    progress(0.0, "reading the model config")
    spec = load_model_spec(model_dir, preset)
    if model_dir is None and not options.random_weights:
        raise OptionsError(
            f"preset '{preset}' has no weights; "
            f"pass {option('random_weights')} for an architecture-only package"
        )
    export_plan = plan(spec, options)
    source_dir = Path(model_dir) if model_dir is not None else None
    towers = {s.name for s in export_plan.sessions}
    image, audio = read_processing(source_dir, image="vision" in towers, audio="speech" in towers)
    processors = processor_files(export_plan, image, audio)
    tokenizer_notes = (
        check_tokenizer_files(source_dir, spec.vocab_size) if source_dir is not None else ()
    )
    ready = preflight(export_plan, output, overwrite=overwrite, model_dir=model_dir)
    out = ready.output
    source: WeightSource
    if options.random_weights:
        source = RandomSource(options.seed)
    else:
        progress(0.01, "checking the checkpoint's tensors")
        family = family_for(spec.source_model_type)
        checkpoint = CheckpointSource(
            Path(str(model_dir)),
            (wp.weight for s in export_plan.sessions for wp in s.weights if not wp.shares),
            lambda key: family.ignorable(spec, export_plan.options, key),
        )
        checkpoint.validate()
        source = checkpoint
    cancel.raise_if_cancelled()

    precision_note = None
    if sensitivity.wanted(export_plan.options):
        export_plan, precision_note = sensitivity.apply(
            model_dir, spec, export_plan, lambda f, m: progress(0.01 + 0.01 * f, m), cancel
        )
        check_buffer_limit(export_plan)  # the INT8 weights are larger: checked again
        check_resources(export_plan, out)
    calibration = None
    if options.calibrated:
        calibration = _calibrate(model_dir, export_plan, progress, cancel)
        if calibration.scaling:
            source = ScaledSource(source, calibration.scaling)
    try:
        progress(0.03, "building the graphs")
        feedback = calibration.feedback if calibration is not None else None
        factory = TensorFactory(export_plan, source, cancel, feedback=feedback)
        built = [_build(export_plan, session, factory) for session in plan_sessions(export_plan)]
        notes: list[str] = [*ready.notes, *tokenizer_notes]
        for session in built:
            notes += [
                f"{session.name}: {family}: {count} rewrites"
                for family, count in session.rewrites.items()
                if count
            ]
            if export_plan.caps.graph_capture and not session.capture:
                notes += [f"{session.name}: graph capture off: {r}" for r in session.reasons[:5]]
        capture = {session.name: session.capture for session in built}
        share_buffer = export_plan.uses_gqa
        cancel.raise_if_cancelled()

        total = max(export_plan.nbytes, 1)
        written = 0

        def on_written(tensor: ir.TensorProtocol, nbytes: int) -> None:
            nonlocal written
            written += nbytes
            progress(0.05 + 0.9 * min(written / total, 1.0), f"writing {tensor.name}")
            cancel.raise_if_cancelled()

        last: set[str] = set()
        # One core is left to the rest of the machine (the app's UI thread starved on 2).
        writers = max(1, min(4, (os.cpu_count() or 1) - 1))
        if calibration is not None:  # a pass measured while writing says so, in place
            calibration.writers(writers)
            calibration.report(lambda message: progress(0.05 + 0.9 * written / total, message))
            # by the plan's names of the weights whose float-model name calibration gave
            tied = calibration.written_last()
            last = {
                wp.name
                for wp in export_plan.decoder.weights
                if (wp.weight.parts or (wp.weight,))[0].name in tied
            }

        with staging_folder(out, overwrite) as staging:
            for session in built:
                filename = export_plan.session(session.name).filename
                # Streamed chunk by chunk: no initializer is ever whole in memory.
                stream_writer.save(
                    session.model,
                    staging / filename,
                    filename + DATA_FILE_SUFFIX,
                    on_written=on_written,
                    max_workers=writers,
                    last=last,
                )
                cancel.raise_if_cancelled()
            progress(0.96, "writing genai_config.json")
            write_json(
                staging / "genai_config.json",
                make_genai_config(export_plan, capture=capture, share_buffer=share_buffer),
            )
            for name, data in processors.items():
                write_json(staging / name, data)
            notes += [
                f"genai_config lint: {lint.message}" for lint in GenaiDoc.load(staging).lint()
            ]
            if precision_note is not None:
                notes.append(precision_note)
            if calibration is not None:
                from engine.calibration import describe

                if feedback:
                    inputs = list(factory.gptq_inputs.values())
                    notes.append(describe(factory.gptq_applied, inputs, factory.gptq_fallbacks))
                notes.extend(calibration.notes())
            tokenizer = copy_tokenizer(source_dir, staging)
            audits = {session.name: session.audit for session in built}
            package_files = [*folder_files(staging), MANIFEST]
            write_json(
                staging / MANIFEST,
                _manifest(export_plan, audits, capture, share_buffer, package_files),
            )
            files = folder_files(staging)
    finally:
        if calibration is not None:
            calibration.close()  # the float model a streamed feedback measured with
    progress(1.0, "done")
    return ExportResult(
        output=out,
        plan=export_plan,
        files=files,
        seconds=time.perf_counter() - started,
        capture=capture,
        share_buffer=share_buffer,
        tokenizer_files=tuple(tokenizer),
        notes=tuple(notes),
    )


@dataclass
class _BuiltSession:
    name: str
    model: ir.Model
    rewrites: dict[str, int]
    audit: SessionAudit
    capture: bool
    reasons: list[str]


def _build(export_plan: ExportPlan, session: Session, factory: TensorFactory) -> _BuiltSession:
    """One session's graph, rewritten for the EP, audited, and its capture decided."""
    model = build_session(export_plan, session.name, factory)
    rewrites = apply_rewrites(model, export_plan.caps)
    audit = audit_model(model, export_plan.caps, session.name)
    capture, reasons = decide_capture(
        audit,
        export_plan.uses_gqa,
        export_plan.options.graph_capture,
        never=session.never_captured,
    )
    return _BuiltSession(session.name, model, rewrites, audit, capture, reasons)


def _manifest(
    export_plan: ExportPlan,
    audits: dict[str, SessionAudit],
    capture: dict[str, bool],
    share_buffer: bool,
    files: list[str],
) -> dict[str, Any]:
    """What was exported and how; ``files`` (every file of the package, this one included)
    tells an overwrite what it may delete."""
    from dataclasses import asdict

    from engine import __version__
    from engine.graph.attention import static_kinds

    return {
        "producer": "export-studio",
        "version": __version__,
        "model": model_summary(export_plan.spec),
        "options": asdict(export_plan.options),
        "graph_capture": capture,
        # sessions no mode captures, and why (``audit`` on the package reads it)
        "never_captured": {
            s.name: s.never_captured for s in plan_sessions(export_plan) if s.never_captured
        },
        "audit": {name: audit.to_json() for name, audit in audits.items()},
        "past_present_share_buffer": share_buffer,
        # attention kinds that write K / V into the shared buffers by position
        "static_kv_kinds": sorted(static_kinds(export_plan.spec, export_plan.options)),
        "files": sorted(files),
        "plan": {
            "total_bytes": export_plan.nbytes,
            "context_length": export_plan.context_length,
            "warnings": [render_message(w) for w in export_plan.warnings],
        },
    }


def _calibrate(
    model_dir: str | os.PathLike[str] | None,
    export_plan: ExportPlan,
    progress: Progress,
    cancel: CancelToken,
) -> Calibration:
    """GPTQ's statistics and AWQ's scales from the checkpoint's float model on calibration
    text."""
    from engine.calibration import calibrate, prepare

    method = export_plan.options.quant_method
    if model_dir is None or export_plan.options.random_weights:
        raise OptionsError(
            f"{option('quant_method', method)} calibrates on the checkpoint's own weights; "
            f"random weights have none: use {option('quant_method', 'rtn')}"
        )
    ids = prepare(Path(model_dir), export_plan)
    progress(0.02, f"calibrating ({method.upper()})")
    return calibrate(
        Path(model_dir),
        ids,
        export_plan,
        progress=lambda f, m: progress(0.02 + 0.01 * f, m),
        cancel=cancel,
    )
