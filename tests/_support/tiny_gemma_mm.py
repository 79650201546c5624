"""Tiny random multimodal Gemma 4 checkpoints (``Gemma4ForConditionalGeneration``) built
offline with transformers, plus inputs for their towers: no downloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests._support.tiny_gemma import BASE_CONFIG

TOKENS = dict(
    boi_token_id=302,
    eoi_token_id=303,
    image_token_id=300,
    audio_token_id=301,
    boa_token_id=304,
    eoa_token_index=305,
    video_token_id=306,
)
VISION: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    patch_size=16,
    pooling_kernel_size=3,
    position_embedding_size=64,
    use_clipped_linears=True,
    rope_parameters={"rope_type": "default", "rope_theta": 100.0},
)
AUDIO: dict[str, Any] = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    output_proj_dims=32,
    subsampling_conv_channels=[128, 32],
    conv_kernel_size=5,
    attention_chunk_size=4,
    attention_context_left=5,
    attention_context_right=0,
)


def make_mm_checkpoint(
    path: Path,
    seed: int = 0,
    *,
    vision: dict[str, Any] | bool = True,
    audio: dict[str, Any] | bool = True,
    text: dict[str, Any] | None = None,
    clip: float | None = 4.0,
    max_soft_tokens: int = 70,
) -> Any:
    """Save a seeded random ``Gemma4ForConditionalGeneration`` (float32) to ``path``.

    ``vision`` / ``audio``: True for the default tiny tower, a dict of overrides, or
    False for none. Weights are redrawn with a spread that makes every parameter matter;
    clip bounds (where the towers have them) are set to +-``clip`` so the clamps act.
    Returns the model (eval mode).
    """
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    vision_config = (
        None if vision is False else {**VISION, **(vision if isinstance(vision, dict) else {})}
    )
    audio_config = (
        None if audio is False else {**AUDIO, **(audio if isinstance(audio, dict) else {})}
    )
    config = Gemma4Config(
        text_config={**BASE_CONFIG, "max_position_embeddings": 512, **(text or {})},
        vision_config=vision_config,
        audio_config=audio_config,
        **TOKENS,
    )
    model = Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif "per_dim_scale" in name:
                param.copy_(0.3 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.06)
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.fill_(0.8)
            elif clip is not None and name.endswith(("input_min", "output_min")):
                buf.fill_(-clip)
            elif clip is not None and name.endswith(("input_max", "output_max")):
                buf.fill_(clip)
    model.save_pretrained(path)
    make_mm_tokenizer(path, config.text_config.vocab_size)
    write_processor_config(path, max_soft_tokens=max_soft_tokens)
    return model


def write_processor_config(path: Path, max_soft_tokens: int = 70) -> None:
    """The checkpoint's processor settings, as Hugging Face's processor_config.json keeps
    them (a small image token budget keeps tiny prompts short)."""
    import json

    data = {
        "processor_class": "Gemma4Processor",
        "image_processor": {
            "image_processor_type": "Gemma4ImageProcessor",
            "do_normalize": False,
            "image_mean": [0.0, 0.0, 0.0],
            "image_std": [1.0, 1.0, 1.0],
            "max_soft_tokens": max_soft_tokens,
            "patch_size": 16,
            "pooling_kernel_size": 3,
        },
        "feature_extractor": {
            "feature_extractor_type": "Gemma4AudioFeatureExtractor",
            "feature_size": 128,
            "sampling_rate": 16000,
            "frame_length": 320,
            "hop_length": 160,
            "fft_length": 512,
            "min_frequency": 0.0,
            "max_frequency": 8000.0,
            "mel_floor": 0.001,
            "preemphasis": 0.0,
            "preemphasis_htk_flavor": True,
            "fft_overdrive": False,
            "dither": 0.0,
            "input_scale_factor": 1.0,
        },
    }
    (path / "processor_config.json").write_text(json.dumps(data, indent=2))


MARKERS = {
    "<|image>": TOKENS["boi_token_id"],
    "<|image|>": TOKENS["image_token_id"],
    "<image|>": TOKENS["eoi_token_id"],
    "<|audio>": TOKENS["boa_token_id"],
    "<|audio|>": TOKENS["audio_token_id"],
    "<audio|>": TOKENS["eoa_token_index"],
}
"""Gemma 4's image / audio marker strings at this tiny model's ids (genai finds them by string)."""


def make_mm_tokenizer(path: Path, vocab_size: int, markers: dict[str, int] | None = None) -> None:
    """The tiny byte-fallback BPE tokenizer of tests._support.tiny_gemma, plus Gemma 4's
    image / audio marker tokens as special tokens at the config's ids (``markers``, by
    default this tiny model's; unused tokens fill the ids between them, so a full-size
    model's ids work too)."""
    from transformers import GemmaTokenizer

    markers = MARKERS if markers is None else markers
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = len(vocab)
    for ch in "abcdefghijklmnopqrstuvwxyz▁":
        vocab[ch] = len(vocab)
    for text, index in sorted(markers.items(), key=lambda item: item[1]):
        if index < len(vocab):
            raise ValueError(f"marker {text} must get id {index}, the next free id is {len(vocab)}")
        while len(vocab) < index:
            vocab[f"<unused{len(vocab)}>"] = len(vocab)
        vocab[text] = index
    if len(vocab) > vocab_size:
        raise ValueError(f"tokenizer needs {len(vocab)} ids, the model has {vocab_size}")
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": list(markers)})
    tokenizer.save_pretrained(path)


def random_patches(
    rng: np.random.Generator, width_patches: int, height_patches: int, pad_to: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """pixel_values [1, N, 768] in [0, 1] and pixel_position_ids [1, N, 2] (x, y) for an
    image of ``width_patches`` x ``height_patches`` patches (row-major), padded with
    (-1, -1) positions and zero pixels up to ``pad_to`` patches."""
    count = width_patches * height_patches
    total = pad_to or count
    pixels = np.zeros((1, total, 768), dtype=np.float32)
    pixels[0, :count] = rng.random((count, 768), dtype=np.float32)
    positions = np.full((1, total, 2), -1, dtype=np.int64)
    ys, xs = np.divmod(np.arange(count), width_patches)
    positions[0, :count, 0] = xs
    positions[0, :count, 1] = ys
    return pixels, positions


def random_features(
    rng: np.random.Generator, frames: int, valid: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """input_features [1, T, 128] (log-mel-like values) and input_features_mask [1, T] bool
    with the first ``valid`` frames valid."""
    features = rng.normal(0.0, 1.0, (1, frames, 128)).astype(np.float32)
    mask = np.zeros((1, frames), dtype=bool)
    mask[0, : frames if valid is None else valid] = True
    return features, mask
