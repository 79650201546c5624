"""Mixture-of-experts packages on the WebGPU EP (lavapipe or a GPU): every node on the
WebGPU EP, graph capture taken and equal to the runs without it, tokens equal to the CPU
package's, past the sliding window. And what the EP's fused QMoE can run.

Packages are built here and run in a child process by tests/webgpu/run_package.py,
as tests/engine/test_webgpu.py does for dense models (same environment, same tolerances).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_moe import TinyMoeModels
from tests.engine.test_webgpu import (  # the WebGPU environment and its checks
    CAPTURE_TOL,
    LAVAPIPE_TOL,
    MAX_LENGTH,
    REPO,
    _clean_env,
    _setup_hint,
    run_webgpu,
    webgpu_python,
)

pytestmark = pytest.mark.webgpu

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
STEPS = 20
RUNS = "capture:static,plain:dynamic,plain:static"

CASES = {
    # top-2 of 8 experts with an odd width, k == v full layers, window 4
    "moe_top2-fp32": ("moe_top2", dict(dtype="fp32")),
    # 4-bit experts and embeddings (GatherBlockQuantized on the WebGPU EP), fp32 activations
    "moe_quant-int4": (
        "moe_quant",
        dict(dtype="fp32", weight_bits=4, embedding_bits=4, block_size=16),
    ),
    # the same experts split along their rows under a 16 KiB buffer limit
    "moe_quant-int8-split": (
        "moe_quant",
        dict(dtype="fp32", weight_bits=8, block_size=16, max_buffer_size=16384, force=True),
    ),
}


@pytest.fixture(scope="module")
def webgpu_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WebGPU python with a working adapter (required: without it these tests fail)."""
    python = webgpu_python()
    if not python.exists():
        pytest.fail(f"{python} does not exist: {_setup_hint(python)}")
    report = run_webgpu(python, ["probe"], tmp_path_factory.mktemp("probe") / "probe.json")
    if not report.get("adapter_ok"):
        pytest.fail(f"{_setup_hint(python)}\nprobe said: {json.dumps(report, indent=1)}")
    return python


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> TinyMoeModels:
    return TinyMoeModels(tmp_path_factory.mktemp("moe_webgpu_models"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_package_runs_on_webgpu_with_capture(
    moe_models: TinyMoeModels, webgpu_env: Path, tmp_path: Path, case: str
):
    name, options = CASES[case]
    model_dir, _ = moe_models.get(name)
    webgpu = export(
        tmp_path / "webgpu", model_dir=model_dir, options=ExportOptions(ep="webgpu", **options)
    )
    cpu_options = {k: v for k, v in options.items() if k not in ("max_buffer_size", "force")}
    cpu = export(
        tmp_path / "cpu",
        model_dir=model_dir,
        options=ExportOptions(ep="cpu", accuracy_level=0, **cpu_options),
    )
    assert webgpu.graph_capture, webgpu.notes
    if "split" in case:
        assert webgpu.plan.decoder.weight("layers.0.experts.gate_up_proj").is_split

    ref_tokens, ref_logits = ort_greedy(cpu.output, PROMPT, STEPS)
    ref_rows = np.stack([ref_logits[0][-1], *(step[-1] for step in ref_logits[1:])])
    args = [
        str(webgpu.output),
        "--prompt",
        ",".join(map(str, PROMPT)),
        "--steps",
        str(STEPS),
        "--max-length",
        str(MAX_LENGTH),
        "--runs",
        RUNS,
        "--save-logits",
        str(tmp_path / "logits.npz"),
    ]
    report = run_webgpu(webgpu_env, args, tmp_path / "report.json")
    logits = dict(np.load(tmp_path / "logits.npz"))

    placement = report["placement"]
    assert placement["strict_ok"], placement.get("strict_error")
    assert placement["cpu_nodes"] == [], placement
    assert list(placement["nodes_by_provider"]) == ["WebGpuExecutionProvider"], placement
    graph = onnx.load(str(webgpu.output / "model.onnx"), load_external_data=False).graph
    ops = {node.op_type for node in graph.node}
    assert {"TopK", "Softmax", "MatMul"} <= ops
    assert ("GatherBlockQuantized" in ops) == ("weight_bits" in options)

    capture = report["runs"]["capture:static"]
    assert "error" not in capture, capture["error"]
    assert capture["capture_log"]["session_uses_capture"], capture["capture_log"]
    assert capture["capture_log"]["replays"] == STEPS - 1
    for run in ("plain:dynamic", "plain:static"):
        assert "error" not in report["runs"][run], report["runs"][run]
        pair = report["logit_diff_between_runs"]
        diff = pair.get(f"capture:static vs {run}") or pair[f"{run} vs capture:static"]
        assert max(diff) <= CAPTURE_TOL, f"capture vs {run}: {diff}"
    diffs = np.abs(logits["capture_static"] - ref_rows).max(axis=1)
    print(f"{case}: max |logit diff| vs the CPU package {diffs.max():.2e}")
    assert diffs.max() <= LAVAPIPE_TOL, diffs.tolist()
    assert capture["tokens"][:STEPS] == ref_tokens


def test_webgpu_qmoe_runs_swiglu_only(webgpu_env: Path):
    """The WebGPU EP's fused QMoE (onnxruntime-webgpu 1.27 and the 0.4.0 plugin) refuses
    Gemma 4's GELU-gated experts (tests/webgpu/moe_ops.py)."""
    done = subprocess.run(
        [str(webgpu_env), str(REPO / "tests" / "webgpu" / "moe_ops.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
        cwd=REPO,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["swiglu interleaved"] == "ok", report
    assert "Unsupported MoE activation type: geglu" in report["geglu fused [gate|up]"]
    assert "Unsupported MoE activation type: geglu" in report["geglu interleaved"]
    assert "only swiglu is supported" in report["gelu (ungated)"]
