"""Tiny random Gemma 4 checkpoints with mixture-of-experts layers (26B-A4B's layout) and a
tiny 31B-like dense one, built offline with transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests._support.tiny_gemma import make_checkpoint

# Each runs past its sliding window (prompt 12 + 20 steps = 32 positions).
MOE_CONFIGS: dict[str, dict[str, Any]] = {
    # 4 experts, top-1, an odd expert width, per-layer embeddings and KV sharing.
    "moe_top1_ple": dict(
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=1,
        moe_intermediate_size=23,
    ),
    # 8 experts, top-2, odd width, no per-layer embeddings: 26B-A4B's shape in small
    # (k == v full layers with their own KV-head count, no KV sharing, window 4).
    "moe_top2": dict(
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=37,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        sliding_window=4,
    ),
    # A width 4-bit block-16 quantization takes (96 = 6 x 16: an even block count, which
    # WebGPU's GatherBlockQuantized needs), 6 experts, top-2.
    "moe_quant": dict(
        enable_moe_block=True,
        num_experts=6,
        top_k_experts=2,
        moe_intermediate_size=96,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
    ),
    # 31B's features in small: k == v full layers, fewer KV heads on them, no per-layer
    # embeddings, no KV sharing, a sliding window shorter than the run.
    "dense_31b": dict(
        num_attention_heads=8,
        num_key_value_heads=4,
        num_global_key_value_heads=2,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        sliding_window=6,
    ),
}

ROUTER_STD = 1.0
"""Spread of the router projection's weights: router scores of about unit spread, so the
top-k choice is decisive (the fixture's 0.06 would leave near ties that any float rounding
flips, in transformers as in an export)."""


def make_moe_checkpoint(path: Path, name: str, seed: int = 0) -> Any:
    """Save the named tiny checkpoint to ``path``; returns the transformers model."""
    return _decisive_router(make_checkpoint(path, seed=seed, **MOE_CONFIGS[name]), path, seed)


def make_moe_mm_checkpoint(path: Path, name: str = "moe_top2", seed: int = 0) -> Any:
    """A multimodal checkpoint shaped like 26B-A4B's (``gemma4`` with a vision tower and no
    audio tower) around the named text config; returns the transformers model."""
    from tests._support.tiny_gemma_mm import make_mm_checkpoint

    model = make_mm_checkpoint(path, seed, vision=True, audio=False, text=MOE_CONFIGS[name])
    return _decisive_router(model, path, seed)


def _decisive_router(model: Any, path: Path, seed: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith("router.proj.weight"):
                param.copy_(ROUTER_STD * torch.randn(param.shape, generator=generator))
            elif key.endswith(("router.scale", "router.per_expert_scale")):
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(path)
    if model.config.get_text_config().enable_moe_block:
        # transformers' own definition of the experts (Gemma4TextExperts.forward); its
        # default "grouped_mm" refuses odd expert widths on the CPU ("strides should be
        # multiple of 16 bytes").
        model.set_experts_implementation("eager")
    return model


class TinyMoeModels:
    """Builds each named checkpoint once per test session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, Any] = {}

    def get(self, name: str) -> tuple[Path, Any]:
        path = self.root / name
        if name not in self._models:
            self._models[name] = make_moe_checkpoint(path, name)
        return path, self._models[name]
