"""tests/webgpu: scripts that run a package or one op on the WebGPU EP in a child process
(driven by tests/engine/test_webgpu*.py and friends), and tests of the engine's own runner on
the WebGPU EP (test_*.py), which the main test run collects like any other: the WebGPU
runtime is the onnxruntime-ep-webgpu plugin in the same environment. The same tests run on
onnxruntime-webgpu 1.27 with ``.venv-webgpu/bin/python -m pytest tests/webgpu``
(scripts/setup-webgpu.sh)."""
