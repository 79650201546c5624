"""Graph-capture readiness: which nodes would break capture on an EP, and why.

Static rules come from the EP's capability flags (no EP names): data-dependent shapes
(Shape, ConstantOfShape, shape-like int64 inputs computed at run time), control flow,
ops the EP has no kernel for, int64 arithmetic on EPs that run it on the CPU. Where the
EP is present in this onnxruntime, :func:`device_placement` also reports which provider
each node was actually assigned to.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx_ir as ir

from engine.caps import EpCapabilities
from engine.genai_doc import SESSIONS

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
DATA_DEPENDENT_SHAPES = frozenset({"Shape", "ConstantOfShape", "Size", "NonZero"})
# Inputs (by position) that are shapes, indices or sizes rather than data.
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Range": (0, 1, 2),
    "Pad": (1,),
    "Resize": (1, 2, 3),
    "TopK": (1,),
    "Split": (1,),
}
# Inputs the CUDA EP's kernels read in host memory (onnxruntime-gpu's registrations,
# OrtMemTypeCPUInput): the shape / index inputs above and the axes, bounds and lengths.
HOST_READ_INPUTS: dict[str, tuple[int, ...]] = {
    **SHAPE_INPUTS,
    "Pad": (1, 2, 3),
    "Clip": (1, 2),
    "ConstantOfShape": (0,),
    "CumSum": (1,),
    "ReduceSum": (1,),
    "ReduceMax": (1,),
    "ReduceMean": (1,),
    "GroupQueryAttention": (6,),
}
INT64 = ir.DataType.INT64


@dataclass(frozen=True)
class Finding:
    """One node that breaks graph capture, with the reason."""

    node: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class Placement:
    """Which provider ran the session's nodes (measured with the EP present)."""

    provider_nodes: dict[str, int]
    host_nodes: tuple[str, ...]
    """``OpType (name)`` of nodes placed on the CPU provider."""
    copies: tuple[str, ...] = ()
    """``OpType (name)`` of the Memcpy nodes partitioning inserted, on any provider."""
    host_nodes_break_capture: bool = True
    """Whether any node on the CPU breaks capture on this EP (WebGPU: every node must stay
    on the device). onnxruntime's CUDA graphs allow CPU nodes as long as no Memcpy node
    joins them to the device: shape subgraphs (Shape -> Gather -> Cast) that only feed
    host-memory inputs such as GroupQueryAttention's ``total_sequence_length``."""

    def breaks_capture(self) -> list[str]:
        """Why this placement keeps the session from being captured (empty: it does not)."""
        out = [f"{n} copies between the host and the device" for n in self.copies]
        if self.host_nodes_break_capture:
            out += [f"{n} was placed on the CPU" for n in self.host_nodes]
        return out


@dataclass(frozen=True)
class SessionAudit:
    """A session's readiness for graph capture on one EP."""

    session: str
    ep: str
    capture_supported: bool
    findings: tuple[Finding, ...]
    op_counts: dict[str, int] = field(default_factory=dict)
    placement: Placement | None = None
    placement_note: str = ""

    @property
    def capture_ready(self) -> bool:
        placed = self.placement is not None and bool(self.placement.breaks_capture())
        return self.capture_supported and not self.findings and not placed

    def reasons(self) -> list[str]:
        out = [f"{f.op_type} '{f.node}': {f.reason}" for f in self.findings]
        if not self.capture_supported:
            out.insert(0, f"{self.ep} does not support graph capture")
        if self.placement is not None:
            out += self.placement.breaks_capture()
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "ep": self.ep,
            "capture_supported": self.capture_supported,
            "capture_ready": self.capture_ready,
            "findings": [f.__dict__ for f in self.findings],
            "op_counts": self.op_counts,
            "placement": None if self.placement is None else self.placement.__dict__,
            "placement_note": self.placement_note,
        }


def _is_static(value: ir.Value | None) -> bool:
    return value is None or value.const_value is not None or value.is_initializer()


def _node_findings(node: ir.Node, caps: EpCapabilities) -> list[str]:
    reasons = []
    op = node.op_type
    ep = caps.display_name
    if op in CONTROL_FLOW:
        reasons.append("control flow cannot be captured")
    if caps.capture_needs_static_graph:
        if op in DATA_DEPENDENT_SHAPES:
            reasons.append(f"its output depends on run-time shapes; on {ep} it leaves the device")
        for index in SHAPE_INPUTS.get(op, ()):
            if index < len(node.inputs) and not _is_static(node.inputs[index]):
                reasons.append(f"input {index} (a shape or index) is computed at run time")
                break
    if op in caps.host_ops:
        reasons.append(f"{ep} has no kernel for {op}; it would run on the CPU")
    elif node.inputs and node.inputs[0] is not None and node.inputs[0].dtype is not None:
        dtype = node.inputs[0].dtype.name.lower()
        if not caps.has_kernel(op, dtype):
            reasons.append(f"{ep} has no kernel for {op} on {dtype}; it would run on the CPU")
    if not caps.int64_on_device and op not in ("Constant",) and op not in caps.int64_index_ops:
        shape_inputs = set(SHAPE_INPUTS.get(op, ()))
        for index, value in enumerate(node.inputs):
            if value is None or index in shape_inputs or _is_static(value):
                continue
            if value.dtype == INT64:
                reasons.append(f"int64 input '{value.name}': {ep} runs int64 arithmetic on the CPU")
                break
    return reasons


def audit_model(model: ir.Model, caps: EpCapabilities, session: str = "decoder") -> SessionAudit:
    """Static capture-readiness checks of one session graph for one EP."""
    findings = []
    for node in model.graph.all_nodes():
        for reason in _node_findings(node, caps):
            findings.append(Finding(node.name or "", node.op_type, reason))
    if not caps.int64_on_device:
        for value in model.graph.inputs:
            if value.dtype == INT64:
                findings.append(
                    Finding(
                        value.name or "",
                        "input",
                        f"int64 graph input; {caps.display_name} needs int32",
                    )
                )
    if caps.host_shape_inputs:
        findings += host_value_reads(model, caps)
    counts = Counter(node.op_type for node in model.graph.all_nodes())
    return SessionAudit(
        session=session,
        ep=caps.name,
        capture_supported=caps.graph_capture,
        findings=tuple(findings),
        op_counts=dict(sorted(counts.items())),
    )


def graph_inputs_above(value: ir.Value | None, stop_at: str = "") -> list[str]:
    """Names of the graph inputs whose values reach ``value``: a walk up the producers, not
    through ``stop_at`` nodes (Shape: its output carries no values)."""
    found, todo, seen = [], [value], set()
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        producer = current.producer()
        if current.is_graph_input():
            found.append(current.name or "")
        elif producer is not None and producer.op_type != stop_at:
            todo.extend(producer.inputs)
    return found


def host_value_reads(model: ir.Model, caps: EpCapabilities) -> list[Finding]:
    """Host-read inputs (:data:`HOST_READ_INPUTS`) computed from a graph input's values:
    the EP copies each to the host every run (shape arithmetic after Shape stays there with
    no copy), and graph capture cannot replay the copy."""
    findings = []
    for node in model.graph.all_nodes():
        for index in HOST_READ_INPUTS.get(node.op_type, ()):
            if index >= len(node.inputs) or _is_static(node.inputs[index]):
                continue
            for name in graph_inputs_above(node.inputs[index], stop_at="Shape"):
                reason = (
                    f"input {index} is computed from the values of '{name}': "
                    f"{caps.display_name} reads it on the host, a copy that graph capture "
                    "cannot replay"
                )
                findings.append(Finding(node.name or "", node.op_type, reason))
    return findings


_PLACEMENT_SCRIPT = r"""
import json, sys
try:
    import onnxruntime as ort
except Exception as exc:
    print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(3)
path, provider = sys.argv[1], sys.argv[2]
devices = []
if provider not in ort.get_available_providers():
    try:  # the WebGPU plugin EP (the parent set the software-adapter switch if needed)
        import onnxruntime_ep_webgpu as plugin
    except ImportError:
        plugin = None
    offered = ort.get_available_providers()
    if plugin is not None:
        name = plugin.get_ep_name()
        try:
            ort.register_execution_provider_library(name, plugin.get_library_path())
            found = [d for d in ort.get_ep_devices() if d.ep_name == name]
        except Exception:  # a plugin that cannot load here is not offered
            if name == provider:
                raise
            found = []
        if found:
            offered.append(name)  # offered too, though not listed as built in
        if name == provider:
            devices = found
    if not devices:
        print(json.dumps({"available": False, "providers": offered}))
        raise SystemExit(0)
options = ort.SessionOptions()
options.log_severity_level = 0
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
if devices:
    options.add_provider_for_devices(devices, {})
    ort.InferenceSession(path, options)
else:
    ort.InferenceSession(path, options, providers=[provider, "CPUExecutionProvider"])
print(json.dumps({"available": True}))
"""


def device_placement(
    model_path: str | os.PathLike[str], caps: EpCapabilities, python: str | None = None
) -> tuple[Placement | None, str]:
    """Create a session on the EP (in a subprocess, whose verbose log lists node
    placements) and report the providers. Returns (None, why) when the EP is absent.

    Raises:
        OptionsError: ``python`` cannot be run or has no onnxruntime.
        PackageError: onnxruntime could not create the session (a damaged package), or
            the measurement did not finish.
    """
    from engine.errors import OptionsError, PackageError, option

    name = Path(model_path).name
    interpreter = python or sys.executable
    if python is None:
        from engine.runtime.plugins import PLUGIN_MODULES, ort_plugin

        # Decides the software-adapter switch the child inherits (so it can also say what
        # the plugins offer when the EP asked for is absent).
        ort_plugin(caps.ort_provider)
        for provider in set(PLUGIN_MODULES) - {caps.ort_provider}:
            with contextlib.suppress(Exception):  # another EP's plugin: no reason to fail
                ort_plugin(provider)
    try:
        proc = subprocess.run(
            [interpreter, "-c", _PLACEMENT_SCRIPT, str(model_path), caps.ort_provider],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except OSError as exc:
        raise OptionsError(
            f"{option('runtime_python')} '{interpreter}' cannot be run: {exc.strerror or exc}; "
            "give the python of an environment that has onnxruntime"
        ) from exc
    except subprocess.TimeoutExpired:
        raise PackageError(
            f"measuring node placement of {name} on {caps.ort_provider} took over 600 s; "
            f"pass {option('no_placement')} to audit the graph alone"
        ) from None
    status = _last_json(proc.stdout)
    if "import_error" in status:
        raise OptionsError(
            f"{option('runtime_python')} '{interpreter}' has no usable onnxruntime "
            f"({status['import_error']}); give the python of an environment that has it"
        )
    if proc.returncode != 0 or "available" not in status:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PackageError(
            f"onnxruntime could not create a session for {name} on {caps.ort_provider}, so "
            f"node placement was not measured: {last.strip()[:300]}. If the package's files "
            "are damaged (a truncated .onnx.data), export it again"
        )
    if not status["available"]:
        return None, (
            f"{caps.ort_provider} is not available in this onnxruntime "
            f"(has {', '.join(status['providers'])}); placement not measured"
        )
    placement = parse_placements(proc.stderr)
    placement = replace(placement, host_nodes_break_capture=caps.capture_needs_static_graph)
    return placement, "measured"


def _last_json(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return {}


def parse_placements(log: str) -> Placement:
    """Parse onnxruntime's verbose 'Node placements' log (VerifyEachNodeIsAssignedToAnEp)."""
    counts: dict[str, int] = {}
    host: list[str] = []
    copies: list[str] = []
    current: str | None = None
    for line in log.splitlines():
        if "VerifyEachNodeIsAssignedToAnEp]" not in line:
            continue
        text = line.split("VerifyEachNodeIsAssignedToAnEp]", 1)[1]
        if "placed on [" in text:
            current = text.split("[", 1)[1].split("]", 1)[0]
            number = text.rsplit("Number of nodes:", 1)[1] if "Number of nodes:" in text else "0"
            counts[current] = counts.get(current, 0) + int(number.strip() or 0)
        elif text.startswith("   "):
            node = text.strip()
            if node.startswith("Memcpy"):
                copies.append(node)
            if current == "CPUExecutionProvider":
                host.append(node)
    return Placement(provider_nodes=counts, host_nodes=tuple(host), copies=tuple(copies))


def decide_capture(
    audit: SessionAudit, uses_gqa: bool, mode: str, never: str | None = None
) -> tuple[bool, list[str]]:
    """Graph capture for a session: ``off``; ``on`` (refuse with the audit's reasons when it
    cannot); ``auto`` (on where the EP supports it and the audit passes).

    ``never``: why this session is never captured whatever the mode (its input shapes
    change from run to run); ``on`` then means "on for the sessions that can be"."""
    if never is not None:
        return False, [never, *audit.reasons()]
    reasons = audit.reasons()
    if not uses_gqa:
        reasons.append(
            "standard attention grows the KV cache by Concat; capture needs "
            "GroupQueryAttention over a shared past/present buffer"
        )
    if mode == "off":
        return False, reasons
    ready = not reasons
    if mode == "on" and not ready:
        from engine.errors import OptionsError, option

        raise OptionsError(
            f"graph capture cannot be switched on for the {audit.session} session on "
            f"{audit.ep}:\n  "
            + "\n  ".join(reasons)
            + f"\nUse {option('graph_capture', 'auto')} or off."
        )
    return ready, reasons


def package_sessions(folder: Path) -> list[tuple[str, Path]]:
    """(session name, model path) for every session genai_config.json names."""
    from engine.errors import PackageError

    config_path = folder / "genai_config.json"
    if not config_path.is_file():
        raise PackageError(f"'{folder}' has no genai_config.json; is it an exported package?")
    try:
        model = json.loads(config_path.read_text(encoding="utf-8"))["model"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise PackageError(f"{config_path} is not a valid genai_config ({exc})") from exc
    sessions = []
    for key in SESSIONS:
        section = model.get(key)
        if isinstance(section, dict) and section.get("filename"):
            path = folder / section["filename"]
            if not path.is_file():
                raise PackageError(
                    f"genai_config.json names {section['filename']} for the "
                    f"{key} session, but the file is missing"
                )
            sessions.append((key, path))
    return sessions


def never_captured_sessions(
    manifest: Mapping[str, Any] | None, sessions: Sequence[str]
) -> dict[str, str]:
    """Sessions of a package that no capture mode captures, and why, as its manifest
    (``export_studio.json``) records them. A package of ours from before the manifest
    recorded them has such sessions only around a decoder that takes embeddings (Gemma 4's
    embedding, vision and speech sessions, all never captured); another tool's package
    (no manifest) has every session judged."""
    if manifest is None:  # not a package of ours: every session is judged
        return {}
    recorded = manifest.get("never_captured")
    if isinstance(recorded, Mapping):
        return {str(k): str(v) for k, v in recorded.items() if k in sessions}
    return {s: "its input shapes change between runs" for s in sessions if s != "decoder"}


def audit_package(
    folder: str | os.PathLike[str],
    caps: EpCapabilities,
    measure: bool = True,
    python: str | None = None,
) -> list[SessionAudit]:
    """Audit every session of a package folder (graphs are read without weight bytes)."""
    audits = []
    for session, model_path in package_sessions(Path(folder)):
        audit = audit_model(_load_graph(model_path), caps, session)
        if measure:
            placement, note = device_placement(model_path, caps, python)
            audit = SessionAudit(
                audit.session,
                audit.ep,
                audit.capture_supported,
                audit.findings,
                audit.op_counts,
                placement,
                note,
            )
        audits.append(audit)
    return audits


def _load_graph(model_path: Path) -> ir.Model:
    """A session's graph without its weights; a file that is no ONNX model, or one with no
    nodes (an empty file parses as an empty model), is a damaged package."""
    from engine.errors import PackageError

    try:
        model = ir.load(model_path)
    except Exception as exc:  # protobuf's DecodeError and the like: any means damage
        raise PackageError(
            f"{model_path} is not a readable ONNX model ({type(exc).__name__}); "
            "export the package again"
        ) from exc
    if not model.graph.outputs or next(iter(model.graph), None) is None:
        raise PackageError(
            f"{model_path} holds no graph ({model_path.stat().st_size:,} bytes); "
            "export the package again"
        )
    return model
