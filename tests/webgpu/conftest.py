"""tests/webgpu holds tests that run INSIDE the WebGPU environment (onnxruntime-webgpu
cannot share an environment with onnxruntime). The main environment does not collect
them; tests/engine/test_webgpu.py runs them in .venv-webgpu and fails loudly when that
environment is missing."""

from importlib import metadata


def _in_webgpu_environment() -> bool:
    try:
        metadata.version("onnxruntime-webgpu")
    except metadata.PackageNotFoundError:
        return False
    return True


collect_ignore_glob = [] if _in_webgpu_environment() else ["test_*.py"]
