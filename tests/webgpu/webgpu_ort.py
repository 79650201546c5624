"""The WebGPU EP for the scripts in tests/webgpu, from whichever runtime this interpreter has:
the ``onnxruntime-ep-webgpu`` plugin beside a plain onnxruntime (the main environment,
registered by :mod:`engine.runtime.plugins`, lavapipe when there is no GPU), or
onnxruntime-webgpu 1.27 with the provider built in (``scripts/setup-webgpu.sh``'s
``.venv-webgpu``, kept for side-by-side runs).

``session(model, options, providers)`` stands in for ``ort.InferenceSession``: with the
plugin, the EP comes from ``SessionOptions.add_provider_for_devices`` (onnxruntime then adds
the CPU EP itself, which ``session.disable_cpu_ep_fallback`` still forbids).
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

WEBGPU = "WebGpuExecutionProvider"
CPU = "CPUExecutionProvider"


def _plugin() -> Any:
    from engine.runtime.plugins import ort_plugin

    return ort_plugin(WEBGPU)


def built_in() -> bool:
    """onnxruntime-webgpu: the provider is part of this onnxruntime (once the plugin is
    registered, onnxruntime lists it as available too, so the plugin is asked first)."""
    return _plugin() is None and WEBGPU in ort.get_available_providers()


def available_providers() -> list[str]:
    """onnxruntime's providers plus the WebGPU plugin when it offers a device here (the
    engine's own list)."""
    from engine.runtime.session import available_providers as engine_providers

    return engine_providers()


def runtime() -> dict[str, Any]:
    """Which WebGPU runtime this is, for the reports."""
    if built_in():
        return {"runtime": f"onnxruntime-webgpu {ort.__version__}", "software_adapter": None}
    plugin = _plugin()
    if plugin is None or not plugin.devices:
        return {"runtime": None, "software_adapter": None}
    return {
        "runtime": f"onnxruntime {ort.__version__} + onnxruntime-ep-webgpu {plugin.version}",
        "software_adapter": plugin.software,
    }


def session(
    model: Any,
    options: ort.SessionOptions | None = None,
    providers: list[str] | tuple[str, ...] = (WEBGPU,),
    provider_options: dict[str, str] | None = None,
) -> ort.InferenceSession:
    """``ort.InferenceSession(model, options, providers)`` on this interpreter's WebGPU runtime."""
    options = options if options is not None else ort.SessionOptions()
    model = str(model) if not isinstance(model, (bytes, str)) else model
    if WEBGPU not in providers or built_in():
        listed: list[Any] = [
            (p, dict(provider_options)) if p == WEBGPU and provider_options else p
            for p in providers
        ]
        return ort.InferenceSession(model, options, providers=listed)
    plugin = _plugin()
    if plugin is None or not plugin.devices:
        raise RuntimeError(
            "no WebGPU runtime here: pip install onnxruntime-ep-webgpu (the '.[webgpu]' extra) "
            "and, without a GPU, Mesa's lavapipe (scripts/install-lavapipe.sh)"
        )
    options.add_provider_for_devices(list(plugin.devices), dict(provider_options or {}))
    return ort.InferenceSession(model, options)


def register_genai() -> bool:
    """Give onnxruntime-genai the WebGPU plugin (nothing to do for onnxruntime-webgpu 1.27,
    whose genai finds the provider built in); False when there is no plugin here."""
    if built_in():
        return False
    from engine.runtime.plugins import register_genai as register

    return register(WEBGPU)
