"""Mixture-of-experts (26B-A4B's layout) and 31B-like dense packages against transformers'
own Gemma 4 forward: prefill plus 20 decode steps, through a plain onnxruntime loop, the
engine's runner and onnxruntime-genai.

The tiny checkpoints (tests/_support/tiny_moe.py) have 4-8 experts, top-1 and top-2,
odd expert widths, per-layer embeddings on and off, and sliding windows shorter than the
run. transformers runs its own definition of the experts ("eager"); its default
"grouped_mm" refuses odd expert widths on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.genai_runner import GenaiRunner
from engine.runtime.runner import Runner, RunnerOptions
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_gemma import hf_greedy
from tests._support.tiny_moe import MOE_CONFIGS, TinyMoeModels

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
DECODE_STEPS = 20
TOLERANCE = 1e-4
MOE = sorted(name for name, config in MOE_CONFIGS.items() if config.get("enable_moe_block"))


@pytest.fixture(scope="session")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> TinyMoeModels:
    return TinyMoeModels(tmp_path_factory.mktemp("tiny_moe"))


@pytest.fixture(scope="module")
def hf_reference(moe_models: TinyMoeModels) -> Callable[[str], tuple[list[int], list[Any]]]:
    """transformers' greedy tokens and per-step logits of each tiny model, computed once."""
    runs: dict[str, tuple[list[int], list[Any]]] = {}

    def get(config: str) -> tuple[list[int], list[Any]]:
        if config not in runs:
            runs[config] = hf_greedy(moe_models.get(config)[1], PROMPT, DECODE_STEPS)
        return runs[config]

    return get


def _max_diffs(ref: list[np.ndarray], ours: list[np.ndarray]) -> list[float]:
    return [float(np.abs(a - b).max()) for a, b in zip(ref, ours, strict=True)]


@pytest.mark.parametrize(
    "options",
    [
        dict(ep="cpu", dtype="fp32", attention="gqa"),
        dict(ep="cpu", dtype="fp32", attention="standard"),
        # The WebGPU lowering (int32 I/O, explicit attention over the KV buffer), on the CPU EP.
        dict(ep="webgpu", dtype="fp32"),
    ],
    ids=["cpu-gqa", "cpu-standard", "webgpu-lowering"],
)
@pytest.mark.parametrize("config", sorted(MOE_CONFIGS))
def test_fp32_package_matches_transformers_every_step(
    moe_models: TinyMoeModels, hf_reference, tmp_path: Path, config: str, options: dict[str, Any]
):
    model_dir, _ = moe_models.get(config)
    out = tmp_path / "pkg"
    export(out, model_dir=model_dir, options=ExportOptions(**options))

    ref_tokens, ref_logits = hf_reference(config)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)

    assert len(logits) == DECODE_STEPS + 1
    diffs = _max_diffs(ref_logits, logits)
    print(f"{config} {options}: max abs logit diff {max(diffs):.2e}")
    assert max(diffs) <= TOLERANCE, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


@pytest.mark.parametrize("config", sorted(MOE_CONFIGS))
def test_runner_and_genai_match_transformers(
    moe_models: TinyMoeModels, hf_reference, tmp_path: Path, config: str
):
    """The engine's runner (shared KV buffer, as genai runs it) and onnxruntime-genai 0.18."""
    model_dir, _ = moe_models.get(config)
    out = tmp_path / "pkg"
    export(out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32"))
    new_tokens = DECODE_STEPS + 1  # the prefill's token, then 20 decode steps

    run = Runner(out, RunnerOptions(kv_mode="shared")).generate(
        PROMPT, new_tokens, keep_logits=True
    )
    ref_tokens, ref_logits = hf_reference(config)
    diffs = [float(np.abs(r[-1] - o).max()) for r, o in zip(ref_logits, run.logits, strict=True)]
    assert max(diffs) <= TOLERANCE, diffs
    assert list(run.tokens[:-1]) == ref_tokens

    genai = GenaiRunner(out).generate(PROMPT, new_tokens)
    assert genai.tokens == run.tokens


@pytest.mark.parametrize(("ep", "unique"), [("cpu", True), ("webgpu", False), ("cuda", False)])
def test_moe_lowering_follows_the_ep_flags(ep: str, unique: bool):
    """Per expert (Unique: dynamic shapes) where the EP has ``data_dependent_shapes``,
    per token (static shapes, capture-safe) elsewhere."""
    from engine.models import build_decoder, spec_from_config
    from engine.plan import plan
    from tests._support.tiny_gemma import BASE_CONFIG

    config = {**BASE_CONFIG, **MOE_CONFIGS["moe_quant"], "model_type": "gemma4_text"}
    options = ExportOptions(ep=ep, weight_bits=4, block_size=16)
    graph = build_decoder(plan(spec_from_config(config), options)).graph
    ops = [node.op_type for node in graph]
    # Shapes read from the data, not the attention mask's width (CUDA's GroupQueryAttention
    # takes total_sequence_length from the mask's shape: tests/engine/test_cuda_graph.py) nor
    # the embeddings' for the zeros CUDA's norms skip by.
    data_shapes = [
        node
        for node in graph
        if node.op_type == "Shape"
        and node.inputs[0].name != "attention_mask"
        and {c.op_type for c in node.outputs[0].consumers()} != {"ConstantOfShape"}
    ]
    assert ("Unique" in ops) == unique and bool(data_shapes) == unique
    assert ops.count("GatherBlockQuantized") == 2 * len(config["layer_types"])
    assert options.resolve().caps.data_dependent_shapes == unique


def test_runs_outlast_every_sliding_window(moe_models: TinyMoeModels):
    for name in MOE_CONFIGS:
        _, model = moe_models.get(name)
        assert len(PROMPT) + DECODE_STEPS > model.config.sliding_window, name


# ------------------------------------------------------------------ the tests can tell


@pytest.fixture
def patched_router() -> Iterator[Callable[[Callable[..., Any]], None]]:
    """Swap transformers' router forward for a variant, for one test."""
    from transformers.models.gemma4 import modeling_gemma4

    original = modeling_gemma4.Gemma4TextRouter.forward

    def patch(forward: Callable[..., Any]) -> None:
        modeling_gemma4.Gemma4TextRouter.forward = forward  # type: ignore[method-assign]

    yield patch
    modeling_gemma4.Gemma4TextRouter.forward = original  # type: ignore[method-assign]


def _router_variant(skip: str) -> Callable[..., Any]:
    """transformers' router with one step left out."""
    import torch

    def forward(self: Any, hidden_states: Any) -> Any:
        hidden_states = self.norm(hidden_states) * self.scale * self.scalar_root_size
        probs = torch.nn.functional.softmax(self.proj(hidden_states), dim=-1, dtype=torch.float32)
        weights, index = torch.topk(probs, k=self.config.top_k_experts, dim=-1)
        if skip != "renormalize":
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if skip != "per_expert_scale":
            weights = weights * self.per_expert_scale[index]
        return probs, weights, index

    return forward


@pytest.mark.parametrize("skip", ["renormalize", "per_expert_scale"])
def test_router_steps_each_move_logits_far_past_the_tolerance(
    moe_models: TinyMoeModels, patched_router, skip: str
):
    """Leaving out one routing step (the kind of slip that puts a peer exporter 0.1-0.3 off
    transformers) moves these fixtures' logits by far more than the parity tolerance, so
    the parity tests above would catch it. (Renormalizing a top-1 weight is a no-op, so
    that variant is checked on the top-2 model.)"""
    import torch

    _, model = moe_models.get("moe_top2")
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([PROMPT])).logits
        patched_router(_router_variant(skip))
        changed = model(input_ids=torch.tensor([PROMPT])).logits
    assert float((reference - changed).abs().max()) > 100 * TOLERANCE


def test_routing_spreads_tokens_over_experts(moe_models: TinyMoeModels):
    """Every MoE layer of every fixture sends the prompt's tokens to more than one expert
    (a router that always picked the same experts would test little)."""
    import torch

    for name in MOE:
        _, model = moe_models.get(name)
        chosen: list[set[int]] = []

        def record(module: Any, args: Any, output: Any, chosen: list[set[int]] = chosen) -> None:
            chosen.append(set(output[2].flatten().tolist()))

        layers = model.model.layers
        hooks = [layer.router.register_forward_hook(record) for layer in layers]
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([PROMPT]))
        finally:
            for hook in hooks:
                hook.remove()
        top_k = model.config.top_k_experts
        assert len(chosen) == len(layers)
        assert all(len(experts) > top_k for experts in chosen), (name, chosen)


def test_text_only_export_of_a_multimodal_moe_checkpoint(tmp_path: Path):
    """26B-A4B and 31B ship as ``gemma4`` checkpoints with a vision tower: their text
    decoder exports alone (``--modalities text``) and matches transformers' forward of the
    whole model on text."""
    from tests._support.tiny_moe import make_moe_mm_checkpoint

    model = make_moe_mm_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "pkg"
    options = ExportOptions(ep="cpu", dtype="fp32", modalities=("text",))
    result = export(out, model_dir=tmp_path / "ckpt", options=options)
    assert [s.name for s in result.plan.sessions] == ["decoder"]
    assert result.plan.spec.vision is not None and result.plan.spec.layers[0].moe is not None

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    assert max(_max_diffs(ref_logits, logits)) <= TOLERANCE
    assert tokens == ref_tokens
    assert list(GenaiRunner(out).generate(PROMPT, DECODE_STEPS + 1).tokens[:-1]) == ref_tokens
