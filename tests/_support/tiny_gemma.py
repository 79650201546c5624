"""Tiny random Gemma 4 checkpoints built offline with transformers, and their reference runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

BASE_CONFIG: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    sliding_window=8,
    layer_types=["sliding_attention"] * 2
    + ["full_attention"]
    + ["sliding_attention"] * 2
    + ["full_attention"],
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    final_logit_softcapping=30.0,
    hidden_size_per_layer_input=16,
    vocab_size_per_layer_input=320,
    max_position_embeddings=256,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)


def make_checkpoint(path: Path, seed: int = 0, **overrides: Any) -> Any:
    """Save a seeded random ``Gemma4ForCausalLM`` (float32) to ``path``; returns the model.

    Weights are redrawn with a larger spread than transformers' init and norms / layer
    scalars are perturbed, so every parameter changes the logits.
    """
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    config = Gemma4TextConfig(**{**BASE_CONFIG, **overrides})
    model = Gemma4ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.06)
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.fill_(0.8)
    model.save_pretrained(path)
    make_tokenizer(path, config.vocab_size)
    return model


def make_tokenizer(path: Path, vocab_size: int) -> None:
    """A small byte-fallback BPE tokenizer (GemmaTokenizer layout) with ``vocab_size`` ids."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = len(vocab)
    for ch in "abcdefghijklmnopqrstuvwxyz▁":
        vocab[ch] = len(vocab)
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("▁", "w"), ("o", "r")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    if len(vocab) > vocab_size:
        raise ValueError(f"tokenizer needs {len(vocab)} ids, the model has {vocab_size}")
    GemmaTokenizer(vocab=vocab, merges=merges).save_pretrained(path)


def hf_greedy(model: Any, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """transformers' own forward: prefill, then ``steps`` greedy decode steps through its
    cache. Returns the generated tokens and the logits of every step ([S, V] each)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = out.cache
        logits = [out.logits[0].float().numpy()]
        tokens: list[int] = []
        for _ in range(steps):
            tokens.append(int(logits[-1][-1].argmax()))
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits[0].float().numpy())
    return tokens, logits


def rewrite_config(path: Path, **changes: Any) -> None:
    config_path = path / "config.json"
    data = json.loads(config_path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    config_path.write_text(json.dumps(data, indent=2))
