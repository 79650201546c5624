"""What a checkpoint folder holds is checked before any expensive work, and each kind of
input the export cannot use is one message that says what to do (issue 22).

Infinite clamp bounds (what transformers initialises clipped linears to) are values, not
damage; broken tokenizer or processor files, PyTorch pickles, pre-quantized checkpoints and
PEFT adapters are each named with their fix, and nothing is written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import pytest
from safetensors.numpy import load_file, save_file

from engine.errors import SpecError, WeightsError
from engine.options import ExportOptions
from engine.pipeline import ExportResult, export
from engine.processors import read_processing
from engine.runtime.media import MediaPrompt
from engine.runtime.verify_media import verify_media
from engine.tokenizer_files import NO_TOKENIZER_NOTE
from tests._support.cli import cli
from tests._support.fake_checkpoint import write_checkpoint
from tests._support.media import write_png, write_wav
from tests._support.tiny_audio import max_errors
from tests._support.tiny_gemma import make_tokenizer
from tests._support.tiny_gemma_mm import make_mm_checkpoint
from tests.engine import test_webgpu
from tests.engine.test_multimodal import EXACT, STEPS
from tests.engine.test_vision import (
    BATCHES,
    RUNNER,
    feeds,
    hf_features,
    max_error,
    run_features,
    session,
)

WEIGHTS = "model.safetensors"
FP32_TOL = 1e-4
"""As tests/engine/test_vision.py and test_audio.py hold fp32 features to transformers."""
FP16_TOL = 1e-2
"""As tests/engine/test_audio.py holds fp16 features to float32 transformers."""
TEXT_ONLY = ExportOptions(modalities=("text",))


def nothing_written(parent: Path, name: str = "out") -> bool:
    """No package, no staging folder, no backup beside where it would be."""
    return not (parent / name).exists() and not any(
        ".partial-" in p.name or ".old-" in p.name for p in parent.iterdir()
    )


class Stages:
    """The progress messages an export reached."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, fraction: float, message: str) -> None:
        self.seen.append(message)

    @property
    def heavy_work_started(self) -> bool:
        return any(m.startswith(("checking the checkpoint", "building")) for m in self.seen)


# ---------------------------------------------------------------- infinite clamp bounds


class Unclipped:
    """A tiny multimodal checkpoint saved as transformers initialises it: every clip
    bound of its clipped linears -inf / +inf."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "ckpt"
        self.model = make_mm_checkpoint(self.path, clip=None)
        self._exports: dict[str, ExportResult] = {}

    def export(self, dtype: Literal["fp32", "fp16"]) -> ExportResult:
        if dtype not in self._exports:
            options = ExportOptions(ep="cpu", dtype=dtype)
            self._exports[dtype] = export(self.root / dtype, model_dir=self.path, options=options)
        return self._exports[dtype]


@pytest.fixture(scope="module")
def unclipped(tmp_path_factory: pytest.TempPathFactory) -> Unclipped:
    return Unclipped(tmp_path_factory.mktemp("unclipped"))


def clip_bounds(onnx_file: Path) -> dict[str, float]:
    proto = onnx.load(str(onnx_file))
    return {
        t.name: float(onnx.numpy_helper.to_array(t))
        for t in proto.graph.initializer
        if t.name.endswith(("input_min", "input_max", "output_min", "output_max"))
    }


def test_the_checkpoint_holds_infinite_bounds_that_transformers_runs(unclipped: Unclipped) -> None:
    tensors = load_file(unclipped.path / WEIGHTS)
    bounds = {k: float(v) for k, v in tensors.items() if k.endswith(("_min", "_max"))}
    assert bounds and all(abs(v) == float("inf") for v in bounds.values())
    # transformers' own features are finite: the bounds mean "no clamp".
    assert all(np.isfinite(f).all() for f in hf_features(unclipped.model, BATCHES[0]))


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_infinite_clip_bounds_build_and_the_package_matches_transformers(
    unclipped: Unclipped, dtype: Literal["fp32", "fp16"]
) -> None:
    result = unclipped.export(dtype)
    for onnx_file in ("vision.onnx", "speech.onnx"):
        bounds = clip_bounds(result.output / onnx_file)
        assert bounds, onnx_file
        assert all(v == (-np.inf if n.endswith("_min") else np.inf) for n, v in bounds.items())
    tolerance = FP32_TOL if dtype == "fp32" else FP16_TOL
    vision = max(
        max_error(run_features(result.output, b), hf_features(unclipped.model, b)) for b in BATCHES
    )
    speech = max(max_errors(unclipped.model, result))
    print(json.dumps({dtype: {"vision": vision, "speech": speech}}))
    assert vision <= tolerance and speech <= tolerance, (vision, speech)


@pytest.mark.slow
def test_genai_runs_an_unclipped_package_like_transformers(
    unclipped: Unclipped, tmp_path: Path
) -> None:
    package = unclipped.export("fp32").output
    image = write_png(tmp_path / "wide.png", 120, 64, seed=1)
    audio = write_wav(tmp_path / "clip.wav", 1.2)
    prompt = MediaPrompt.build("look and listen", (str(image),), (str(audio),))
    result = verify_media(package, unclipped.path, prompt, steps=STEPS, tolerance=EXACT)
    print(json.dumps({"max_abs_diff": result.max_abs_diff}))
    assert result.greedy_tokens_identical, result.to_json()
    assert result.max_abs_diff <= 1e-3, result.max_abs_diff
    assert 300 in result.prompt and 301 in result.prompt


webgpu_env = test_webgpu.webgpu_env


@pytest.mark.webgpu
def test_infinite_clip_bounds_run_on_webgpu_like_transformers(
    unclipped: Unclipped, webgpu_env: Path, tmp_path: Path
) -> None:
    """Every vision node (the Clips with infinite bounds included) on the WebGPU EP, and
    the features still transformers'."""
    options = ExportOptions(ep="webgpu", dtype="fp32", modalities=("text", "vision"))
    result = export(tmp_path / "pkg", model_dir=unclipped.path, options=options)
    sess = session(result.output)
    arrays: dict[str, Any] = {
        f"{batch.name}.{i}/{key}": value
        for batch in BATCHES
        for i, feed in enumerate(feeds(sess, batch))
        for key, value in feed.items()
    }
    model_file, feeds_file, out_file = (
        result.output / "vision.onnx",
        tmp_path / "feeds.npz",
        tmp_path / "out.npz",
    )
    np.savez(feeds_file, **arrays)
    report_path = tmp_path / "report.json"
    cmd = [str(webgpu_env), str(RUNNER), str(model_file), str(feeds_file), str(out_file)]
    done = subprocess.run(
        [*cmd, "--json-out", str(report_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=test_webgpu._clean_env(),
    )
    assert report_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    placement = json.loads(report_path.read_text())["placement"]
    assert list(placement["nodes_by_provider"]) == ["WebGpuExecutionProvider"], placement
    outputs = dict(np.load(out_file))
    error = max(
        max_error(
            [outputs[f"{batch.name}.{i}/image_features"] for i in range(len(batch.grids))],
            hf_features(unclipped.model, batch),
        )
        for batch in BATCHES
    )
    print(json.dumps({"webgpu_fp32_vision": error}))
    assert error <= FP32_TOL, error


def _set_bound(src: Path, dst: Path, value: float) -> str:
    """Copy a checkpoint with one clip bound set to ``value``; returns its name."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / WEIGHTS)
    name = "model.vision_tower.encoder.layers.1.mlp.down_proj.output_max"
    tensors[name] = np.array(value, dtype=np.float32)
    save_file(tensors, str(dst / WEIGHTS))
    return name


def test_a_nan_clip_bound_is_still_refused_as_damage(unclipped: Unclipped, tmp_path: Path) -> None:
    name = _set_bound(unclipped.path, tmp_path / "nan", float("nan"))
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "out", model_dir=tmp_path / "nan", options=ExportOptions(ep="cpu"))
    assert f"'{name}' (a clamp bound) is NaN: the checkpoint is damaged" in str(info.value)
    assert nothing_written(tmp_path)


def test_a_bound_past_the_fp16_range_is_no_clamp_in_an_fp16_package(
    unclipped: Unclipped, tmp_path: Path
) -> None:
    """fp16 cannot hold 1e6: as in ``model.half()``, the bound becomes inf (no fp16 value
    reaches it either way) rather than a refusal."""
    name = _set_bound(unclipped.path, tmp_path / "big", 1e6)
    options = ExportOptions(ep="cpu", dtype="fp16", modalities=("text", "vision"))
    result = export(tmp_path / "out", model_dir=tmp_path / "big", options=options)
    key = name.removeprefix("model.")
    assert clip_bounds(result.output / "vision.onnx")[key] == np.inf
    error = max(
        max_error(run_features(result.output, b), hf_features(unclipped.model, b)) for b in BATCHES
    )
    assert error <= FP16_TOL, error


# ---------------------------------------------------------------------- tokenizer files


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    """A text checkpoint with a good tokenizer."""
    folder = write_checkpoint(tmp_path / "M")
    make_tokenizer(folder, 320)
    return folder


def _truncate(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2], encoding="utf-8")


def _edit_json(path: Path, change: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(change(data)), encoding="utf-8")


def _unknown_model_type(data: dict[str, Any]) -> dict[str, Any]:
    data["model"]["type"] = "NotAModel"
    return data


def _vocabulary_past_the_embedding(data: dict[str, Any]) -> dict[str, Any]:
    data["model"]["vocab"]["zz"] = 600
    return data


def _added_token_past_the_embedding(data: dict[str, Any]) -> dict[str, Any]:
    data["added_tokens"].append({**data["added_tokens"][-1], "id": 600, "content": "<x>"})
    return data


BROKEN_TOKENIZERS = {
    "truncated": ("tokenizer.json", _truncate, "is not valid JSON"),
    "not_an_object": (
        "tokenizer.json",
        lambda p: p.write_text("[1, 2]"),
        "holds a JSON list, not an object",
    ),
    "no_model": (
        "tokenizer.json",
        lambda p: _edit_json(p, lambda d: {k: v for k, v in d.items() if k != "model"}),
        "has no 'model' object",
    ),
    "unknown_model": (
        "tokenizer.json",
        lambda p: _edit_json(p, _unknown_model_type),
        "does not load in the tokenizers library",
    ),
    "config_truncated": ("tokenizer_config.json", _truncate, "is not valid JSON"),
    "not_utf8": ("tokenizer_config.json", lambda p: p.write_bytes(b"\xff\xfe{}"), "is not UTF-8"),
}


@pytest.mark.parametrize("case", list(BROKEN_TOKENIZERS))
def test_a_broken_tokenizer_file_is_refused_before_any_work(
    model: Path, tmp_path: Path, case: str
) -> None:
    name, damage, problem = BROKEN_TOKENIZERS[case]
    damage(model / name)
    stages = Stages()
    with pytest.raises(SpecError) as info:
        export(tmp_path / "out", model_dir=model, progress=stages)
    message = str(info.value)
    assert f"{model / name} {problem}" in message
    assert f"Copy a good {name} from the original checkpoint" in message
    assert "or remove it to build without it" in message
    assert not stages.heavy_work_started, stages.seen
    assert nothing_written(tmp_path)


def test_a_tokenizer_json_without_its_config_is_refused(model: Path, tmp_path: Path) -> None:
    """genai 0.18 cannot load tokenizer.json without tokenizer_config.json beside it."""
    (model / "tokenizer_config.json").unlink()
    with pytest.raises(SpecError) as info:
        export(tmp_path / "out", model_dir=model)
    message = str(info.value)
    assert "has tokenizer.json but no tokenizer_config.json" in message
    assert "Copy tokenizer_config.json from the original checkpoint" in message
    assert "or remove tokenizer.json to build without a tokenizer" in message
    assert nothing_written(tmp_path)


def test_a_tokenizer_whose_vocabulary_is_past_the_embedding_is_refused(
    model: Path, tmp_path: Path
) -> None:
    _edit_json(model / "tokenizer.json", _vocabulary_past_the_embedding)
    with pytest.raises(SpecError) as info:
        export(tmp_path / "out", model_dir=model)
    message = str(info.value)
    assert "has a vocabulary of ids up to 600, but config.json's vocab_size is 512" in message
    assert "belongs to another model" in message and nothing_written(tmp_path)


def test_added_tokens_past_the_embedding_are_a_note(model: Path, tmp_path: Path) -> None:
    """A model may keep special tokens it never embeds: said, not refused."""
    _edit_json(model / "tokenizer.json", _added_token_past_the_embedding)
    result = export(tmp_path / "out", model_dir=model)
    (note,) = [n for n in result.notes if "added tokens" in n]
    assert "ids up to 600, past config.json's vocab_size (512)" in note


def test_a_truncated_tokenizer_json_is_one_cli_error_line(model: Path, tmp_path: Path) -> None:
    _truncate(model / "tokenizer.json")
    done = cli("build", "--model", str(model), "--quiet", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {model / 'tokenizer.json'} is not valid JSON")


def test_a_checkpoint_without_a_tokenizer_builds_with_a_note(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "M")
    result = export(tmp_path / "out", model_dir=folder)
    assert NO_TOKENIZER_NOTE in result.notes and result.tokenizer_files == ()
    assert "until tokenizer.json is added" in NO_TOKENIZER_NOTE
    done = cli("build", "--model", str(folder), "--quiet", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr
    assert f"  note: {NO_TOKENIZER_NOTE}\n" in done.stdout


def test_a_good_tokenizer_builds_without_a_note(model: Path, tmp_path: Path) -> None:
    result = export(tmp_path / "out", model_dir=model)
    assert "tokenizer.json" in result.tokenizer_files
    assert not any("tokenizer" in note for note in result.notes), result.notes


# ------------------------------------------------------------ weights the export cannot read


def test_pytorch_pickle_weights_are_named_with_how_to_convert_them(
    model: Path, tmp_path: Path
) -> None:
    (model / WEIGHTS).rename(model / "pytorch_model.bin")
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "out", model_dir=model)
    message = str(info.value)
    assert "holds PyTorch pickle weights (pytorch_model.bin)" in message
    assert "save_pretrained" in message and "safe_serialization=True" in message
    assert "--random-weights" not in message and nothing_written(tmp_path)


def _fp8_checkpoint(folder: Path, *, config: bool, scales: bool) -> None:
    """The checkpoint's linear weights in float8 e4m3 (as FP8 releases store them), with
    their ``weight_scale`` tensors and ``quantization_config`` where asked."""
    import torch
    from safetensors.torch import save_file as save_torch

    tensors: dict[str, torch.Tensor] = {}
    for key, value in load_file(folder / WEIGHTS).items():
        if key.endswith("proj.weight"):
            tensors[key] = torch.from_numpy(value).to(torch.float8_e4m3fn)
            if scales:
                tensors[key + "_scale"] = torch.ones(value.shape[0], 1)
        else:
            tensors[key] = torch.from_numpy(value)
    save_torch(tensors, str(folder / WEIGHTS))
    if config:
        quant = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        _edit_json(folder / "config.json", lambda d: {**d, "quantization_config": quant})


def _gptq_checkpoint(folder: Path) -> None:
    """Linear weights replaced by GPTQ's packed int32 codes, scales and zero points."""
    tensors = {}
    for key, value in load_file(folder / WEIGHTS).items():
        if key.endswith("proj.weight"):
            base = key.removesuffix(".weight")
            out, cols = value.shape
            tensors[base + ".qweight"] = np.zeros((cols // 8, out), np.int32)
            tensors[base + ".qzeros"] = np.zeros((1, out // 8), np.int32)
            tensors[base + ".scales"] = np.ones((1, out), np.float16)
        else:
            tensors[key] = value
    save_file(tensors, str(folder / WEIGHTS))
    quant = {"quant_method": "gptq", "bits": 4, "group_size": -1}
    _edit_json(folder / "config.json", lambda d: {**d, "quantization_config": quant})


QUANTIZED = {
    "fp8": (
        lambda f: _fp8_checkpoint(f, config=True, scales=True),
        ["quant_method 'fp8'", "are stored as F8_E4M3", "quantizer tensor(s) such as"],
    ),
    "fp8_without_config": (
        lambda f: _fp8_checkpoint(f, config=False, scales=False),
        ["are stored as F8_E4M3"],
    ),
    "gptq": (_gptq_checkpoint, ["quant_method 'gptq'", ".qweight'"]),
}


@pytest.mark.parametrize("case", list(QUANTIZED))
def test_a_pre_quantized_checkpoint_says_a_float_one_is_needed(
    model: Path, tmp_path: Path, case: str
) -> None:
    prepare, signs = QUANTIZED[case]
    prepare(model)
    stages = Stages()
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "out", model_dir=model, progress=stages)
    message = str(info.value)
    assert message.startswith(f"'{model}' is a pre-quantized checkpoint: "), message
    assert all(sign in message for sign in signs), message
    assert "original float checkpoint" in message and "--weight-bits 4" in message
    # One line, not the listing of every tensor.
    assert "\n" not in message and "does not match its config.json" not in message
    assert not any(m.startswith("building") for m in stages.seen)
    assert nothing_written(tmp_path)


def test_a_stale_quantization_config_over_float_weights_builds(model: Path, tmp_path: Path) -> None:
    """Only weights that do not fit are refused: float tensors of the right shapes export
    whatever config.json says."""
    _edit_json(model / "config.json", lambda d: {**d, "quantization_config": {"bits": 4}})
    export(tmp_path / "out", model_dir=model)


def _adapter_files(folder: Path) -> None:
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "base_model_name_or_path": "google/gemma-4-E2B-it"})
    )
    lora = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros(
            (4, 64), np.float32
        )
    }
    save_file(lora, str(folder / "adapter_model.safetensors"))


def test_a_peft_adapter_beside_the_model_says_to_merge_it(model: Path, tmp_path: Path) -> None:
    _adapter_files(model)
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "out", model_dir=model)
    message = str(info.value)
    assert "holds a PEFT adapter (adapter_config.json, adapter_model.safetensors)" in message
    assert "merge_and_unload()" in message and "(google/gemma-4-E2B-it)" in message
    assert "--model" in message and nothing_written(tmp_path)


def test_an_adapter_folder_without_a_model_says_to_merge_it(tmp_path: Path) -> None:
    folder = tmp_path / "adapter"
    folder.mkdir()
    _adapter_files(folder)
    with pytest.raises(SpecError, match=r"holds a PEFT adapter .*merge_and_unload\(\)"):
        export(tmp_path / "out", model_dir=folder)
    assert nothing_written(tmp_path)


def test_lora_tensors_inside_the_checkpoint_say_to_merge_them(model: Path, tmp_path: Path) -> None:
    tensors = load_file(model / WEIGHTS)
    tensors["model.layers.0.self_attn.q_proj.lora_A.weight"] = np.zeros((4, 64), np.float32)
    tensors["model.layers.0.self_attn.q_proj.lora_B.weight"] = np.zeros((64, 4), np.float32)
    save_file(tensors, str(model / WEIGHTS))
    with pytest.raises(WeightsError) as info:
        export(tmp_path / "out", model_dir=model)
    message = str(info.value)
    assert "holds 2 LoRA adapter tensor(s) such as" in message
    assert "merge_and_unload()" in message and "\n" not in message


# ------------------------------------------------------------------- processor configs


@pytest.fixture()
def broken_processor(unclipped: Unclipped, tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(unclipped.path, folder)
    _truncate(folder / "processor_config.json")
    return folder


def test_a_corrupt_processor_config_does_not_block_a_text_export(
    broken_processor: Path, tmp_path: Path
) -> None:
    result = export(tmp_path / "out", model_dir=broken_processor, options=TEXT_ONLY)
    assert [s.name for s in result.plan.sessions] == ["decoder"]
    assert "processor_config.json" not in result.files


def test_a_corrupt_processor_config_is_refused_for_the_towers_that_need_it(
    broken_processor: Path, tmp_path: Path
) -> None:
    stages = Stages()
    with pytest.raises(SpecError) as info:
        export(tmp_path / "out", model_dir=broken_processor, progress=stages)
    message = str(info.value)
    assert f"{broken_processor / 'processor_config.json'}: is not valid JSON" in message
    assert "Copy processor_config.json from the original checkpoint" in message
    assert "--modalities text" in message
    assert not stages.heavy_work_started and nothing_written(tmp_path)


@pytest.mark.parametrize(
    ("block", "value", "problem"),
    [
        ("image_processor", {"do_normalize": True, "image_mean": "0.5"}, "list of numbers"),
        ("image_processor", {"patch_size": 0}, "'patch_size' must be a whole number of at least 1"),
        ("image_processor", {"pooling_kernel_size": 2.5}, "'pooling_kernel_size' must be a whole"),
        ("feature_extractor", {"sampling_rate": 0, "frame_length": 320}, "'sampling_rate'"),
        ("feature_extractor", {"mel_floor": float("nan")}, "'mel_floor' must be a finite number"),
        ("feature_extractor", [1, 2], "'feature_extractor' must be an object"),
    ],
)
def test_bad_processor_settings_are_one_error(
    tmp_path: Path, block: str, value: Any, problem: str
) -> None:
    (tmp_path / "processor_config.json").write_text(json.dumps({block: value}))
    image = block == "image_processor"
    with pytest.raises(SpecError, match=problem):
        read_processing(tmp_path, image=image, audio=not image)
    # The other tower's settings are not read, so the same file serves it.
    read_processing(tmp_path, image=not image, audio=image)
