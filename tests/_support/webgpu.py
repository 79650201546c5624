"""What a test that runs a package on the WebGPU EP needs first."""

from __future__ import annotations

import pytest


def require_webgpu() -> None:
    """Fail loudly (never skip) where this environment has no WebGPU runtime with a device."""
    from engine.runtime.session import available_providers

    if "WebGpuExecutionProvider" not in available_providers():
        pytest.fail(
            "no WebGPU runtime in this environment: pip install -e '.[webgpu]' (the plugin) "
            "and, without a GPU, bash scripts/install-lavapipe.sh"
        )
