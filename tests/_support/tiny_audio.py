"""Tiny multimodal Gemma 4 checkpoints with audio towers of several shapes, their
exports, and the speech session against transformers' ``get_audio_features`` (shared by
tests/engine/test_audio.py and benchmarks/audio_parity.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from engine.options import ExportOptions
from engine.pipeline import ExportResult, export
from tests._support.tiny_gemma_mm import make_mm_checkpoint, random_features

AUDIO_CONFIGS: dict[str, dict[str, Any]] = {
    # The tiny default: chunk 4, left context 5, no right context, clipped linears.
    "default": {},
    "right_context": dict(
        attention_chunk_size=4,
        attention_context_left=5,
        attention_context_right=3,
        num_hidden_layers=3,
    ),
    "wide_chunk_unclipped": dict(
        attention_chunk_size=8,
        attention_context_left=2,
        attention_context_right=2,
        use_clipped_linears=False,
    ),
    # Allowed distances reach past the C // 2 + 1 rows of the relative-position table.
    "short_position_table": dict(attention_chunk_size=2, attention_context_left=8),
    # No past context: no row has an allowed key, every row takes the uniform weights.
    "no_past_context": dict(attention_chunk_size=3, attention_context_left=1),
    # E2B's windows (chunk 12, left 13), 4 heads, a config eps unlike the fixed 1e-6.
    "e2b_windows": dict(
        attention_chunk_size=12,
        attention_context_left=13,
        num_attention_heads=4,
        rms_norm_eps=1e-3,
        conv_kernel_size=3,
    ),
}
E2B_AUDIO_CONFIG: dict[str, Any] = dict(
    # google/gemma-4-E2B-it config.json, audio_config (copied November 30).
    attention_chunk_size=12,
    attention_context_left=13,
    attention_context_right=0,
    attention_invalid_logits_value=-1.0e9,
    attention_logit_cap=50.0,
    conv_kernel_size=5,
    gradient_clipping=1.0e10,
    hidden_act="silu",
    hidden_size=1024,
    num_attention_heads=8,
    num_hidden_layers=12,
    output_proj_dims=1536,
    residual_weight=0.5,
    rms_norm_eps=1e-6,
    subsampling_conv_channels=[128, 32],
    use_clipped_linears=True,
)

CLIPS: list[tuple[int, int | None, tuple[int, int] | None]] = [
    (61, None, (10, 40)),  # frames, valid prefix, a hole of invalid frames
    (37, 30, None),
    (9, None, None),
    (130, 111, None),
    (1, None, None),
]


class AudioModels:
    """Tiny checkpoints (one per config) and their exports, each made once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, tuple[Path, Any]] = {}
        self._exports: dict[tuple[str, ExportOptions], ExportResult] = {}

    def model(self, name: str) -> tuple[Path, Any]:
        if name not in self._models:
            path = self.root / name
            seed = list(AUDIO_CONFIGS).index(name)
            # genai 0.18 runs a speech session only beside a vision one: keep the tiny tower.
            model = make_mm_checkpoint(path, seed, audio=AUDIO_CONFIGS[name])
            self._models[name] = (path, model)
        return self._models[name]

    def export(self, name: str, options: ExportOptions) -> ExportResult:
        if (name, options) not in self._exports:
            out = self.root / f"pkg{len(self._exports)}"
            result = export(out, model_dir=self.model(name)[0], options=options)
            self._exports[name, options] = result
        return self._exports[name, options]


def clips(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input_features, input_features_mask) for every entry of :data:`CLIPS`."""
    rng = np.random.default_rng(seed)
    out = []
    for frames, valid, hole in CLIPS:
        features, mask = random_features(rng, frames, valid)
        if hole is not None:
            mask[0, hole[0] : hole[1]] = False
        out.append((features, mask))
    return out


def hf_features(model: Any, features: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' audio features with the padding dropped: [valid tokens, hidden]."""
    import torch

    with torch.no_grad():
        out = model.model.get_audio_features(
            torch.from_numpy(features), torch.from_numpy(mask), return_dict=True
        )
    return out.pooler_output[out.attention_mask].float().numpy()


def speech_session(result: ExportResult) -> ort.InferenceSession:
    path = result.output / result.plan.session("speech").filename
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def max_errors(model: Any, result: ExportResult) -> list[float]:
    """Max |package - transformers| per clip; asserts the shapes match first."""
    session = speech_session(result)
    errors = []
    for features, mask in clips():
        expected = hf_features(model, features, mask)
        feeds = {"input_features": features, "input_features_mask": mask}
        got = session.run(None, feeds)[0].astype(np.float32)
        assert got.shape == expected.shape, (got.shape, expected.shape)
        errors.append(float(np.abs(got - expected).max()))
    return errors
