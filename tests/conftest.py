"""Shared fixtures: tiny Gemma 4 checkpoints built offline, cached per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Named tiny configs used across tests; together they cover sliding windows shorter than
# the runs, KV sharing on and off, per-layer embeddings on and off, double-wide MLPs,
# softcapping, k==v full-attention layers and multi-query attention.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "all_features": {},
    "plain": dict(
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        final_logit_softcapping=None,
    ),
    "k_eq_v": dict(attention_k_eq_v=True, num_global_key_value_heads=1, sliding_window=4),
    "mqa": dict(
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        sliding_window=16,
        num_hidden_layers=5,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        use_double_wide_mlp=False,
    ),
    "untied": dict(tie_word_embeddings=False, num_kv_shared_layers=0),
}


class TinyModels:
    """Builds each named tiny checkpoint once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, Any] = {}

    def get(self, name: str) -> tuple[Path, Any]:
        from tests._support.tiny_gemma import make_checkpoint

        path = self.root / name
        if name not in self._models:
            self._models[name] = make_checkpoint(path, **TINY_CONFIGS[name])
        return path, self._models[name]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))
