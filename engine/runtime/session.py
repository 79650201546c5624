"""onnxruntime sessions for one EP, never silently on another, and which provider ran.

An EP that this onnxruntime build does not offer is refused with
:class:`RuntimeUnavailableError` (no fallback to the CPU). Because an offered EP can
still hand every node to the CPU (WebGPU without an adapter does), the first run of a
session is profiled and :func:`read_placement` counts the nodes each provider ran.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.caps import EpCapabilities, get_caps, list_eps
from engine.errors import OptionsError, RuntimeUnavailableError, option
from engine.runtime.limits import check_threads
from engine.runtime.plugins import (
    PLUGIN_MODULES,
    adapter_notices_dropped,
    no_device_reason,
    ort_plugin,
    plugin_providers,
)
from engine.runtime.session_files import load_failure

CPU = "CPUExecutionProvider"
_SESSIONS = itertools.count()


def one_line(exc: BaseException) -> str:
    """A child library's error text on one line: onnxruntime's and genai's messages can
    span several (C++ signatures, stack notes)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _built_in_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())


def available_providers() -> list[str]:
    """Providers this onnxruntime offers, built in or as a plugin with a device here
    (:mod:`engine.runtime.plugins`); empty when onnxruntime is missing."""
    built_in = _built_in_providers()
    if not built_in:  # onnxruntime always offers the CPU: it is missing
        return []
    return [*built_in, *(p for p in plugin_providers() if p not in built_in)]


def require_provider(ep: str) -> EpCapabilities:
    """The capabilities of ``ep`` after checking onnxruntime offers its provider.

    Raises:
        OptionsError: ``ep`` is not a known EP name.
        RuntimeUnavailableError: onnxruntime is missing or lacks the provider.
    """
    caps = get_caps(ep)
    offered = _built_in_providers()
    if offered and caps.ort_provider not in offered and caps.ort_provider in PLUGIN_MODULES:
        offered = available_providers()  # a plugin is registered only when it is asked for
    if not offered:
        raise RuntimeUnavailableError(
            "onnxruntime is not installed; install it (pip install onnxruntime) "
            "or, for WebGPU, onnxruntime-webgpu"
        )
    if caps.ort_provider not in offered:
        hint = no_device_reason(caps.ort_provider) or caps.install_hint
        here = set(available_providers())
        usable = [name for name in list_eps() if get_caps(name).ort_provider in here]
        raise RuntimeUnavailableError(
            f"the {caps.display_name} EP ({caps.ort_provider}) is not available in this "
            f"onnxruntime; "
            + (f"{hint}, or " if hint else "")
            + f"run on one it offers ({', '.join(usable)}) with {option('ep')}"
        )
    return caps


class _ProfileState:
    """Whether a session's profile is still being recorded (its file not yet written)."""

    def __init__(self) -> None:
        self.open = True


def _discard_profile(session: Any, state: _ProfileState) -> None:
    """End a profile nobody read (the run failed before placement was measured) and delete
    its file, which onnxruntime would otherwise write into the temporary folder."""
    if not state.open:
        return
    state.open = False
    with contextlib.suppress(Exception):  # a session that failed half-way: nothing to clean
        Path(session.end_profiling()).unlink(missing_ok=True)


@dataclass(frozen=True)
class SessionHandle:
    """An onnxruntime session and how it was made."""

    session: Any
    ep: str
    provider: str
    device: str
    graph_capture: bool
    load_seconds: float
    profiling: bool = False
    adapter: str | None = None
    """How a plugin EP ran (its version, GPU or software adapter); None for a built-in EP."""
    profile_state: _ProfileState = field(default_factory=_ProfileState, repr=False, compare=False)


def create_session(
    model_file: str | os.PathLike[str],
    ep: str,
    *,
    graph_capture: bool = False,
    provider_options: Mapping[str, str] | None = None,
    profile_first_run: bool = True,
    threads: int | None = None,
) -> SessionHandle:
    """A session on exactly one EP (plus the CPU for what the EP declines).

    Args:
        model_file: The decoder .onnx file.
        ep: Short EP name (cpu, webgpu, cuda, ...).
        graph_capture: Switch the EP's graph capture on.
        provider_options: Options from genai_config for this EP (capture excluded).
        profile_first_run: Profile so :func:`read_placement` can tell who ran the nodes.
        threads: intra-op threads (None: onnxruntime's default).

    Raises:
        RuntimeUnavailableError: The EP is not available or refuses the model.
        OptionsError: Graph capture was asked for on an EP that cannot do it here.
    """
    import onnxruntime as ort

    check_threads(threads)
    caps = require_provider(ep)
    provider = caps.ort_provider
    if graph_capture and (caps.capture_option is None or not caps.graph_capture):
        raise OptionsError(
            f"graph capture is not available for {caps.display_name} from Python; "
            f"use {option('graph_capture', 'off')}"
        )
    options = {k: v for k, v in (provider_options or {}).items() if k != caps.capture_option}
    if graph_capture and caps.capture_option is not None:
        options[caps.capture_option] = "1"
    so = ort.SessionOptions()
    # Errors only: what onnxruntime warns of (nodes placed on the CPU, above all) the
    # results say in words (:func:`read_placement`).
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if profile_first_run:
        so.enable_profiling = True
        # One prefix per session, so the file of a session that fails to load is known.
        profile_prefix = Path(tempfile.gettempdir()) / f"es-profile-{os.getpid()}-{next(_SESSIONS)}"
        so.profile_file_prefix = str(profile_prefix)
    plugin = ort_plugin(provider)
    providers: list[Any] | None = [provider]
    if plugin is not None:  # a plugin EP: its devices, the options as its own
        so.add_provider_for_devices(list(plugin.devices), {k: str(v) for k, v in options.items()})
        providers = None  # onnxruntime adds the CPU for what the plugin declines
    elif caps.session_config_prefix is not None:
        for key, value in options.items():
            so.add_session_config_entry(caps.session_config_prefix + key, str(value))
    elif options:
        providers = [(provider, dict(options))]
    if providers is not None and provider != CPU:
        providers.append(CPU)
    started = time.perf_counter()
    try:
        if providers is None:
            with adapter_notices_dropped():
                session = ort.InferenceSession(str(model_file), so)
        else:
            session = ort.InferenceSession(str(model_file), so, providers=providers)
    except Exception as exc:  # onnxruntime raises several unrelated types
        if profile_first_run:  # onnxruntime writes an empty profile for a failed load
            for leftover in profile_prefix.parent.glob(f"{profile_prefix.name}_*.json"):
                leftover.unlink(missing_ok=True)
        model_path = Path(model_file)
        short = load_failure(model_path.parent, model_path.name, str(exc))
        if short is not None:
            raise short from exc
        message = one_line(exc)
        hint = (
            "; the graph has nodes this EP cannot run, so capture is refused: "
            f"benchmark with {option('graph_capture', 'off')} or rebuild for capture"
            if graph_capture and "graph capture" in message.lower()
            else ""
        )
        raise RuntimeUnavailableError(
            f"{caps.display_name} could not load {Path(model_file).name}: {message}{hint}"
        ) from exc
    if provider not in session.get_providers():
        # onnxruntime's Python wrapper retries on the CPU alone when the EP fails to start.
        raise RuntimeUnavailableError(
            f"{caps.display_name} failed to start here and onnxruntime fell back to "
            f"{', '.join(session.get_providers())}; for WebGPU check that a GPU adapter "
            "(Vulkan, Metal or D3D12) is present; no CPU numbers are reported as "
            f"{caps.display_name}"
        )
    handle = SessionHandle(
        session=session,
        ep=caps.name,
        provider=provider,
        device=caps.io_device,
        graph_capture=graph_capture,
        load_seconds=time.perf_counter() - started,
        profiling=profile_first_run,
        adapter=plugin.adapter if plugin is not None else None,
    )
    if profile_first_run:
        weakref.finalize(handle, _discard_profile, session, handle.profile_state)
    return handle


@dataclass(frozen=True)
class Placement:
    """Which provider ran how many nodes in a profiled run."""

    requested: str
    nodes: Mapping[str, int] = field(default_factory=dict)
    fallback_ops: Mapping[str, int] = field(default_factory=dict)
    """Op type -> count of nodes that ran on the CPU though another EP was requested."""

    @property
    def provider(self) -> str:
        """The provider that ran the nodes: the requested one if it ran any."""
        if self.nodes.get(self.requested):
            return self.requested
        return max(self.nodes, key=lambda p: self.nodes[p]) if self.nodes else "unknown"

    @property
    def all_on_requested(self) -> bool:
        return bool(self.nodes) and set(self.nodes) == {self.requested}

    def to_json(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "provider": self.provider,
            "nodes": dict(self.nodes),
            "fallback_ops": dict(self.fallback_ops),
        }


def fallback_note(fallback_ops: Mapping[str, int]) -> str:
    """The sentence that says which nodes ran on the CPU instead of the EP ("" for none)."""
    if not fallback_ops:
        return ""
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(fallback_ops.items()))
    return f"nodes that ran on the CPU instead: {ops}"


def read_placement(handle: SessionHandle) -> Placement:
    """Stop profiling and count the nodes per provider of the run(s) so far.

    Raises:
        RuntimeUnavailableError: The requested EP ran no node at all (e.g. WebGPU with no
            adapter silently running everything on the CPU).
    """
    if not handle.profiling or not handle.profile_state.open:
        return Placement(requested=handle.provider)
    handle.profile_state.open = False
    profile = Path(handle.session.end_profiling())
    try:
        events = json.loads(profile.read_text(encoding="utf-8"))
    finally:
        profile.unlink(missing_ok=True)
    placement = placement_from_profile(events, handle.provider)
    if handle.provider != CPU and not placement.nodes.get(handle.provider):
        raise RuntimeUnavailableError(
            f"{handle.provider} was requested but ran none of the {sum(placement.nodes.values())}"
            f" nodes (they ran on {placement.provider}); the EP has no usable device here "
            "(for WebGPU: a Vulkan/Metal/D3D12 adapter); numbers would be the CPU's, so none "
            "are reported"
        )
    return placement


def placement_from_profile(events: list[dict[str, Any]], requested: str) -> Placement:
    """Count distinct nodes per provider in onnxruntime profile events."""
    seen: dict[str, tuple[str, str]] = {}
    for event in events:
        if event.get("cat") != "Node":
            continue
        args = event.get("args") or {}
        provider = args.get("provider")
        name = str(event.get("name", ""))
        if provider and name.endswith("_kernel_time"):
            seen[name] = (str(provider), str(args.get("op_name", "?")))
    nodes = Counter(provider for provider, _ in seen.values())
    fallback = Counter(op for provider, op in seen.values() if provider == CPU and requested != CPU)
    return Placement(requested=requested, nodes=dict(nodes), fallback_ops=dict(fallback))
