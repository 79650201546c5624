"""The one-call WebGPU side-by-side benchmark, at toy size on the CPU, so it cannot rot
between device runs; and its profile summary on synthetic onnxruntime events."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

import side_by_side_stages as stages  # noqa: E402
import webgpu_side_by_side  # noqa: E402

from tests._support.device_script import run_device_script  # noqa: E402


def gpu_event(node: str, op: str, dur: float) -> dict:
    return {"cat": "Api", "name": f"{node}&{op}&{op}Program", "dur": dur}


def test_profile_summary_finds_one_decode_step_among_gpu_kernels():
    prefill = [gpu_event("embed", "Gather", 500), gpu_event("mm0", "MatMulNBits", 900)]
    step = [("embed", "Gather"), ("mm0", "MatMulNBits"), ("mm1", "MatMulNBits"), ("n", "Add")]
    events = [{"cat": "Session", "name": "model_run", "dur": 1}, *prefill]
    for i in range(4):
        events += [gpu_event(n, op, 10.0 + i) for n, op in step]
    summary = stages.summarize_steps(events, gpu=True, top=3)
    assert summary["available"] and summary["kernels_per_step"] == 4
    assert summary["steps_matched"] == 4
    assert summary["top_ops"][0]["op"] == "MatMulNBits"
    assert summary["top_ops"][0]["kernels_per_step"] == 2
    assert summary["us_per_step"] == pytest.approx(4 * 11.5)  # median of 10..13 per kernel


def test_profile_summary_counts_host_nodes_per_provider():
    events = []
    for _ in range(3):
        events += [
            {
                "cat": "Node",
                "name": "a_kernel_time",
                "dur": 5,
                "args": {"op_name": "MatMul", "provider": "WebGpuExecutionProvider"},
            },
            {
                "cat": "Node",
                "name": "b_kernel_time",
                "dur": 2,
                "args": {"op_name": "Cast", "provider": "CPUExecutionProvider"},
            },
            {"cat": "Node", "name": "b_fence_before", "dur": 0, "args": {}},
        ]
    summary = stages.summarize_steps(events, gpu=False, top=5)
    assert summary["kernels_per_step"] == 2
    assert summary["kernels_by_provider"] == {
        "WebGpuExecutionProvider": 1,
        "CPUExecutionProvider": 1,
    }
    assert not stages.summarize_steps(events, gpu=True, top=5)["available"]


def test_summary_lists_rows_whose_repeats_disagree():
    """A device run's capture-off repeats once spread 83-130 tok/s while its capture-on
    rows held: the summary names such rows (genai's and our runner's) instead of only
    printing a median; a row with an error instead of runs is not one."""

    def row(max_length: int, runs: list[float]) -> dict:
        return {
            "max_length": max_length,
            "decode_tokens_per_second": sorted(runs)[1],
            "decode_tokens_per_second_all": runs,
        }

    captures = {
        "off": {"default": row(4096, [129.68, 94.76, 83.41]), "1032": row(1032, [98, 100, 101])},
        "on": {"default": row(4096, [221.78, 219.41, 220.09])},
    }
    runner = {
        "off": {
            "decode_tokens_per_second": 129.7,
            "decode_tokens_per_second_runs": [124.4, 129.7, 170.1],
        },
        "on": {
            "decode_tokens_per_second": 222.9,
            "decode_tokens_per_second_runs": [221, 222.9, 224],
        },
    }
    stages_ = {
        "genai_ours_bf16": {"rc": 0, "result": {"captures": captures}},
        "genai_broken": {"rc": 1, "result": {"captures": {"on": {"error": "no CUDA"}}}},
        "runner_ours_int4": {"rc": 0, "result": runner},
    }
    summary = webgpu_side_by_side.summarize(stages_)
    assert summary["genai_decode_tok_s"]["ours_bf16"]["capture_on@4096"] == 220.09
    assert summary["unsteady"] == [
        "genai ours_bf16 capture_off@4096: 83.41-129.68",
        "runner ours_int4 off: 124.4-170.1",
    ]


def test_tiny_side_by_side_runs_every_stage(tmp_path: Path):
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    args = ["--prompt-len", "16", "--new-tokens", "6", "--repeats", "1", "--warmup", "0"]
    args += ["--profile-steps", "3", "--budget-s", "400"]
    report = run_device_script("webgpu_side_by_side", args, tmp_path, timeout=600)
    summary = report["summary"]
    for name in ("ours_fp16", "ours_int4"):
        export = summary["exports"][name]
        assert export["ok"] and export["peak_rss_gib"] > 0 and export["decoder_nodes"] > 100
        genai = summary["genai_decode_tok_s"][name]
        assert genai["capture_off@192"] > 0 and genai["capture_off@512"] > 0
        assert genai["capture_on"] == "the cpu EP has no graph capture"
        assert summary["runner_decode_tok_s"][name]["off"] > 0
    for label in ("default", "192"):
        profiled = summary[f"profile_ours_int4@{label}"]
        assert profiled["kind"] == "host time per node" and profiled["top_ops"]
    if "mobius_fp16" not in summary["exports"]:
        assert report["stages"]["export_mobius_fp16"]["skipped"]
    assert not (tmp_path / "work" / "checkpoint").exists()
    assert not any((tmp_path / "work").glob("ours-*")), "packages are deleted when done"
