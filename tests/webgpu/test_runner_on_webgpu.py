"""Our runner on the WebGPU EP: every node on it, graph capture equal to no capture.

Runs in the main test run through the onnxruntime-ep-webgpu plugin (or in onnxruntime-webgpu
1.27's environment: ``.venv-webgpu/bin/python -m pytest tests/webgpu``). The
package is the gemma4-tiny preset: sliding and full layers, KV-shared layers, a window
shorter than the runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests._support.webgpu import require_webgpu

pytestmark = [pytest.mark.webgpu]
PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_webgpu()
    from engine.options import ExportOptions
    from engine.pipeline import export

    root = tmp_path_factory.mktemp("webgpu")
    options = ExportOptions(ep="webgpu", dtype="fp32", random_weights=True)
    return export(root / "pkg", preset="gemma4-tiny", options=options).output


def test_every_node_runs_on_webgpu(package: Path):
    from engine.runtime.runner import Runner

    runner = Runner(package)
    runner.generate(PROMPT, 4)
    assert runner.placement is not None and runner.placement.all_on_requested
    assert runner.provider == "WebGpuExecutionProvider"


def test_capture_equals_no_capture_and_survives_reuse(package: Path):
    from engine.errors import OptionsError
    from engine.runtime.generation import compare
    from engine.runtime.runner import Runner, RunnerOptions

    plain = Runner(package, RunnerOptions(max_length=64)).generate(PROMPT, 24, keep_logits=True)
    with pytest.raises(OptionsError, match="static buffers"):
        Runner(package, RunnerOptions(kv_mode="growing"))  # K/V are scattered into buffers
    captured = Runner(package, RunnerOptions(graph_capture=True, max_length=64))
    first = captured.generate(PROMPT, 24, keep_logits=True)
    other = captured.generate(PROMPT[::-1], 24)  # replays with other inputs in the buffers
    again = captured.generate(PROMPT, 24, keep_logits=True)
    for run in (first, again):
        agreement = compare(plain, run)
        assert agreement.same_tokens, agreement
        assert agreement.max_abs_logit_diff is not None and agreement.max_abs_logit_diff <= 1e-3
    assert other.tokens != first.tokens
    assert np.array_equal(first.logits[-1], again.logits[-1])


def test_bench_capture_pair_is_validated(package: Path):
    from engine.runtime.bench import BenchConfig, compare_capture

    comparison = compare_capture(package, BenchConfig(prompt_length=16, new_tokens=12))
    assert comparison.error is None and comparison.on is not None
    assert comparison.validated and comparison.speedup is not None
    assert comparison.on.provider == "WebGpuExecutionProvider"
