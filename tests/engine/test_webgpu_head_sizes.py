"""Gemma 4 E2B's head sizes (256 sliding, 512 global) on WebGPU, at toy width (hidden 64):
fp32 runs and matches transformers; fp16's graph is as precise as the CPU fp16 package.
fp32 and capture run with two KV heads (as E4B: the scores an Einsum) and with one (as E2B:
the scores a Gemm with the mask as its C).

Each fp16 comparison is teacher-forced on transformers' greedy tokens over four prompts
(11 tokens, then 24 decode steps past the 8-token window) and measured as the mean over
steps of max |logit - transformers' logit|: Gemma 4's attention scale 1.0 over RMS-normed
q/k makes scores large, so any error upstream is amplified and one prompt is too noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from tests.engine.test_webgpu import CAPTURE_TOL, REPO, RUNNER, run_webgpu, webgpu_env

pytestmark = pytest.mark.webgpu
__all__ = ["webgpu_env"]  # the fixture, imported for these tests

HEAD_SIZES = {"head_dim": 256, "global_head_dim": 512}
STEPS = 24
MAX_LENGTH = 64
FP32_TOL = 2e-3
"""Max |logit diff| vs transformers for fp32 on lavapipe (measured 7.8e-4)."""


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    fixed = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77]
    return [fixed] + [[int(t) for t in rng.integers(4, 300, 11)] for _ in range(3)]


def _wide(tmp_path_factory: pytest.TempPathFactory, kv_heads: int) -> dict[str, Any]:
    """A toy Gemma 4 with E2B's head sizes and transformers' greedy runs of every prompt."""
    from tests._support.tiny_gemma import hf_greedy, make_checkpoint

    root = tmp_path_factory.mktemp(f"wide_heads_kv{kv_heads}")
    model = make_checkpoint(root / "ckpt", num_key_value_heads=kv_heads, **HEAD_SIZES)
    references = []
    for prompt in _prompts():
        tokens, logits = hf_greedy(model, prompt, STEPS)
        rows = np.stack([logits[0][-1], *(step[-1] for step in logits[1:])])
        references.append({"prompt": prompt, "tokens": tokens, "rows": rows})
    return {"root": root, "checkpoint": root / "ckpt", "references": references}


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two KV heads (four query heads): attention scores as an Einsum."""
    return _wide(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def wide_one_kv_head(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One KV head, as E2B: attention scores as a Gemm."""
    return _wide(tmp_path_factory, 1)


BOTH = pytest.mark.parametrize("model", ["wide", "wide_one_kv_head"])


def _package(wide: dict[str, Any], ep: str, dtype: str) -> Path:
    out = wide["root"] / f"{ep}-{dtype}"
    if not out.exists():
        export(out, model_dir=wide["checkpoint"], options=ExportOptions(ep=ep, dtype=dtype))
    return out


def _forced(
    python: Path, package: Path, reference: dict[str, Any], runs: str, work: Path, provider: str
) -> dict[str, Any]:
    """run_package.py teacher-forced on transformers' tokens; the report with its logits."""
    args = [
        str(package),
        "--provider",
        provider,
        "--prompt",
        ",".join(map(str, reference["prompt"])),
        "--steps",
        str(STEPS),
        "--max-length",
        str(MAX_LENGTH),
        "--runs",
        runs,
        "--force",
        ",".join(map(str, reference["tokens"])),
        "--save-logits",
        str(work / "logits.npz"),
    ]
    if provider == "webgpu":
        report = run_webgpu(python, args, work / "report.json")
    else:
        out = work / "report.json"
        subprocess.run(
            [str(python), str(RUNNER), *args, "--json-out", str(out)], check=True, cwd=REPO
        )
        report = json.loads(out.read_text())
    report["logits"] = dict(np.load(work / "logits.npz"))
    return report


def _error(
    python: Path, package: Path, wide: dict[str, Any], work: Path, provider: str
) -> dict[str, float]:
    """Mean over prompts of the mean-over-steps max |logit diff|, and top-1 agreements."""
    means, agree = [], 0
    for reference in wide["references"]:
        report = _forced(python, package, reference, "plain:dynamic", work, provider)
        run = report["runs"]["plain:dynamic"]
        assert "error" not in run, run["error"]
        rows = report["logits"]["plain_dynamic"]
        means.append(float(np.abs(rows - reference["rows"]).max(axis=1).mean()))
        agree += int((rows.argmax(axis=1) == reference["rows"].argmax(axis=1)).sum())
    return {"mean": float(np.mean(means)), "top1": agree}


@BOTH
def test_fp32_runs_at_e2b_head_sizes_with_and_without_capture(model, request, webgpu_env, tmp_path):
    """onnxruntime-webgpu 1.27's GroupQueryAttention cannot build its fp32 prefill pipeline
    at head size 512 (64 KiB of workgroup storage); the static-buffer lowering has none."""
    wide = request.getfixturevalue(model)
    package = _package(wide, "webgpu", "fp32")
    reference = wide["references"][0]
    report = _forced(
        webgpu_env, package, reference, "capture:static,plain:dynamic", tmp_path, "webgpu"
    )
    placement = report["placement"]
    assert placement["strict_ok"] and placement["cpu_nodes"] == [], placement
    for name in ("capture:static", "plain:dynamic"):
        run = report["runs"][name]
        assert "error" not in run, run["error"]
        rows = report["logits"][name.replace(":", "_")]
        diffs = np.abs(rows - reference["rows"]).max(axis=1)
        assert diffs.max() <= FP32_TOL, f"{name} vs transformers per step: {diffs.tolist()}"
        assert (rows.argmax(axis=1) == reference["rows"].argmax(axis=1)).all()
    capture = report["runs"]["capture:static"]["capture_log"]
    assert capture["session_uses_capture"] and capture["replays"] == STEPS - 1, capture
    pair = report["logit_diff_between_runs"]
    assert max(next(iter(pair.values()))) <= CAPTURE_TOL, pair


@BOTH
def test_fp16_capture_equals_no_capture_at_e2b_head_sizes(model, request, webgpu_env, tmp_path):
    wide = request.getfixturevalue(model)
    package = _package(wide, "webgpu", "fp16")
    report = _forced(
        webgpu_env,
        package,
        wide["references"][0],
        "capture:static,plain:dynamic",
        tmp_path,
        "webgpu",
    )
    assert report["placement"]["strict_ok"], report["placement"]
    for name in ("capture:static", "plain:dynamic"):
        assert "error" not in report["runs"][name], report["runs"][name]
    assert report["runs"]["capture:static"]["capture_log"]["session_uses_capture"]
    pair = report["logit_diff_between_runs"]
    assert max(next(iter(pair.values()))) <= CAPTURE_TOL, pair


def test_fp16_webgpu_graph_is_as_precise_as_the_cpu_fp16_package(wide, tmp_path):
    """The WebGPU fp16 graph on the CPU EP (the EP's kernels aside) against the CPU fp16
    package (GroupQueryAttention): its fp32 attention core and fp32 KV buffers keep it at
    least as close to transformers (measured mean 0.099 vs 0.123, top-1 94 vs 87 of 100)."""
    python = Path(sys.executable)
    graph = _error(python, _package(wide, "webgpu", "fp16"), wide, tmp_path, "cpu")
    cpu = _error(python, _package(wide, "cpu", "fp16"), wide, tmp_path, "cpu")
    print(json.dumps({"webgpu_graph_on_cpu_ep": graph, "cpu_package": cpu}))
    assert graph["mean"] <= cpu["mean"], (graph, cpu)
    assert graph["top1"] >= cpu["top1"], (graph, cpu)


@pytest.mark.xfail(
    strict=True,
    reason="the WebGPU EP accumulates fp16 MatMul in fp16, onnxruntime-webgpu 1.27 and the "
    "0.4.0 plugin alike (70-80x the fp16 rounding error at K = 2048-12288, measured one-op; "
    "no fp32-accumulation option): on 1.27 mean 0.36 vs the CPU package's 0.12, top-1 70 vs "
    "87 of 100",
)
def test_fp16_on_webgpu_is_as_precise_as_the_cpu_fp16_package(wide, webgpu_env, tmp_path):
    webgpu = _error(webgpu_env, _package(wide, "webgpu", "fp16"), wide, tmp_path, "webgpu")
    cpu = _error(Path(sys.executable), _package(wide, "cpu", "fp16"), wide, tmp_path, "cpu")
    print(json.dumps({"webgpu": webgpu, "cpu_package": cpu}))
    assert webgpu["mean"] <= 1.25 * cpu["mean"], (webgpu, cpu)
