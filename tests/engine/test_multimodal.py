"""Multimodal Gemma 4 packages end to end: vision + speech + embedding + decoder sessions
through onnxruntime-genai 0.18 and its own processors, against transformers fed the same
processed tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import ExportOptions, export
from engine.errors import EngineError, WeightsError
from engine.runtime.media import MediaPrompt
from engine.runtime.verify import Tolerance
from engine.runtime.verify_media import verify_media
from tests._support.media import write_png, write_wav
from tests._support.tiny_gemma_mm import make_mm_checkpoint

EXACT = Tolerance(max_rel_diff=None, min_agreement=1.0, min_cosine=0.9999)
STEPS = 12

CASES: dict[str, dict[str, Any]] = {
    # KV sharing, double-wide MLP, PLE and a window (8) shorter than every prompt here.
    "base": {},
    # transformers 5.24's forward fails for KV sharing without per-layer inputs.
    "no_ple": {"text": {"hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0}},
    "no_kv_sharing": {"text": {"num_kv_shared_layers": 0, "use_double_wide_mlp": False}},
    "vision_only": {"audio": False},
}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("media")
    return {
        "wide": write_png(folder / "wide.png", 120, 64, seed=1),
        "tall": write_png(folder / "tall.png", 48, 96, seed=2),
        "clip": write_wav(folder / "clip.wav", 1.2),
    }


def _export(tmp_path: Path, name: str, **options: Any) -> tuple[Path, Path]:
    case = CASES[name]
    model_dir = tmp_path / f"ckpt-{name}"
    make_mm_checkpoint(
        model_dir,
        vision=case.get("vision", True),
        audio=case.get("audio", True),
        text=case.get("text"),
    )
    out = tmp_path / f"pkg-{name}"
    export(out, model_dir=model_dir, options=ExportOptions(**options))
    return model_dir, out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_genai_matches_transformers_on_images_and_audio(
    tmp_path: Path, media: dict[str, Path], name: str
) -> None:
    model_dir, package = _export(tmp_path, name)
    config = json.loads((package / "genai_config.json").read_text())["model"]
    assert config["type"] == "gemma4"
    images = (str(media["wide"]), str(media["tall"])) if CASES[name].get("vision", True) else ()
    audios = (str(media["clip"]),) if CASES[name].get("audio", True) else ()
    prompt = MediaPrompt.build("look and listen", images, audios)
    result = verify_media(package, model_dir, prompt, steps=STEPS, tolerance=EXACT)
    assert result.greedy_tokens_identical, result.to_json()
    assert result.max_abs_diff <= 1e-3, result.max_abs_diff
    # The media really are in the prompt: two images of different sizes and a clip.
    if images:
        assert 300 in result.prompt
    if audios:
        assert 301 in result.prompt


def test_capture_is_decided_per_session(tmp_path: Path) -> None:
    _, package = _export(tmp_path, "base", ep="webgpu")
    config = json.loads((package / "genai_config.json").read_text())["model"]
    manifest = json.loads((package / "export_studio.json").read_text())
    capture = manifest["graph_capture"]
    assert capture["decoder"] is True
    assert capture["vision"] is capture["speech"] is capture["embedding"] is False
    for session in ("vision", "speech", "embedding"):
        options = config[session]["session_options"]["provider_options"][0]["webgpu"]
        assert options["enableGraphCapture"] == "0"
    assert (
        config["decoder"]["session_options"]["provider_options"][0]["webgpu"]["enableGraphCapture"]
        == "1"
    )


def test_processor_files_come_from_the_checkpoint(tmp_path: Path) -> None:
    _, package = _export(tmp_path, "base")
    image = json.loads((package / "processor_config.json").read_text())
    transform = image["processor"]["transforms"][1]["operation"]
    assert transform["type"] == "Gemma4ImageTransform"
    assert transform["attrs"]["max_soft_tokens"] == 70  # the tiny checkpoint's own setting
    audio = json.loads((package / "audio_processor_config.json").read_text())
    mel = audio["feature_extraction"]["sequence"][1]["operation"]
    assert mel["type"] == "Gemma4LogMel" and mel["attrs"]["frame_length_ms"] == 20.0


def test_a_benchmark_records_the_processed_prompt_and_its_media(
    tmp_path: Path, media: dict[str, Path]
) -> None:
    from engine.runtime.bench import BenchConfig, run_bench

    _, package = _export(tmp_path, "base")
    prompt = MediaPrompt.build("look", (str(media["wide"]),), (str(media["clip"]),))
    config = BenchConfig(runtime="genai", media=prompt, new_tokens=3, repeats=1, warmup=0)
    result, generation = run_bench(package, config)
    assert result.media == ("image", "audio")
    assert result.prompt_length == generation.prompt_length != config.prompt_length
    assert any("after genai's processor" in note for note in result.notes)
    assert result.time_to_first_token_seconds > 0 and len(result.tokens) == 3


def test_audio_without_vision_is_refused_before_any_work(tmp_path: Path) -> None:
    model_dir = tmp_path / "ckpt"
    make_mm_checkpoint(model_dir)
    options = ExportOptions(modalities=("text", "audio"))
    with pytest.raises(EngineError, match="only beside a vision session"):
        export(tmp_path / "out", model_dir=model_dir, options=options)
    assert not (tmp_path / "out").exists()


def test_text_only_export_of_a_multimodal_checkpoint(tmp_path: Path) -> None:
    _, package = _export(tmp_path, "base", modalities=("text",))
    config = json.loads((package / "genai_config.json").read_text())["model"]
    assert config["type"] == "gemma4_text" and "vision" not in config
    assert sorted(p.name for p in package.glob("*.onnx")) == ["model.onnx"]


def test_towers_that_do_not_match_the_config_are_refused(tmp_path: Path) -> None:
    model_dir = tmp_path / "ckpt"
    make_mm_checkpoint(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["vision_config"]["num_hidden_layers"] = 3  # the weights have 2
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"vision_tower\.encoder\.layers\.2"):
        export(tmp_path / "out", model_dir=model_dir)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_image_is_one_clear_error(tmp_path: Path, media: dict[str, Path]) -> None:
    model_dir, package = _export(tmp_path, "vision_only")
    broken = tmp_path / "broken.png"
    broken.write_bytes(media["wide"].read_bytes()[:40])  # a PNG header, then nothing
    with pytest.raises(EngineError, match=r"could not read .*broken\.png"):
        verify_media(package, model_dir, MediaPrompt.build(None, (str(broken),)), steps=2)


def test_placeholders_without_features_embed_as_pad(tmp_path: Path) -> None:
    """A placeholder the model generates itself (image, audio or video id on a decode
    step, no features) is embedded as the pad token, as transformers does; features fill
    the placeholders in order."""
    import numpy as np
    import onnxruntime as ort

    from tests._support.tiny_gemma_mm import TOKENS

    _, package = _export(tmp_path, "base")
    session = ort.InferenceSession(str(package / "embedding.onnx"))
    hidden = 64
    empty = np.zeros((0, hidden), np.float32)
    image, audio, video = (
        TOKENS[k] for k in ("image_token_id", "audio_token_id", "video_token_id")
    )
    ids = np.array([[5, image, audio, video, 0]], np.int64)
    feeds = {"input_ids": ids, "image_features": empty, "audio_features": empty}
    embeds = session.run(["inputs_embeds"], feeds)[0][0]
    for position in (1, 2, 3):
        np.testing.assert_array_equal(embeds[position], embeds[4])  # the pad id's row
    one_image = np.full((1, hidden), 7.0, np.float32)
    two_markers = np.array([[image, 5, image]], np.int64)
    feeds = {"input_ids": two_markers, "image_features": one_image, "audio_features": empty}
    embeds = session.run(["inputs_embeds"], feeds)[0][0]
    np.testing.assert_array_equal(embeds[0], one_image[0])  # the first marker's row
    assert not np.allclose(embeds[2], one_image[0])  # the second has no row: pad


def test_bidirectional_image_attention_keeps_vision_out(tmp_path: Path) -> None:
    """26B-A4B / 31B let image tokens attend both ways; until the decoder does that, their
    checkpoints export text packages by default and refuse vision with the reason."""
    from engine.plan import plan
    from engine.spec import ModelSpec

    model_dir = tmp_path / "ckpt"
    make_mm_checkpoint(model_dir, audio=False, text={"use_bidirectional_attention": "vision"})
    from engine.models import load_spec

    spec: ModelSpec = load_spec(model_dir)
    assert spec.bidirectional_images and spec.towers == ("vision",)
    assert [s.name for s in plan(spec, ExportOptions()).sessions] == ["decoder"]
    with pytest.raises(EngineError, match="attend to each other both ways"):
        plan(spec, ExportOptions(modalities=("text", "vision")))


@pytest.mark.parametrize("ep", ["cuda", "dml", "trt-rtx"])
def test_gpu_packages_build_and_pass_the_checker(tmp_path: Path, ep: str) -> None:
    """EPs this machine cannot run: every session of the package passes ONNX's full checker
    (external data included), and genai_config names the EP for every session."""
    import onnx

    from engine.caps import get_caps

    _, package = _export(tmp_path, "base", ep=ep, weight_bits=4)
    config = json.loads((package / "genai_config.json").read_text())["model"]
    provider = get_caps(ep).genai_provider
    for session in ("vision", "speech", "embedding", "decoder"):
        onnx.checker.check_model(str(package / config[session]["filename"]), full_check=True)
        providers = config[session]["session_options"]["provider_options"]
        assert [next(iter(p)) for p in providers] == [provider], (session, providers)
