"""The one-call multimodal E2B benchmark at toy size on the CPU, so it cannot rot between
device runs: it drives ``python -m engine build`` and ``python -m engine bench --image
--audio`` through onnxruntime-genai on a tiny multimodal checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tiny_multimodal_bench_reports_every_session_and_prompt(tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "device" / "multimodal_e2b.py"
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    cmd = [sys.executable, str(script), "--tiny", "--work", str(tmp_path / "work")]
    cmd += ["--repeats", "1", "--new-tokens", "6"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "multimodal_e2b.json").read_text())
    summary = report["summary"]
    assert summary["export"]["ok"], report["stages"]["export"]
    sessions = summary["export"]["session_bytes"]
    assert set(sessions) == {"vision", "speech", "embedding", "decoder"}
    assert all(size > 0 for size in sessions.values())
    lengths = {}
    for prompt in ("image_audio", "image", "text"):
        row = summary[prompt]
        assert isinstance(row, dict), row  # the stage's stderr when it failed
        run = row["capture_off"]
        assert run["ttft_s"] > 0 and run["decode_tok_s"] > 0
        lengths[prompt] = run["prompt_tokens"]
    # The media prompts' lengths are what genai's processor made of them: the image's
    # soft tokens, then the clip's on top; the text prompt is the 128 random ids asked for.
    assert lengths["text"] == 128
    assert lengths["image_audio"] > lengths["image"] > 20
    assert not (tmp_path / "work" / "checkpoint").exists()  # deleted after the export
