"""The shared decoder components follow the spec, not Gemma 4's constants: the attention
scale (``LayerSpec.query_scale``; Gemma 4 is 1.0) and the MLP activation. Each is checked
against transformers' own forward with the same change made to its modules, through every
attention lowering (GroupQueryAttention, standard ops, WebGPU's static buffers with the
scores as an Einsum, or as one Gemm for one KV head)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import pipeline
from engine.options import ExportOptions
from engine.spec import ModelSpec
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_gemma import hf_greedy

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
STEPS = 12  # 24 positions: past every tiny sliding window

LOWERINGS = [
    ("cpu", "gqa", "all_features"),
    ("cpu", "standard", "all_features"),
    ("webgpu", "gqa", "all_features"),  # static buffers, scores as an Einsum
    ("webgpu", "gqa", "mqa"),  # static buffers, scores as one Gemm (alpha)
]


def _export_changed(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path, out: Path, change: Any, **options: Any
) -> Any:
    """Export ``model_dir`` with ``change(spec)`` applied to the spec its config gives."""
    original = pipeline.load_model_spec

    def changed(*args: Any) -> ModelSpec:
        return change(original(*args))

    monkeypatch.setattr(pipeline, "load_model_spec", changed)
    return pipeline.export(out, model_dir=model_dir, options=ExportOptions(dtype="fp32", **options))


def _assert_same_as_transformers(model: Any, package: Path) -> None:
    ref_tokens, ref_logits = hf_greedy(model, PROMPT, STEPS)
    tokens, logits = ort_greedy(package, PROMPT, STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


@pytest.mark.parametrize(("ep", "attention", "config"), LOWERINGS)
def test_the_usual_attention_scale_matches_transformers(
    tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ep: str, attention: str,
    config: str,
):  # fmt: skip
    model_dir, original = tiny_models.get(config)
    model = copy.deepcopy(original)  # the fixture's model serves other tests
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.head_dim**-0.5

    def usual_scale(spec: ModelSpec) -> ModelSpec:
        return replace(spec, layers=tuple(replace(x, query_scale=None) for x in spec.layers))

    out = tmp_path / "pkg"
    result = _export_changed(monkeypatch, model_dir, out, usual_scale, ep=ep, attention=attention)
    assert {x.attention_scale for x in result.plan.spec.layers} == {16**-0.5, 32**-0.5}
    _assert_same_as_transformers(model, out)
    # The scale is really applied: transformers at Gemma 4's 1.0 disagrees.
    _, gemma_logits = hf_greedy(original, PROMPT, 0)
    _, logits = ort_greedy(out, PROMPT, 0)
    assert float(np.abs(gemma_logits[0] - logits[0]).max()) > 1e-2


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_the_mlp_activation_the_spec_names_matches_transformers(
    tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, activation: str
):
    from transformers.activations import ACT2FN

    model_dir, original = tiny_models.get("all_features")
    model = copy.deepcopy(original)
    for module in model.modules():
        if hasattr(module, "act_fn"):  # each MLP and the per-layer input gate
            module.act_fn = ACT2FN[activation]
    out = tmp_path / "pkg"

    def with_activation(spec: ModelSpec) -> ModelSpec:
        return replace(spec, hidden_activation=activation)

    _export_changed(monkeypatch, model_dir, out, with_activation, ep="cpu")
    _assert_same_as_transformers(model, out)


SCALED_ROPES = {
    "llama3": {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 2.0},
}  # fmt: skip


@pytest.mark.parametrize("ep", ["cpu", "webgpu"])
@pytest.mark.parametrize("rope", sorted(SCALED_ROPES))
def test_scaled_rope_matches_transformers(tmp_path: Path, rope: str, ep: str):
    """llama3, yarn (cos and sin scaled by its attention factor) and linear RoPE on the
    sliding layers (yarn on the full ones too), against transformers' Gemma 4 with the same
    ``rope_parameters``; the WebGPU lowering runs on the CPU EP."""
    import warnings

    from tests._support.tiny_gemma import make_checkpoint

    sliding = SCALED_ROPES[rope]
    full = (
        sliding
        if rope == "yarn"
        else {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    )
    with warnings.catch_warnings():  # yarn's factor is not max / original here, on purpose
        warnings.simplefilter("ignore")
        model = make_checkpoint(
            tmp_path / "model",
            rope_parameters={"sliding_attention": sliding, "full_attention": full},
        )
    out = tmp_path / "pkg"
    result = pipeline.export(
        out, model_dir=tmp_path / "model", options=ExportOptions(ep=ep, dtype="fp32")
    )
    assert result.plan.spec.rope["sliding"].kind == rope
    _assert_same_as_transformers(model, out)
