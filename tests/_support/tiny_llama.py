"""Tiny random Llama, Mistral, Qwen2, Qwen3, SmolLM3, Phi-3 / Phi-4 and Gemma 3 checkpoints built
offline with transformers.

Odd widths on purpose (hidden 72, MLP 136, vocab 331): nothing may assume powers of two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests._support.tiny_gemma import make_tokenizer

BASE: dict[str, Any] = dict(
    vocab_size=331,
    hidden_size=72,
    intermediate_size=136,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    tie_word_embeddings=False,
)

CONFIGS: dict[str, dict[str, Any]] = {
    # Llama 3.2's shape: llama3 RoPE scaling, GQA, untied head.
    "llama": dict(
        model_type="llama",
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500_000.0,
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=16,
        ),
    ),
    # Llama with biases on every attention projection, MQA, a tied head.
    "llama_bias_mqa": dict(
        model_type="llama", attention_bias=True, num_key_value_heads=1, tie_word_embeddings=True
    ),
    # Qwen2.5: q/k/v biases, tied head, theta 1e6, no GQA (5 heads, 5 KV heads, head_dim
    # from hidden / heads); hidden 80 = 5 blocks of 16, so the quantized tied head
    # (MatMulNBits over the table's columns) has whole blocks.
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=80,
        num_attention_heads=5,
        num_key_value_heads=5,
        head_dim=None,
        tie_word_embeddings=True,
        rope_parameters=dict(rope_theta=1e6),
    ),
    # Qwen3: q/k norms, head_dim != hidden / heads.
    "qwen3": dict(model_type="qwen3", head_dim=48, rope_parameters=dict(rope_theta=1e6)),
    # Mistral v0.1: a sliding window on every layer, shorter than the runs.
    "mistral": dict(model_type="mistral", sliding_window=8, num_key_value_heads=1),
    # Qwen3 with sliding layers above max_window_layers (layer_types), window 8.
    "qwen3_sliding": dict(
        model_type="qwen3", use_sliding_window=True, sliding_window=8, max_window_layers=1
    ),
    # SmolLM3: the middle layer has no RoPE, tied head, biases; its no-RoPE layer slides.
    "smollm3": dict(
        model_type="smollm3",
        no_rope_layers=[1, 0, 1],
        attention_bias=True,
        tie_word_embeddings=True,
        head_dim=None,
        hidden_size=64,
        use_sliding_window=True,
        sliding_window=8,
    ),
    # Phi-3 mini's shape: q/k/v and gate/up fused in the checkpoint, a window on every layer
    # (mini-4k's is 2047), head_dim from hidden / heads, untied head.
    "phi3": dict(model_type="phi3", head_dim=None, hidden_size=64, sliding_window=8),
    # Phi-4-mini's shape: RoPE on the first 3/4 of each head (partial_rotary_factor), longrope
    # whose original length (16) the runs pass (short factors, then long ones, and cos / sin
    # scaled by sqrt(1 + ln(256 / 16) / ln 16)), GQA, tied head, q/k/v and gate/up fused.
    "phi4": dict(
        model_type="phi3",
        head_dim=None,
        hidden_size=128,  # head_dim 32: 24 channels rotate (12 pairs), 8 pass
        tie_word_embeddings=True,
        partial_rotary_factor=0.75,
        original_max_position_embeddings=16,
        rope_parameters=dict(
            rope_type="longrope",
            rope_theta=10_000.0,
            partial_rotary_factor=0.75,
            original_max_position_embeddings=16,
            short_factor=[1.0, 1.0, 1.02, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 1.8, 2.0],
            long_factor=[1.0, 1.2, 1.5, 1.9, 2.8, 3.5, 4.1, 6.0, 8.7, 12.6, 15.0, 18.3],
        ),
    ),
    # Gemma 3 (4B's shape): four norms per layer that scale by 1 + w, q/k norms, sliding
    # and full layers with their own RoPE (linear scaling on the full ones), attention
    # scaled by query_pre_attn_scalar ** -0.5 (not head_dim's), tanh-GELU, tied head,
    # embeddings scaled by sqrt(hidden).
    "gemma3": dict(
        model_type="gemma3_text",
        hidden_size=80,  # 5 blocks of 16: the quantized tied head has whole blocks
        tie_word_embeddings=True,
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    ),
}

_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}


def make_checkpoint(path: Path, name: str, seed: int = 0, **overrides: Any) -> Any:
    """Save the seeded random model :data:`CONFIGS` names (float32) to ``path``, with a
    tokenizer; returns the model. Weights are redrawn wider than transformers' init and
    norms perturbed (biases too), so every parameter changes the logits."""
    import torch
    import transformers

    settings = {**BASE, **CONFIGS[name], **overrides}
    settings = {key: value for key, value in settings.items() if value is not None}
    model_type = settings.pop("model_type")
    config_class, model_class = (getattr(transformers, n) for n in _CLASSES[model_type])
    torch.manual_seed(seed)
    config = config_class(**settings)
    model = model_class(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.08)
    model.save_pretrained(path)
    make_tokenizer(path, config.vocab_size)
    return model
