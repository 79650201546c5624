"""Multimodal Gemma 4 packages on WebGPU: every node of every session (vision, speech,
embedding, decoder) on the WebGPU EP, run end to end through onnxruntime-genai 0.18 with an
image and a clip, greedy tokens equal to the CPU package's.

tests/webgpu/run_genai_media.py drives genai in a child process: the ``--ep webgpu`` package
on the WebGPU EP (the plugin, registered with genai; lavapipe or a GPU; CPU fallback disabled
in every session, so genai's load fails if any node would leave the device) and the ``--ep
cpu`` package. A WebGPU runtime is required: without one these tests FAIL and say what to
install (tests/engine/test_webgpu.py).

One image per prompt: genai 0.18 crashes (segfault in ``Gemma4VisionState::Run``) when a
prompt has two images and the vision session runs on WebGPU
(``test_two_images_crash_genai_when_vision_runs_on_webgpu``); the engine refuses such a
prompt with the reason (``EpCapabilities.genai_max_images``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from engine.audit import audit_model
from engine.caps import get_caps
from engine.errors import OptionsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.media import MediaPrompt
from engine.runtime.package import open_package
from tests._support.media import write_png, write_wav
from tests._support.tiny_gemma_mm import TOKENS, make_mm_checkpoint
from tests.engine import test_webgpu

pytestmark = pytest.mark.webgpu

webgpu_env = test_webgpu.webgpu_env
"""The checked WebGPU python (shared with tests/engine/test_webgpu.py)."""

RUNNER = test_webgpu.REPO / "tests" / "webgpu" / "run_genai_media.py"
STEPS = 12
LAVAPIPE_TOL = 1e-3
"""Max |logit diff| WebGPU fp32 vs the CPU package (measured on lavapipe: 7e-5)."""
SESSIONS = ("vision", "speech", "embedding", "decoder")


@dataclass(frozen=True)
class Built:
    media: dict[str, Path]
    packages: dict[tuple[str, str, str], Path]
    """(case, ep, dtype) -> package folder."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("mm_webgpu")
    media = {
        "image": write_png(root / "image.png", 48, 48, seed=3),
        "tall": write_png(root / "tall.png", 48, 96, seed=2),
        "clip": write_wav(root / "clip.wav", 0.5),
    }
    packages = {}
    for case, audio in (("base", True), ("vision_only", False)):
        checkpoint = root / f"ckpt-{case}"
        make_mm_checkpoint(checkpoint, audio=audio)
        builds = [("webgpu", "fp32"), ("cpu", "fp32")]
        builds += [("webgpu", "fp16")] if case == "base" else []
        for ep, dtype in builds:
            out = root / f"{case}-{ep}-{dtype}"
            export(out, model_dir=checkpoint, options=ExportOptions(ep=ep, dtype=dtype))
            packages[case, ep, dtype] = out
    return Built(media, packages)


def run_genai(
    python: Path, package: Path, work: Path, media: list[Path], *extra: str
) -> dict[str, Any]:
    """tests/webgpu/run_genai_media.py's report (logits under ``"logits"``)."""
    work.mkdir(parents=True, exist_ok=True)
    report_path, logits = work / "report.json", work / "logits.npy"
    args = [str(python), str(RUNNER), str(package), "--json-out", str(report_path)]
    for path in media:
        args += ["--audio" if path.suffix == ".wav" else "--image", str(path)]
    args += ["--steps", str(STEPS), "--save-logits", str(logits), *extra]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=600,
        env=test_webgpu._clean_env(),
        cwd=test_webgpu.REPO,
    )
    if not report_path.exists():
        pytest.fail(
            f"{' '.join(args)} exited {done.returncode} without a report\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        )
    report = json.loads(report_path.read_text())
    if "error" not in report:
        report["logits"] = np.load(logits)
    return report


def assert_all_on_webgpu(report: dict[str, Any], sessions: tuple[str, ...]) -> None:
    assert "error" not in report, {k: report.get(k) for k in ("error", "placement")}
    assert tuple(report["sessions"]) == sessions
    for session in sessions:
        placement = report["placement"][session]
        assert list(placement["nodes_by_provider"]) == ["WebGpuExecutionProvider"], (
            session,
            placement,
        )
        assert placement["cpu_nodes"] == [] and placement["kernel_not_found"] == [], placement


def media_of(built: Built, case: str) -> list[Path]:
    return [built.media["image"], built.media["clip"]] if case == "base" else [built.media["image"]]


@pytest.fixture(scope="module")
def cpu_runs(built: Built, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The CPU packages through genai in this environment: the reference tokens."""
    root = tmp_path_factory.mktemp("cpu_runs")
    runs = {}
    for case in ("base", "vision_only"):
        package = built.packages[case, "cpu", "fp32"]
        runs[case] = run_genai(Path(sys.executable), package, root / case, media_of(built, case))
        assert "error" not in runs[case], runs[case]
    return runs


@pytest.mark.parametrize(
    ("case", "sessions"),
    [("base", SESSIONS), ("vision_only", ("vision", "embedding", "decoder"))],
)
def test_every_session_on_webgpu_and_tokens_equal_the_cpu_package(
    built: Built,
    cpu_runs: dict[str, dict],
    webgpu_env: Path,
    tmp_path: Path,
    case: str,
    sessions: tuple[str, ...],
) -> None:
    package = built.packages[case, "webgpu", "fp32"]
    report = run_genai(webgpu_env, package, tmp_path, media_of(built, case), "--strict")
    assert_all_on_webgpu(report, sessions)
    reference = cpu_runs[case]
    assert report["prompt"] == reference["prompt"]
    assert TOKENS["image_token_id"] in report["prompt"]
    assert (TOKENS["audio_token_id"] in report["prompt"]) == (case == "base")
    assert report["argmax_equals_tokens"] and reference["argmax_equals_tokens"]
    diffs = np.abs(report["logits"] - reference["logits"]).max(axis=1)
    print(json.dumps({case: {"max_diff_per_step": diffs.tolist(), "tokens": report["tokens"]}}))
    assert report["tokens"] == reference["tokens"]
    assert len(report["tokens"]) == STEPS
    assert diffs.max() <= LAVAPIPE_TOL, diffs


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_decoder_capture_is_bit_identical_to_no_capture(
    built: Built, webgpu_env: Path, tmp_path: Path, dtype: str
) -> None:
    """The package turns capture on for the decoder (and only there); genai replays the
    captured decode step and gets the same logits, bit for bit, as without capture."""
    package = built.packages["base", "webgpu", dtype]
    config = json.loads((package / "genai_config.json").read_text())["model"]
    capture = {
        s: config[s]["session_options"]["provider_options"][0]["webgpu"]["enableGraphCapture"]
        for s in SESSIONS
    }
    assert capture == {"vision": "0", "speech": "0", "embedding": "0", "decoder": "1"}
    media = media_of(built, "base")
    on = run_genai(webgpu_env, package, tmp_path / "on", media, "--strict")
    off = run_genai(webgpu_env, package, tmp_path / "off", media, "--strict", "--capture", "off")
    assert_all_on_webgpu(on, SESSIONS)
    assert_all_on_webgpu(off, SESSIONS)
    assert on["capture"]["decoder_took_capture"] and not off["capture"]["decoder_took_capture"]
    # The prompt step runs uncaptured, the first decode step is captured, the rest replay.
    assert on["capture"]["replays"] == STEPS - 2 and off["capture"]["replays"] == 0
    assert on["tokens"] == off["tokens"]
    np.testing.assert_array_equal(on["logits"], off["logits"])


def test_two_images_crash_genai_when_vision_runs_on_webgpu(
    built: Built, webgpu_env: Path, tmp_path: Path
) -> None:
    """onnxruntime-genai 0.18 encodes several images one at a time into slices of one
    ``image_features`` buffer by pointer arithmetic on the buffer's data; a WebGPU buffer
    is a handle, not an address, and the process dies (SIGSEGV) at ``set_inputs``. The same
    prompt works on the CPU package. This test says when a genai release fixes it."""
    package = built.packages["vision_only", "webgpu", "fp32"]
    args = [str(webgpu_env), str(RUNNER), str(package), "--json-out", str(tmp_path / "r.json")]
    args += ["--image", str(built.media["image"]), "--image", str(built.media["tall"])]
    done = subprocess.run(
        [*args, "--steps", "2"], capture_output=True, timeout=600, env=test_webgpu._clean_env()
    )
    assert done.returncode == -11, (done.returncode, done.stderr[-2000:])


def test_two_images_on_a_webgpu_package_are_refused_before_genai_runs(built: Built) -> None:
    """The engine's genai paths (bench, verify) check the prompt first: one clear error
    instead of the crash above; the CPU package takes both images."""
    images = (str(built.media["image"]), str(built.media["tall"]))
    prompt = MediaPrompt.build(None, images)
    with pytest.raises(OptionsError, match="give one image per prompt"):
        prompt.check(open_package(built.packages["vision_only", "webgpu", "fp32"]))
    prompt.check(open_package(built.packages["vision_only", "cpu", "fp32"]))
    MediaPrompt.build(None, images[:1]).check(
        open_package(built.packages["vision_only", "webgpu", "fp32"])
    )


def test_webgpu_embedding_equals_the_cpu_lowering(built: Built) -> None:
    """The WebGPU embedding session counts markers in float32 (1.27 has no int32 CumSum);
    on the CPU EP it gives the CPU package's embeddings bit for bit, markers and all."""
    webgpu = built.packages["base", "webgpu", "fp32"] / "embedding.onnx"
    cpu = built.packages["base", "cpu", "fp32"] / "embedding.onnx"
    assert audit_model(ir.load(webgpu), get_caps("webgpu"), "embedding").findings == ()
    image, audio, video = (
        TOKENS[k] for k in ("image_token_id", "audio_token_id", "video_token_id")
    )
    rng = np.random.default_rng(0)
    cases = {
        "prompt": ([[5, image, image, 7, audio, audio, audio, 9, video]], 2, 3),
        "fewer_rows_than_markers": ([[image, 5, image, audio]], 1, 0),
        "decode_step": ([[image]], 0, 0),
        "batch_of_two": ([[image, 4, audio], [6, image, image]], 3, 1),
    }
    sessions = {
        name: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for name, path in (("webgpu", webgpu), ("cpu", cpu))
    }
    for case, (ids, images, audios) in cases.items():
        features = {
            "image_features": rng.normal(size=(images, 64)).astype(np.float32),
            "audio_features": rng.normal(size=(audios, 64)).astype(np.float32),
        }
        outputs = {}
        for name, session in sessions.items():
            dtype = np.int64 if session.get_inputs()[0].type == "tensor(int64)" else np.int32
            feeds = {"input_ids": np.array(ids, dtype), **features}
            outputs[name] = session.run(None, feeds)
        for got, want in zip(outputs["webgpu"], outputs["cpu"], strict=True):
            np.testing.assert_array_equal(got, want, err_msg=case)
