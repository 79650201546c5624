"""Checkpoint layouts users have: multimodal `gemma4` nesting, sharded safetensors with an
index, bfloat16 weights, and the older transformers config format."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]


def reference(tiny_models, tmp_path: Path) -> tuple[Path, list[int], list[np.ndarray]]:
    model_dir, _ = tiny_models.get("all_features")
    result = export(tmp_path / "reference", model_dir=model_dir, options=ExportOptions())
    tokens, logits = ort_greedy(result.output, PROMPT, 16)
    return model_dir, tokens, logits


def assert_same_run(package: Path, tokens: list[int], logits: list[np.ndarray]) -> None:
    """The package generates the reference tokens with bit-identical logits."""
    got_tokens, got_logits = ort_greedy(package, PROMPT, 16)
    assert got_tokens == tokens
    assert max(float(np.abs(a - b).max()) for a, b in zip(got_logits, logits, strict=True)) == 0.0


def test_multimodal_checkpoint_exports_its_text_decoder(tiny_models, tmp_path: Path):
    model_dir, tokens, logits = reference(tiny_models, tmp_path)
    folder = tmp_path / "multimodal"
    folder.mkdir()
    text = json.loads((model_dir / "config.json").read_text())
    config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
              "text_config": text, "vision_config": {"hidden_size": 8},
              "tie_word_embeddings": True}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {
        key.replace("model.", "model.language_model.", 1): value
        for key, value in load_file(model_dir / "model.safetensors").items()
    }
    tensors["model.vision_tower.patch_embedder.weight"] = np.zeros((4, 4), np.float32)
    tensors["model.embed_vision.embedding_projection.weight"] = np.zeros((4, 4), np.float32)
    save_file(tensors, folder / "model.safetensors")
    # The stand-in vision tensors are not a tower: ask for the text decoder alone.
    options = ExportOptions(modalities=("text",))
    result = export(tmp_path / "pkg", model_dir=folder, options=options)
    assert result.plan.spec.source_model_type == "gemma4"
    assert_same_run(result.output, tokens, logits)


def test_sharded_checkpoint_with_index(tiny_models, tmp_path: Path):
    model_dir, tokens, logits = reference(tiny_models, tmp_path)
    folder = tmp_path / "sharded"
    shutil.copytree(model_dir, folder)
    (folder / "model.safetensors").unlink()
    tensors = load_file(model_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same_run(export(tmp_path / "pkg", model_dir=folder).output, tokens, logits)


def test_bfloat16_checkpoint_is_read_through_ml_dtypes(tiny_models, tmp_path: Path):
    model_dir, _, _ = reference(tiny_models, tmp_path)
    folder = tmp_path / "bf16"
    shutil.copytree(model_dir, folder)
    tensors = load_file(model_dir / "model.safetensors")
    rounded = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
    # safetensors' numpy API has no bfloat16: write the file the way torch does, by hand.
    header, offset, blobs = {}, 0, []
    for key, value in rounded.items():
        data = value.tobytes()
        header[key] = {"dtype": "BF16", "shape": list(value.shape),
                       "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    with (folder / "model.safetensors").open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
    # The same weights rounded to bfloat16 and stored as float32 must give the same package.
    as_fp32 = tmp_path / "bf16_as_fp32"
    shutil.copytree(model_dir, as_fp32)
    save_file({k: v.astype(np.float32) for k, v in rounded.items()}, as_fp32 / "model.safetensors")
    a = export(tmp_path / "a", model_dir=folder)
    b = export(tmp_path / "b", model_dir=as_fp32)
    assert (a.output / "model.onnx.data").read_bytes() == (
        b.output / "model.onnx.data"
    ).read_bytes()


@pytest.mark.parametrize("name", ["qwen3", "phi3", "gemma3", "llama"])
def test_bf16_shards_saved_by_transformers_for_every_family(tmp_path: Path, name: str):
    """How the published checkpoints of the other families are stored: bfloat16, in shards
    with an index, written by transformers itself (Phi-3's fused qkv_proj / gate_up_proj
    split across shards too). The package equals the one from the same bf16-rounded weights
    saved as one float32 file, byte for byte."""
    import torch

    from tests._support.tiny_llama import make_checkpoint

    model = make_checkpoint(tmp_path / "source", name)
    shards = tmp_path / "bf16"
    model.to(torch.bfloat16).save_pretrained(shards, max_shard_size="40KB")
    assert len(list(shards.glob("*.safetensors"))) > 2
    assert (shards / "model.safetensors.index.json").is_file()
    whole = tmp_path / "fp32"
    model.to(torch.float32).save_pretrained(whole)
    for folder in (shards, whole):
        for extra in (tmp_path / "source").glob("tokenizer*"):
            shutil.copy(extra, folder)
    a = export(tmp_path / "a", model_dir=shards)
    b = export(tmp_path / "b", model_dir=whole)
    assert (a.output / "model.onnx.data").read_bytes() == (
        b.output / "model.onnx.data"
    ).read_bytes()
