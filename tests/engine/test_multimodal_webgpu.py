"""A multimodal package's decoder (inputs_embeds and per-layer inputs from the embedding
session) with the WebGPU lowering: every decoder node on the WebGPU EP (lavapipe), and
genai's greedy tokens over an image + audio prompt equal to the CPU package's, capture on
and off. The prompt outlasts the tiny model's 8-token sliding window many times over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import ExportOptions, export
from tests._support.media import write_png, write_wav
from tests._support.tiny_gemma_mm import make_mm_checkpoint
from tests.engine.test_webgpu import CAPTURE_TOL, LAVAPIPE_TOL, REPO, _clean_env, webgpu_env

pytestmark = pytest.mark.webgpu
__all__ = ["webgpu_env"]  # the fixture, imported for these tests

RUN_MEDIA = REPO / "tests" / "webgpu" / "run_media.py"
STEPS = 12


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mm_webgpu")
    model_dir = root / "ckpt"
    make_mm_checkpoint(model_dir)
    media = {
        "image": write_png(root / "wide.png", 120, 64, seed=1),
        "audio": write_wav(root / "clip.wav", 1.2),
    }
    built = {
        ep: export(root / ep, model_dir=model_dir, options=ExportOptions(ep=ep, dtype="fp32"))
        for ep in ("webgpu", "cpu")
    }
    assert built["webgpu"].capture["decoder"], built["webgpu"].capture
    return {"root": root, "media": media, **{ep: r.output for ep, r in built.items()}}


def _run(python: Path, package: Path, media: dict[str, Path], ep: str, capture: int, work: Path):
    work.mkdir(parents=True, exist_ok=True)
    out, logits = work / "report.json", work / "logits.npz"
    cmd = [
        str(python),
        str(RUN_MEDIA),
        str(package),
        "--ep",
        ep,
        "--image",
        str(media["image"]),
        "--audio",
        str(media["audio"]),
        "--steps",
        str(STEPS),
        "--capture",
        str(capture),
        "--json-out",
        str(out),
        "--save-logits",
        str(logits),
    ]
    env = _clean_env() if ep == "webgpu" else None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    if not out.exists():
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}\n{done.stderr[-4000:]}")
    report = json.loads(out.read_text())
    assert "error" not in report, report["error"]
    report["logits"] = np.load(logits)["logits"]
    return report


def test_multimodal_decoder_on_webgpu_matches_the_cpu_package(packages, webgpu_env, tmp_path):
    cpu = _run(Path(sys.executable), packages["cpu"], packages["media"], "cpu", 0, tmp_path / "c")
    runs = {
        capture: _run(
            webgpu_env,
            packages["webgpu"],
            packages["media"],
            "webgpu",
            capture,
            tmp_path / f"w{capture}",
        )
        for capture in (0, 1)
    }
    for capture, run in runs.items():
        assert run["decoder_on_webgpu"] is True, run["decoder_on_webgpu"]
        assert run["provider"] == "WebGpuExecutionProvider"
        assert run["tokens"] == cpu["tokens"], (capture, run["tokens"], cpu["tokens"])
        diff = float(np.abs(run["logits"] - cpu["logits"]).max())
        assert diff <= LAVAPIPE_TOL, (capture, diff)
    # Measured on lavapipe: 4e-5 from the CPU package, capture on == off bit for bit.
    between = float(np.abs(runs[0]["logits"] - runs[1]["logits"]).max())
    assert between <= CAPTURE_TOL, between
