"""The one-call CUDA side-by-side benchmark (issue 19) at toy size on the CPU EP, so it
cannot rot between device runs: every stage runs and lands in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._support.device_script import run_device_script


def test_tiny_cuda_side_by_side_runs_every_stage(tmp_path: Path):
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("transformers")
    args = ["--prompt-len", "16", "--long-prompt", "64", "--new-tokens", "6", "--repeats", "1"]
    args += ["--warmup", "0", "--short-length", "192", "--parity-steps", "8", "--budget-s", "500"]
    report = run_device_script("cuda_side_by_side", args, tmp_path, timeout=700)
    summary = report["summary"]
    runtime = json.loads(report["stages"]["environment"]["runtime"]["stdout"])
    assert "CPUExecutionProvider" in runtime["providers"]
    ours = {"ours_fp32", "ours_int4", "ours_int4_sym128", "ours_int8", "ours_fp16"}
    assert set(summary["exports"]) == ours
    for name in ("ours_int4", "ours_int4_sym128", "ours_int8", "ours_fp16"):
        export = summary["exports"][name]
        assert export["ok"] and export["peak_rss_gib"] > 0 and export["decoder_nodes"] > 100
        genai = summary["genai_decode_tok_s"][name]
        assert genai["capture_off@512"] > 0 and genai["capture_off@192"] > 0
        assert genai["capture_on"] == "the cpu EP has no graph capture"
        assert summary["genai_ttft_ms"][name]["capture_off@512"] > 0
        assert summary["prefill_long_prompt_tok_s"][name] > 0
    for name in ("ours_int4", "ours_fp16"):
        assert summary["runner_decode_tok_s"][name]["off"] > 0
    # fp32 equals transformers (toy model: 2e-6 seen); fp16 is close
    fp32, fp16 = summary["vs_transformers"]["ours_fp32"], summary["vs_transformers"]["ours_fp16"]
    assert fp32["max_abs_diff"] < 1e-4 and fp32["top1_agreement"] == "9/9"
    assert fp32["free_tokens_equal"] == 9 and fp32["provider"] == "CPUExecutionProvider"
    assert fp16["min_cosine"] > 0.99
    assert fp32["graph_capture"] == fp16["graph_capture"] == "off"  # the CPU EP has none
    assert len(report["stages"]["transformers"]["tokens"]) == 9  # the prefill's + 8 steps
    assert report["stages"]["export_mobius_fp16"]["skipped"]
    assert not (tmp_path / "work" / "checkpoint").exists()
    assert not any((tmp_path / "work").glob("ours-*")), "packages are deleted when done"
