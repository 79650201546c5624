"""bench / verify / plan refuse inputs they cannot run before any work, in one line that
says what to do, with exit code 2: clip lengths, image shapes, lengths, counts, damaged
package files (issue 22)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from engine.errors import OptionsError, PackageError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.bench import BenchConfig, run_bench
from engine.runtime.limits import MAX_REPEATS, max_threads
from engine.runtime.media import MediaPrompt
from engine.runtime.media_fit import resized_grid
from engine.runtime.package import open_package
from engine.runtime.verify_media import verify_media
from tests._support.cli import ROOT, cli
from tests._support.media import write_png
from tests._support.tiny_gemma_mm import make_mm_checkpoint

LIMIT = 32
"""Positions of the text package (prompt and generation together)."""


@pytest.fixture(scope="module")
def text(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    model_dir, _ = tiny_models.get("all_features")
    out = tmp_path_factory.mktemp("checks") / "text"
    export(out, model_dir=model_dir, options=ExportOptions(ep="cpu", max_length=LIMIT))
    return {"model": model_dir, "package": out}


@pytest.fixture(scope="module")
def mm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checks_mm")
    make_mm_checkpoint(root / "ckpt")
    export(root / "pkg", model_dir=root / "ckpt", options=ExportOptions(ep="cpu"))
    return {"model": root / "ckpt", "package": root / "pkg", "root": root}


def _wav(path: Path, samples: int, rate: int = 16_000) -> Path:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        noise = np.random.default_rng(0).normal(0, 3000, samples)
        f.writeframes(noise.astype("<i2").tobytes())
    return path


def _refused(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    """Exit code 2, one error line, no traceback, every part in it."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]


# ----------------------------------------------------------------------------- audio


@pytest.mark.parametrize(
    ("samples", "rate", "least"),
    [(0, 16_000, 161), (100, 16_000, 161), (160, 16_000, 161), (441, 44_100, 442)],
)
def test_bench_refuses_a_clip_too_short_for_the_audio_processor(
    mm: dict[str, Path], tmp_path: Path, samples: int, rate: int, least: int
) -> None:
    # genai's log-mel makes no frame of one hop (10 ms) or less and divides by the frame
    # count: before this check the process died of SIGFPE (exit 136), printing nothing.
    clip = _wav(tmp_path / "short.wav", samples, rate)
    result = cli("bench", str(mm["package"]), "--audio", str(clip), "--quiet")
    _refused(result, str(clip), f"{samples} samples at {rate} Hz", f"at least {least} samples")


def test_verify_refuses_a_clip_too_short_for_the_audio_processor(
    mm: dict[str, Path], tmp_path: Path
) -> None:
    clip = _wav(tmp_path / "short.wav", 100)
    args = ("verify", str(mm["package"]), "--model", str(mm["model"]), "--audio", str(clip))
    _refused(cli(*args, "--quiet"), str(clip), "at least 161 samples", "give a longer clip")


def test_the_shortest_clip_allowed_runs_and_matches_transformers(
    mm: dict[str, Path], tmp_path: Path
) -> None:
    # 161 samples make one log-mel frame; the speech session and transformers take it.
    media = MediaPrompt.build("listen", (), (str(_wav(tmp_path / "one_frame.wav", 161)),))
    result = verify_media(mm["package"], mm["model"], media, steps=3)
    assert result.passed, result.reasons
    resampled = MediaPrompt.build(None, (), (str(_wav(tmp_path / "44k.wav", 442, 44_100)),))
    config = BenchConfig(runtime="genai", media=resampled, new_tokens=2, repeats=1, warmup=0)
    assert len(run_bench(mm["package"], config)[0].tokens) == 2


def test_the_shortest_clip_follows_the_processor_frame_length(
    mm: dict[str, Path], tmp_path: Path
) -> None:
    # The limit is half a frame, not a hop: with 32 ms frames and 8 ms hops genai dies
    # of SIGFPE at 256 samples and runs 257.
    package = tmp_path / "pkg"
    shutil.copytree(mm["package"], package)
    config_file = package / "audio_processor_config.json"
    config = json.loads(config_file.read_text())
    mel = config["feature_extraction"]["sequence"][1]["operation"]["attrs"]
    mel.update(frame_length_ms=32.0, hop_length_ms=8.0)
    config_file.write_text(json.dumps(config))
    clip = _wav(tmp_path / "short.wav", 256)
    result = cli("bench", str(package), "--audio", str(clip), "--quiet")
    _refused(result, "more than 16 ms (at least 257 samples at 16000 Hz)")
    media = MediaPrompt.build(None, (), (str(_wav(tmp_path / "enough.wav", 257)),))
    bench = BenchConfig(runtime="genai", media=media, new_tokens=2, repeats=1, warmup=0)
    assert len(run_bench(package, bench)[0].tokens) == 2


def test_a_clip_below_the_processor_rate_is_refused_up_front(
    mm: dict[str, Path], tmp_path: Path
) -> None:
    clip = _wav(tmp_path / "8k.wav", 8000, 8000)  # genai: "only down-sampling supported"
    result = cli("bench", str(mm["package"]), "--audio", str(clip), "--quiet")
    _refused(result, str(clip), "8000 Hz", "resample the clip to 16000 Hz")


# ----------------------------------------------------------------------------- images


def test_processor_grid_follows_transformers_for_thin_images() -> None:
    # Tiny model: patch 16, 70 soft tokens of 3x3 patches.
    assert resized_grid(2, 4000, 16, 630, 3) == (3, 210)
    assert resized_grid(4000, 2, 16, 630, 3) == (210, 3)
    assert resized_grid(1, 1, 16, 630, 3) == (24, 24)


@pytest.mark.parametrize("command", ["bench", "verify"])
def test_an_image_too_elongated_for_the_vision_positions_is_refused(
    mm: dict[str, Path], tmp_path: Path, command: str
) -> None:
    # 2x4000 pixels resize to 3x210 patches; the tiny tower has 64 positions per side
    # (before: raw onnxruntime Gather text from bench, an IndexError traceback from verify).
    image = write_png(tmp_path / "thin.png", 2, 4000)
    model = ("--model", str(mm["model"])) if command == "verify" else ()
    result = cli(command, str(mm["package"]), *model, "--image", str(image), "--quiet")
    _refused(result, str(image), "2x4000 pixels", "3x210 patches", "64 patches per side")


def test_the_most_elongated_image_that_fits_runs(mm: dict[str, Path], tmp_path: Path) -> None:
    package = open_package(mm["package"])
    fits = write_png(tmp_path / "fits.png", 16, 104)  # 9x63 patches
    too_long = write_png(tmp_path / "too_long.png", 8, 56)  # 9x66 patches
    with pytest.raises(OptionsError, match="9x66 patches"):
        MediaPrompt.build(None, (str(too_long),)).check(package)
    media = MediaPrompt.build(None, (str(fits),))
    config = BenchConfig(runtime="genai", media=media, new_tokens=2, repeats=1, warmup=0)
    assert len(run_bench(package, config)[0].tokens) == 2


# ----------------------------------------------------------------------------- lengths


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--steps", "1000000000"), f"more than the {LIMIT} this package supports"),
        (("--steps", "30"), f"more than the {LIMIT} this package supports"),
        (("--prompt-len", "0"), "--prompt-len must be between 1"),
        (("--prompt-len", "1000000"), "is 1,000,016 tokens, more than the"),
        (("--seed", "-1"), "--seed must be 0 or more"),  # was numpy's traceback
        (("--ep", "dml"), "(DmlExecutionProvider) is not available"),  # was after transformers
    ],
)
def test_verify_refuses_bad_options_before_importing_torch(
    text: dict[str, Path], args: tuple[str, ...], message: str
) -> None:
    code = (
        "import sys\n"
        "from engine.cli import main\n"
        f"code = main({['verify', str(text['package']), '--model', str(text['model']), *args]!r})\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch', code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.split() == ["no", "torch", "2"], result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_bench_and_verify_word_the_same_length_refusal(text: dict[str, Path]) -> None:
    bench = cli("bench", str(text["package"]), "--prompt-len", "12", "--new-tokens", "30")
    verify = cli("verify", str(text["package"]), "--model", str(text["model"]), "--steps", "30")
    for result, flag in ((bench, "--new-tokens"), (verify, "--steps")):
        _refused(result, "a prompt of 12 plus 30 generated tokens is 42 tokens", flag)


def test_a_package_as_long_as_its_model_is_not_told_to_rebuild_longer(tmp_path: Path) -> None:
    """A package built to the model's own maximum: the refusal says the model stops there,
    not "rebuild it with a longer --max-length" (which a rebuild caps at the same length);
    a package built shorter than its model keeps that advice (``text``: 32 of its model's
    more)."""
    out = tmp_path / "full"
    options = ExportOptions(random_weights=True, max_length=100_000)
    export(out, preset="gemma4-tiny", options=options)
    result = cli("bench", str(out), "--prompt-len", "1000")
    _refused(result, "more than the 512 this package supports", "trained for no more than 512")
    assert "rebuild" not in result.stderr.replace("a rebuild cannot", "")
    package = open_package(out)
    assert package.manifest and package.manifest["model"]["max_position_embeddings"] == 512


def test_a_shorter_package_is_told_it_may_be_rebuilt_longer(text: dict[str, Path]) -> None:
    result = cli("bench", str(text["package"]), "--prompt-len", "40")
    _refused(result, f"more than the {LIMIT} this package supports", "--max-length")
    assert "trained for no more" not in result.stderr


def test_verify_of_a_multimodal_package_without_media_names_its_own_flags(
    mm: dict[str, Path],
) -> None:
    # It used to run transformers first, then advise --runtime genai, which verify lacks.
    result = cli("verify", str(mm["package"]), "--model", str(mm["model"]), "--quiet")
    _refused(result, "--image PATH", "--audio PATH")
    flags = set(re.findall(r"--[a-z-]+", cli("verify", "--help").stdout))
    assert set(re.findall(r"--[a-z-]+", result.stderr)) <= flags


# ----------------------------------------------------------------------------- counts


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--threads", "100000"), f"--threads must be between 1 and {max_threads()}"),
        (("--threads", "0"), "--threads must be between 1"),
        (("--repeats", "1e9"), f"--repeats must be between 1 and {MAX_REPEATS:,}"),
        (("--warmup", "-1"), "--warmup must be between 0"),
        (("--new-tokens", "1"), "--new-tokens must be between 2"),
        (("--prompt-len", "-3"), "--prompt-len must be between 1"),
        (("--seed", "-1"), "--seed must be 0 or more"),
    ],
)
def test_bench_refuses_numbers_out_of_range(
    text: dict[str, Path], args: tuple[str, ...], message: str
) -> None:
    # --threads 100000 used to grow to 16 GB, deaf to SIGTERM, while onnxruntime started
    # its threads.
    _refused(cli("bench", str(text["package"]), *args, "--quiet"), message)


def test_the_thread_limit_itself_is_accepted() -> None:
    assert BenchConfig(threads=max_threads()).threads == max_threads()
    with pytest.raises(OptionsError, match="per CPU core"):
        BenchConfig(threads=max_threads() + 1)


@pytest.mark.parametrize("top", ["0", "-1"])
def test_plan_refuses_a_degenerate_row_count(top: str) -> None:
    _refused(cli("plan", "--preset", "gemma4-tiny", "--top", top), "--top must be 1 or more")


def test_plan_with_a_huge_row_count_lists_every_tensor() -> None:
    few = cli("plan", "--preset", "gemma4-tiny", "--top", "1")
    every = cli("plan", "--preset", "gemma4-tiny", "--top", "1e30")
    assert few.returncode == every.returncode == 0, every.stderr
    assert len(every.stdout.splitlines()) > len(few.stdout.splitlines())


# ----------------------------------------------------------------------------- files


@pytest.mark.parametrize("runtime", ["ort", "genai"])
def test_a_truncated_data_file_is_named_before_a_session_is_made(
    text: dict[str, Path], tmp_path: Path, runtime: str
) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(text["package"], package)
    data = package / "model.onnx.data"
    expected = data.stat().st_size
    with data.open("r+b") as f:
        f.truncate(1000)
    result = cli("bench", str(package), "--runtime", runtime, "--quiet")
    _refused(
        result,
        f"the package's model.onnx.data is truncated or corrupt (expected {expected:,} bytes, "
        "found 1,000); export it again",
    )
    assert "ONNXRuntimeError" not in result.stderr


def test_onnxruntime_text_for_short_data_is_worded_the_same(
    text: dict[str, Path], tmp_path: Path
) -> None:
    # Where onnx is not installed, open_package cannot check; the session's failure
    # then gets the same words.
    from engine.runtime.session import create_session

    package = tmp_path / "pkg"
    shutil.copytree(text["package"], package)
    with (package / "model.onnx.data").open("r+b") as f:
        f.truncate(1000)
    with pytest.raises(PackageError, match=r"is truncated or corrupt .* found 1,000") as info:
        create_session(package / "model.onnx", "cpu")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("command", ["bench", "verify"])
def test_an_empty_session_file_is_refused_before_any_work(
    text: dict[str, Path], tmp_path: Path, command: str
) -> None:
    # An empty file parses as an empty ONNX model: verify ran transformers first, then
    # onnxruntime failed and left an empty profile in the temporary folder.
    package = tmp_path / "pkg"
    shutil.copytree(text["package"], package)
    (package / "model.onnx").write_bytes(b"")
    model = ("--model", str(text["model"])) if command == "verify" else ()
    result = cli(command, str(package), *model, "--quiet")
    _refused(result, "the package's model.onnx holds no graph", "export it again")
    assert "Loading weights" not in result.stderr


def test_a_session_that_fails_to_load_leaves_no_profile_behind(tmp_path: Path) -> None:
    import tempfile

    from engine.errors import RuntimeUnavailableError
    from engine.runtime.session import create_session

    (tmp_path / "model.onnx").write_bytes(b"")
    ours = f"es-profile-{os.getpid()}*"  # this process's profiles only
    before = set(Path(tempfile.gettempdir()).glob(ours))
    with pytest.raises(RuntimeUnavailableError, match=r"could not load model\.onnx"):
        create_session(tmp_path / "model.onnx", "cpu")
    assert set(Path(tempfile.gettempdir()).glob(ours)) <= before


def test_verify_of_a_bf16_package_is_refused_in_its_own_words(
    text: dict[str, Path], tmp_path: Path
) -> None:
    # The CPU EP has no bf16 kernels: said before transformers runs, with verify's own
    # --ep (our loop's old refusal advised --runtime genai, an option of bench's). Our loop
    # itself runs bf16 caches now (test_runtime_parity), so on CUDA it would run.
    package = tmp_path / "pkg"
    shutil.copytree(text["package"], package)
    manifest = json.loads((package / "export_studio.json").read_text())
    manifest["options"]["dtype"] = "bf16"
    (package / "export_studio.json").write_text(json.dumps(manifest))
    result = cli("verify", str(package), "--model", str(text["model"]), "--quiet")
    _refused(
        result,
        "is a bf16 package, which CPU does not run; verify it with --ep cuda on a machine",
        "verify an fp16 or fp32 export",
    )
    assert "--runtime" not in result.stderr and "Loading weights" not in result.stderr


def test_a_transformers_failure_in_verify_is_one_line_naming_the_checkpoint(
    mm: dict[str, Path],
) -> None:
    # What verify met for a too-elongated image (positions past the vision table), if a
    # file got past the checks: IndexError with a traceback before.
    from engine.errors import RuntimeUnavailableError
    from engine.progress import CancelToken
    from engine.runtime.verify_media import _reference
    from tests._support.tiny_gemma_mm import random_patches

    pixels, positions = random_patches(np.random.default_rng(0), 3, 210)
    ids = np.array([[2, 302, *[300] * 70, 303]], dtype=np.int64)
    tensors = {"input_ids": ids, "pixel_values": pixels, "pixel_position_ids": positions}
    with pytest.raises(RuntimeUnavailableError, match="transformers failed running") as info:
        _reference(mm["model"], tensors, 1, CancelToken())
    assert str(mm["model"]) in str(info.value) and "\n" not in str(info.value)
