"""Execution providers that come as plugin libraries for a plain onnxruntime: the WebGPU
EP of ``onnxruntime-ep-webgpu`` (``pip install ".[webgpu]"``), which loads beside
``onnxruntime`` >= 1.24.4 and onnxruntime-genai in one environment.

Each plugin is registered once per process, with onnxruntime (sessions then take it through
``SessionOptions.add_provider_for_devices``) and with onnxruntime-genai. An onnxruntime
build that has the provider built in (``onnxruntime-webgpu`` 1.27) needs no plugin and is
used as it is.

Without a GPU the WebGPU plugin offers no device unless
``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1`` is set before it is registered; that is set here
only when the plugin found no GPU adapter and Mesa's software Vulkan (lavapipe) is
installed, and every result then says it ran on a software adapter (set the variable to 0
to refuse it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PLUGIN_MODULES = {"WebGpuExecutionProvider": "onnxruntime_ep_webgpu"}
"""onnxruntime provider name -> the Python module that ships its plugin library."""
SOFTWARE_ADAPTER_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"
ICD_FOLDERS = (
    "/usr/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
    "/usr/local/nvidia/share/vulkan/icd.d",
)
"""Where Vulkan loaders look for drivers (``VK_DRIVER_FILES`` / ``VK_ICD_FILENAMES`` name
others)."""


@dataclass(frozen=True)
class PluginDevice:
    """A plugin EP with the devices it offers here."""

    provider: str
    library: str
    version: str
    devices: tuple[Any, ...]
    """onnxruntime's ``OrtEpDevice`` objects for this EP."""
    software: bool
    """The device is a CPU (lavapipe), not a GPU."""

    @property
    def adapter(self) -> str:
        """In words, for results and the studio's About box."""
        kind = "software adapter (lavapipe, no GPU)" if self.software else "GPU adapter"
        return f"{self.provider} plugin {self.version}, {kind}"


def _vulkan_drivers(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if env is None else env
    named = [
        p
        for key in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")
        for p in env.get(key, "").split(os.pathsep)
        if p
    ]
    found = [str(p) for folder in ICD_FOLDERS for p in sorted(Path(folder).glob("*.json"))]
    return named + found


def has_lavapipe(drivers: Iterable[str] | None = None) -> bool:
    """Mesa's software Vulkan driver is installed (``lvp_icd*.json``)."""
    names = [Path(d).name.lower() for d in (_vulkan_drivers() if drivers is None else drivers)]
    return any(n.startswith("lvp") for n in names)


def _library(provider: str) -> str | None:
    module_name = PLUGIN_MODULES.get(provider)
    if module_name is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    path = str(module.get_library_path())
    return path if Path(path).is_file() else None


@cache
def ort_plugin(provider: str) -> PluginDevice | None:
    """The plugin EP ``provider``, registered with onnxruntime (once per process) and with
    the devices it offers; None when its module is not installed or onnxruntime has the
    provider built in."""
    library = _library(provider)
    if library is None:
        return None
    import onnxruntime as ort

    if provider in ort.get_available_providers():
        return None  # a build with it built in (onnxruntime-webgpu): no plugin needed
    with _quiet(ort):
        ort.register_execution_provider_library(provider, library)
        devices = _devices(ort, provider)
        if not devices and os.environ.get(SOFTWARE_ADAPTER_ENV) is None and has_lavapipe():
            # No GPU adapter: lavapipe instead, which the plugin offers only when told to
            # before it is registered.
            ort.unregister_execution_provider_library(provider)
            os.environ[SOFTWARE_ADAPTER_ENV] = "1"
            ort.register_execution_provider_library(provider, library)
            devices = _devices(ort, provider)
    software = bool(devices) and all("CPU" in str(d.device.type) for d in devices)
    version = str(devices[0].ep_metadata.get("version", "")) if devices else ""
    return PluginDevice(provider, library, version, devices, software)


@contextlib.contextmanager
def _quiet(ort: Any) -> Iterator[None]:
    """onnxruntime's warnings off while a plugin registers (the software-adapter notice is
    said in the results instead, once, in words)."""
    ort.set_default_logger_severity(3)
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)


def _devices(ort: Any, provider: str) -> tuple[Any, ...]:
    return tuple(d for d in ort.get_ep_devices() if d.ep_name == provider)


def no_device_reason(provider: str) -> str | None:
    """Why an installed plugin EP offers no device here, in words that say what to do; None
    when it offers one or is not installed."""
    plugin = ort_plugin(provider)
    if plugin is None or plugin.devices:
        return None
    said = os.environ.get(SOFTWARE_ADAPTER_ENV)
    switched_off = said is not None and said != "1"
    if not has_lavapipe():
        return (
            f"the {provider} plugin is installed but found no GPU adapter and no software "
            "Vulkan driver to fall back on: install Mesa's lavapipe (bash "
            "scripts/install-lavapipe.sh)"
            + (f", and unset {SOFTWARE_ADAPTER_ENV}={said}" if switched_off else "")
        )
    if switched_off:
        return (
            f"the {provider} plugin is installed but found no GPU adapter, and "
            f"{SOFTWARE_ADAPTER_ENV}={said} keeps it off the software one (lavapipe): unset "
            "it, or set it to 1, to run there"
        )
    return f"the {provider} plugin is installed but offers no device here"


def plugin_providers() -> list[str]:
    """Plugin EPs that offer a device here (registered with onnxruntime)."""
    return [p for p in PLUGIN_MODULES if (plugin := ort_plugin(p)) is not None and plugin.devices]


@cache
def register_genai(provider: str) -> bool:
    """Register the plugin library of ``provider`` with onnxruntime-genai (once); False
    when ``provider`` comes from no plugin here."""
    plugin = ort_plugin(provider)
    if plugin is None or not plugin.devices:
        return False
    import onnxruntime_genai as og

    og.register_execution_provider_library(provider, plugin.library)
    return True


ADAPTER_NOTICE = re.compile(
    rb"^Warning: max\w+ artificially reduced from \d+ to \d+ to fit dynamic offset "
    rb"allocation limit\.\r?$"
)
"""What Dawn prints on fd 2 when it makes its device (twice per process, on a GPU too):
a note about its own limits, nothing a user can act on."""

_filter = {"enabled": False, "depth": 0}
_filter_lock = threading.Lock()


def drop_adapter_notices(enabled: bool = True) -> None:
    """Let :func:`adapter_notices_dropped` filter (the CLI turns it on; a process that
    shares fd 2 between threads or with children it starts, like the studio, leaves it
    off: there Dawn's lines only reach a console nobody reads)."""
    _filter["enabled"] = enabled


def dropping_adapter_notices() -> bool:
    """Whether :func:`drop_adapter_notices` turned the filter on (a child process that
    runs this process's work is told to do the same)."""
    return bool(_filter["enabled"])


@contextlib.contextmanager
def adapter_notices_dropped() -> Iterator[None]:
    """Inside (when :func:`drop_adapter_notices` enabled it): fd 2 goes through a filter
    that drops Dawn's ADAPTER_NOTICE lines and passes every other line on as it comes
    (onnxruntime's messages, a crash report). Used around each plugin session's creation,
    where Dawn makes its device. Nested or concurrent uses redirect once; a child started
    inside that keeps the pipe open keeps being forwarded until it closes it."""
    with _filter_lock:
        outermost = _filter["enabled"] and _filter["depth"] == 0
        _filter["depth"] += 1
    try:
        with _filtered_stderr() if outermost else contextlib.nullcontext():
            yield
    finally:
        with _filter_lock:
            _filter["depth"] -= 1


@contextlib.contextmanager
def _filtered_stderr() -> Iterator[None]:
    try:
        original = os.dup(2)
    except OSError:  # no fd 2 (a windowed process): nothing to filter
        yield
        return
    read_end, write_end = os.pipe()
    reader = threading.Thread(
        target=_forward, args=(read_end, original), name="dawn-notices", daemon=True
    )
    reader.start()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last writer here closes: the reader sees its end
        reader.join(timeout=2)  # a child may still hold the pipe: the reader goes on


def _forward(read_end: int, target: int) -> None:
    """Copy lines from the pipe to ``target`` as they come, minus Dawn's notices; close
    both at the pipe's end."""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = [line + b"\n" for line in lines if not ADAPTER_NOTICE.match(line)]
            if kept:
                os.write(target, b"".join(kept))
        if pending and not ADAPTER_NOTICE.match(pending):
            os.write(target, pending)
    os.close(target)
