"""Quantized experts: INT8 / INT4 packages compute exactly their dequantized weights, the
expert bytes are those the quantizer gives each expert alone, and WebGPU's refusal of odd
4-bit block counts is caught by the planner.

Same method as test_quantized_package.py: teacher-force the float package's 64 greedy
tokens through each package and through transformers running the package's own weights
dequantized (accuracy level 0, so the CPU's MatMulNBits keeps float32 activations).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engine.errors import OptionsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from engine.presets import load_preset
from engine.quantize import quantize
from tests._support.quantized import (
    PROMPT,
    STEPS,
    calm_model,
    checkpoint_tensors,
    dequantized_model,
    forced_logits,
    greedy_tokens,
    hf_forced_logits,
    quant_options,
)
from tests._support.tiny_moe import TinyMoeModels

MODEL = "moe_quant"


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory):
    """The calm variant (q / k norm weights x 0.25) of the tiny MoE checkpoint: the raw
    fixtures' near-hard attention amplifies float rounding at a few positions (one of 65
    steps reached 1.3e-4, the rest stay below 4.4e-5), as test_quantized_package.py found
    for dense models."""
    root = tmp_path_factory.mktemp("moe_quant")
    _, raw = TinyMoeModels(root).get(MODEL)
    calm = calm_model(raw)
    calm.save_pretrained(root / "calm")
    return root / "calm", calm


@pytest.fixture(scope="module")
def float_run(moe_model, tmp_path_factory: pytest.TempPathFactory):
    """The float package's greedy tokens and its teacher-forced logits."""
    model_dir, _ = moe_model
    out = tmp_path_factory.mktemp("moe_float") / "pkg"
    export(out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32"))
    tokens = greedy_tokens(out, PROMPT, STEPS)
    return tokens, forced_logits(out, PROMPT, tokens)


@pytest.mark.parametrize(
    "options",
    [
        quant_options(8, 8),
        quant_options(4, 4),
        quant_options(4, 8, symmetric=True, method="search"),
    ],
    ids=["w8e8", "w4e4", "w4e8-sym-search"],
)
def test_package_computes_its_dequantized_experts(moe_model, float_run, tmp_path: Path, options):
    model_dir, model = moe_model
    tokens, float_logits = float_run
    result = export(tmp_path / "pkg", model_dir=model_dir, options=options)
    experts = [w for w in result.plan.decoder.weights if w.weight.role == "experts"]
    assert experts and all(w.storage == "gbq" and w.bits == options.weight_bits for w in experts)

    ours = forced_logits(result.output, PROMPT, tokens)
    theirs = hf_forced_logits(dequantized_model(model, result), PROMPT, tokens)
    diff = float(np.abs(ours - theirs).max())
    print(f"w{options.weight_bits}e{options.embedding_bits}: vs dequantized {diff:.2e}")
    assert diff <= 1e-4, f"max abs logit difference vs the dequantized model: {diff}"
    # Quantized for real: the logits moved away from the float package's.
    assert float(np.abs(ours - float_logits).max()) > 1e-2


@pytest.mark.parametrize(
    "options",
    [
        dict(ep="cpu", dtype="fp32", weight_bits=4, block_size=16),
        # WebGPU splits the experts along their rows under a small buffer limit.
        dict(
            ep="webgpu",
            dtype="fp16",
            weight_bits=8,
            block_size=16,
            max_buffer_size=4096,
            force=True,
        ),
    ],
    ids=["cpu-int4", "webgpu-split-int8"],
)
def test_expert_bytes_are_each_experts_own_quantization(moe_model, tmp_path: Path, options):
    """Streaming quantizes the [E, N, K] tensors chunk by chunk (and piece by piece); the
    stored codes, scales and zero points are what quantizing each expert's [N, K] matrix
    on its own gives (the MatMulNBits bytes of that expert)."""
    model_dir, _ = moe_model
    result = export(tmp_path / "pkg", model_dir=model_dir, options=ExportOptions(**options))
    stored = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(result.output / "model.onnx")).graph.initializer
    }
    source = checkpoint_tensors(model_dir)
    experts = [w for w in result.plan.decoder.weights if w.weight.role == "experts"]
    assert experts
    split = 0
    for wp in experts:
        assert wp.bits is not None and wp.block_size is not None
        split += len(wp.pieces) > 1
        original = source[wp.weight.source]
        for piece in wp.pieces:
            parts = {t.part: stored[t.name] for t in piece.tensors}
            rows = slice(piece.start, piece.stop) if piece.axis == 1 else slice(None)
            for e in range(original.shape[0]):
                expected = quantize(
                    original[e, rows],
                    bits=wp.bits,
                    block_size=wp.block_size,
                    scale_dtype=np.float16 if wp.dtype == "fp16" else np.float32,
                )
                assert np.array_equal(parts["qweight"][e], expected.qweight), wp.name
                assert np.array_equal(parts["scales"][e], expected.scales), wp.name
                assert np.array_equal(parts["zero_points"][e], expected.zero_points), wp.name
    if options.get("max_buffer_size"):
        assert split == len(experts), "every expert tensor should be split under 4 KiB"


def test_webgpu_refuses_odd_4bit_block_counts():
    """onnxruntime-webgpu 1.27's GatherBlockQuantized fails at run time on 4-bit rows with
    an odd block count; the planner says so up front. 26B-A4B's experts have K = 2816
    (11 blocks of 256) and 704 (11 blocks of 64)."""
    spec = load_preset("gemma4-26b-a4b")
    with pytest.raises(OptionsError, match=r"odd count.*block-size.*\(16, 32") as error:
        plan(spec, ExportOptions(ep="webgpu", weight_bits=4, block_size=64))
    assert "layers.0.experts.down_proj" in str(error.value)
    # 8 bits, another EP, or an even block count are fine.
    plan(spec, ExportOptions(ep="webgpu", weight_bits=8, block_size=64))
    plan(spec, ExportOptions(ep="cpu", weight_bits=4, block_size=64))
    plan(spec, ExportOptions(ep="webgpu", weight_bits=4, block_size=32))


def test_experts_stay_float_where_quantized_ones_cannot_be_read():
    """DirectML has no GatherBlockQuantized: asked for 4-bit weights, the dense linears
    become MatMulNBits and the experts stay fp16, with a warning that says so."""
    result = plan(load_preset("gemma4-26b-a4b"), ExportOptions(ep="dml", weight_bits=4))
    experts = [w for w in result.decoder.weights if w.weight.role == "experts"]
    assert len(experts) == 60 and {w.storage for w in experts} == {"float"}
    assert result.decoder.weight("layers.0.mlp.up_proj.weight").storage == "matmulnbits"
    assert any("60 expert tensors" in w and "GatherBlockQuantized" in w for w in result.warnings)
