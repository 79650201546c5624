"""WebGPU in the main environment: the ``onnxruntime-ep-webgpu`` plugin beside onnxruntime
and onnxruntime-genai (the dev extra installs it; a missing one fails here, loudly).

On this machine there is no GPU: the plugin runs on Mesa's lavapipe, which it offers only
with ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1``; :mod:`engine.runtime.plugins` sets that when
it found no GPU adapter and lavapipe is installed, and says so in every result.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime_ep_webgpu  # noqa: F401  (the dev extra installs it)
import pytest

from engine.audit import audit_package
from engine.caps import get_caps
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.bench import compare_capture
from engine.runtime.bench_record import BenchConfig
from engine.runtime.plugins import no_device_reason, ort_plugin
from engine.runtime.runner import Runner, RunnerOptions
from engine.runtime.session import available_providers
from tests._support.ort_loop import ort_greedy
from tests._support.quantized import MIXED_BY_NAME, WIDE_QWEN2
from tests._support.tiny_gemma import hf_greedy
from tests._support.tiny_llama import make_checkpoint

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
STEPS = 20
LAVAPIPE_TOL = 1e-3
"""Max |logit diff| of an fp32 package on lavapipe vs transformers; measured 2e-6 here
(tests/engine/test_webgpu.py keeps 0.05 for the looser software-Vulkan cases)."""


@pytest.fixture(scope="module")
def plugin():
    found = ort_plugin("WebGpuExecutionProvider")
    if found is None or not found.devices:
        why = no_device_reason("WebGpuExecutionProvider") or "the plugin is not installed"
        pytest.fail(f"the WebGPU plugin EP offers no device: {why}")
    return found


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("plugin")
    model = make_checkpoint(root / "qwen3", "qwen3_sliding")
    export(
        root / "webgpu", model_dir=root / "qwen3", options=ExportOptions(ep="webgpu", dtype="fp32")
    )
    return root, model


def test_the_plugin_is_offered_beside_the_cpu_runtime(plugin):
    assert "WebGpuExecutionProvider" in available_providers()
    assert "CPUExecutionProvider" in available_providers()
    assert plugin.software == (not any("GPU" in str(d.device.type) for d in plugin.devices))
    assert ("software adapter" in plugin.adapter) == plugin.software


def test_a_family_package_on_the_plugin_equals_transformers_with_capture(plugin, qwen3):
    """Our runner on the plugin: capture off and on give transformers' greedy tokens, the
    logits within lavapipe's tolerance, and capture on equals off bit for bit."""
    root, model = qwen3
    ref_tokens, ref_logits = hf_greedy(model, PROMPT, STEPS)
    runs = {}
    for capture in (False, True):
        runner = Runner(root / "webgpu", RunnerOptions(ep="webgpu", graph_capture=capture))
        assert runner.handle.adapter == plugin.adapter
        runs[capture] = runner.generate(PROMPT, STEPS, keep_logits=True)
        assert list(runs[capture].tokens) == ref_tokens
    last_rows = np.stack([step[-1] for step in ref_logits[:STEPS]])
    for capture, run in runs.items():
        diff = float(np.abs(np.stack(run.logits) - last_rows).max())
        assert diff <= LAVAPIPE_TOL, (capture, diff)
    np.testing.assert_array_equal(np.stack(runs[True].logits), np.stack(runs[False].logits))


def test_genai_runs_the_plugin_and_the_bench_says_which_adapter(plugin, qwen3):
    root, _ = qwen3
    config = BenchConfig(
        runtime="genai", ep="webgpu", prompt_length=8, new_tokens=8, repeats=1, warmup=0
    )
    # In processes of their own, as the CLI and the studio run them: what the record says
    # of the adapter comes from the process that ran the package.
    result = compare_capture(root / "webgpu", config, isolated=True)
    assert result.on is not None and result.agreement is not None, result
    assert result.agreement.same_tokens and result.agreement.max_abs_logit_diff == 0.0
    assert any(plugin.adapter in note for note in result.off.notes)
    # ... and as a field of its own, which JSON readers and the studio's history keep.
    assert result.off.adapter == result.on.adapter == plugin.adapter
    assert result.to_json()["off"]["adapter"] == plugin.adapter


def test_the_audit_measures_placement_on_the_plugin(plugin, qwen3):
    root, _ = qwen3
    (audit,) = audit_package(root / "webgpu", get_caps("webgpu"))
    assert audit.placement is not None
    assert set(audit.placement.provider_nodes) == {"WebGpuExecutionProvider"}
    assert audit.capture_ready, audit.reasons()


def test_the_cpu_reference_agrees(qwen3, tmp_path: Path):
    """The same checkpoint's CPU package (GroupQueryAttention) gives the tokens the plugin
    gave: the two lowerings of one model."""
    root, model = qwen3
    export(tmp_path / "cpu", model_dir=root / "qwen3", options=ExportOptions(dtype="fp32"))
    tokens, _ = ort_greedy(tmp_path / "cpu", PROMPT, STEPS)
    assert tokens == hf_greedy(model, PROMPT, STEPS)[0]


def test_bench_output_has_neither_dawn_notices_nor_bar_frames(plugin, qwen3):
    """``bench`` through our runner and genai, output to files (a log, CI): stderr keeps no
    Dawn "artificially reduced" notices and no progress-bar frames (issue 23, item 12)."""
    root, _ = qwen3
    for runtime in ("ort", "genai"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine",
                "bench",
                str(root / "webgpu"),
                "--runtime",
                runtime,
                "--graph-capture",
                "both",
                "--prompt-len",
                "8",
                "--new-tokens",
                "4",
                "--repeats",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "decode tok/s" in done.stdout and "same tokens" in done.stdout
        assert "artificially reduced" not in done.stderr + done.stdout, done.stderr
        assert "\r" not in done.stderr and "%|" not in done.stderr, done.stderr


def test_the_software_adapter_turned_off_is_named_as_the_reason(plugin, qwen3):
    """With no GPU and ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=0`` the plugin offers nothing:
    the error names the variable, not an install the user has already done."""
    import os

    if not plugin.software:
        pytest.skip("a GPU adapter is here: the variable does not take it away")
    root, _ = qwen3
    env = {**os.environ, "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "engine", "bench", str(root / "webgpu"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=0 keeps it off the software one" in done.stderr
    assert "pip install" not in done.stderr


def test_a_plugin_without_a_device_says_what_to_do(monkeypatch: pytest.MonkeyPatch):
    from engine.runtime import plugins

    empty = plugins.PluginDevice("WebGpuExecutionProvider", "lib.so", "0.4.0", (), False)
    monkeypatch.setattr(plugins, "ort_plugin", lambda provider: empty)
    monkeypatch.setenv(plugins.SOFTWARE_ADAPTER_ENV, "0")
    monkeypatch.setattr(plugins, "has_lavapipe", lambda drivers=None: False)
    reason = plugins.no_device_reason("WebGpuExecutionProvider") or ""
    assert "install Mesa's lavapipe" in reason  # first: unsetting the variable alone won't do
    assert reason.endswith("and unset ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=0"), reason
    monkeypatch.setattr(plugins, "has_lavapipe", lambda drivers=None: True)
    reason = plugins.no_device_reason("WebGpuExecutionProvider") or ""
    assert "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=0 keeps it off the software one" in reason
    monkeypatch.delenv(plugins.SOFTWARE_ADAPTER_ENV)
    assert plugins.no_device_reason(
        "WebGpuExecutionProvider",
    ) == ("the WebGpuExecutionProvider plugin is installed but offers no device here")


def _stderr_lines(script: str) -> list[str]:
    """What a fresh Python running ``script`` writes to fd 2, line by line."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stderr.splitlines()


def test_the_notice_filter_drops_only_dawns_notices(tmp_path: Path):
    """Everything else written to fd 2 inside the filter comes out, in order, after it."""
    script = (
        "import os, sys\n"
        "from engine.runtime.plugins import adapter_notices_dropped, drop_adapter_notices\n"
        "drop_adapter_notices()\n"
        "with adapter_notices_dropped():\n"
        "    os.write(2, b'first line\\n')\n"
        "    os.write(2, b'Warning: maxDynamicUniformBuffersPerPipelineLayout artificially "
        "reduced from 1000000 to 16 to fit dynamic offset allocation limit.\\n')\n"
        "    print('from python', file=sys.stderr)\n"
        "    os.write(2, b'Warning: something else\\n')\n"
        "os.write(2, b'after\\n')\n"
    )
    assert _stderr_lines(script) == [
        "first line",
        "from python",
        "Warning: something else",
        "after",
    ]


def test_the_notice_filter_is_safe_under_threads_and_off_outside_the_cli():
    """Two threads inside the filter at once lose no line and leave fd 2 working; without
    drop_adapter_notices() (the studio) nothing is redirected at all."""
    script = (
        "import os, sys, threading\n"
        "from engine.runtime.plugins import adapter_notices_dropped, drop_adapter_notices\n"
        "with adapter_notices_dropped():\n"
        "    os.write(2, b'Warning: maxA artificially reduced from 1 to 2 to fit dynamic "
        "offset allocation limit.\\n')\n"
        "drop_adapter_notices()\n"
        "def work(i):\n"
        "    with adapter_notices_dropped():\n"
        "        for j in range(50):\n"
        "            os.write(2, f'thread {i} line {j}\\n'.encode())\n"
        "threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "os.write(2, b'still here\\n')\n"
    )
    lines = _stderr_lines(script)
    assert lines[0].startswith("Warning: maxA")  # the filter was off: passed through
    assert sorted(lines[1:-1]) == sorted(
        f"thread {i} line {j}" for i in range(2) for j in range(50)
    )
    assert lines[-1] == "still here"


def test_int8_weights_at_block_128_beside_int4_run_on_the_plugin(plugin, tmp_path: Path):
    """Mixed precision's INT8 weights take blocks of 128 (64 where the width needs it)
    beside INT4 ones at 16: the WebGPU package (MatMulNBits and GatherBlockQuantized at
    both bit widths) gives the CPU package's tokens and logits on the plugin, capture on."""
    make_checkpoint(tmp_path / "checkpoint", "qwen2", **WIDE_QWEN2)
    packages = {}
    for ep in ("cpu", "webgpu"):
        packages[ep] = tmp_path / ep
        result = export(
            packages[ep],
            model_dir=tmp_path / "checkpoint",
            options=ExportOptions(ep=ep, **MIXED_BY_NAME),
        )
        blocks = {(wp.bits, wp.block_size) for wp in result.plan.decoder.weights if wp.quantized}
        assert {(8, 128), (8, 64), (4, 16)} <= blocks, (ep, blocks)
    tokens, logits = ort_greedy(packages["cpu"], PROMPT, STEPS)
    runner = Runner(packages["webgpu"], RunnerOptions(ep="webgpu", graph_capture=True))
    run = runner.generate(PROMPT, STEPS, keep_logits=True)
    assert list(run.tokens) == tokens
    last_rows = np.stack([np.asarray(step).reshape(-1, step.shape[-1])[-1] for step in logits])
    diff = float(np.abs(np.stack(run.logits) - last_rows[: len(run.logits)]).max())
    assert diff <= LAVAPIPE_TOL, diff


def test_reading_webgpu_logits_leaves_python_free_while_the_device_works(tmp_path: Path):
    """A WebGPU run returns before the device has finished; ``OrtValue.numpy()`` then waits
    for it holding Python's GIL, which froze the studio's window and its Cancel for 10-20 s
    a token on lavapipe. The runner reads logits through :class:`HostReader`, whose session
    run waits with the GIL released: another Python thread keeps running meanwhile."""
    import threading
    import time

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from engine.runtime.device_io import device_value
    from engine.runtime.runner import HostReader
    from engine.runtime.session import create_session

    width, depth = 2048, 6  # about a second of lavapipe
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(depth):
        w = (rng.standard_normal((width, width)) / width**0.5).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
    shape = [1, 64, width]
    graph = helper.make_graph(
        [*nodes, helper.make_node("Identity", [x], ["y"])],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializer=weights,
    )
    onnx.save(helper.make_model(graph, ir_version=10), tmp_path / "chain.onnx")
    handle = create_session(tmp_path / "chain.onnx", "webgpu", profile_first_run=False)
    session = handle.session
    inputs = np.ones(shape, np.float32)
    outputs = device_value(np.zeros(shape, np.float32), handle.device)
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", device_value(inputs, handle.device))
    binding.bind_ortvalue_output("y", outputs)
    reader = HostReader("webgpu")
    session.run_with_iobinding(binding)
    expected = outputs.numpy()  # also compiles the pipelines

    def timed(read) -> tuple[float, float, np.ndarray]:
        """(seconds the read took, the longest another thread waited, what it read)."""
        gaps, done = [0.0], threading.Event()

        def tick() -> None:
            last = time.perf_counter()
            while not done.is_set():
                time.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        started = time.perf_counter()
        session.run_with_iobinding(binding)
        got = read(outputs)
        seconds = time.perf_counter() - started
        done.set()
        ticker.join()
        return seconds, max(gaps), got

    seconds, held, got = timed(lambda value: value.numpy())
    assert held > 0.5 * seconds  # the GIL held through the wait (the case this fixes)
    seconds, held, got = timed(reader.read)
    np.testing.assert_array_equal(got, expected[:, -1:])  # the last position, all it reads
    assert held < max(0.3 * seconds, 0.1), (held, seconds)
