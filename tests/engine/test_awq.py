"""AWQ (``quant_method="awq"`` / ``"awq-gptq"``): activation-aware input scales, folded
into the norms and up projections, written as plain MatMulNBits bytes.

Checked against what it claims: the scale search never does worse than round to nearest
on the layer's output and does better where a few input channels carry large
activations; the folds are found in the float model's graph for each family's layout
(separate and fused projections, Gemma 3's ``1 + w`` norms, Gemma 4's per-layer
projections left alone); the scaled source reads every slice as the whole scaled tensor
would; and a package computes exactly its own weights: the dequantized linears and the
norms as stored, in transformers. Whether it helps on a trained model:
benchmarks/trained_reference.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.activation_scaling import Fold, ScaledSource, Scaling, find_folds
from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.pipeline import export
from engine.quantize import dequantize, quantize
from engine.quantize.awq import search_scales
from tests._support.quantized import dequantized_model, forced_logits, hf_forced_logits
from tests._support.tiny_gemma import hf_greedy
from tests._support.tiny_llama import make_checkpoint
from tests.engine.test_fused_weights import ArraySource

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]


def _outlier_inputs(rng: np.random.Generator, tokens: int, width: int) -> np.ndarray:
    """Activations where a few channels are an order of magnitude larger than the rest
    (what AWQ is for)."""
    loud = rng.random(width) < 0.04
    return (rng.standard_normal((tokens, width)) * np.where(loud, 20.0, 1.0)).astype(np.float32)


def _output_error(w: np.ndarray, restored: np.ndarray, x: np.ndarray) -> float:
    return float(np.mean(((restored - w) @ x.T) ** 2))


@pytest.mark.parametrize("symmetric", [False, True])
def test_the_scales_lower_the_output_error_where_inputs_have_outliers(symmetric: bool):
    rng = np.random.default_rng(0)
    x = _outlier_inputs(rng, 2048, 256)
    weights = [(rng.standard_normal((64, 256)) * 0.05).astype(np.float32) for _ in range(2)]
    h = x.T.astype(np.float64) @ x
    found = search_scales(weights, h, bits=4, block_size=32, symmetric=symmetric)
    assert found.alpha > 0 and min(found.loss) < found.loss[0]  # loss[0]: alpha 0, RTN
    for w in weights:
        kwargs = dict(bits=4, block_size=32, symmetric=symmetric, scale_dtype=np.float32)
        rtn = dequantize(quantize(w, **kwargs), bits=4, block_size=32)
        scaled = dequantize(quantize(w * found.scales, **kwargs), bits=4, block_size=32)
        # the product is unchanged (x / s against W s), the rounding is not
        assert _output_error(w, scaled / found.scales, x) < 0.8 * _output_error(w, rtn, x)


def test_round_to_nearest_is_kept_where_scaling_cannot_help():
    """Inputs of one size everywhere: alpha 0 (s = 1) is in the grid, and nothing is
    worse than it; channels that were always zero keep s = 1."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1024, 128)).astype(np.float32)
    x[:, :16] = 0
    w = (rng.standard_normal((48, 128)) * 0.05).astype(np.float32)
    found = search_scales([w], x.T.astype(np.float64) @ x, bits=4, block_size=32, symmetric=False)
    assert min(found.loss) <= found.loss[0]
    assert np.all(found.scales[:16] == 1.0) and np.all(found.scales > 0)


def test_the_scaled_source_reads_every_slice_of_the_scaled_tensors():
    rng = np.random.default_rng(2)
    arrays = {
        "q.weight": rng.standard_normal((12, 8)).astype(np.float32),
        "k.weight": rng.standard_normal((6, 8)).astype(np.float32),
        "up.weight": rng.standard_normal((10, 8)).astype(np.float32),
        "norm.weight": rng.standard_normal(8).astype(np.float32),
    }
    s, t = rng.uniform(0.5, 2, 8).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    scaling = Scaling()
    scaling.add(["q.weight", "k.weight", "up.weight"], Fold("norm.weight"), s, 8)
    scaling.add([], Fold("up.weight", (3, 7)), t, 0)
    source = ScaledSource(ArraySource(arrays), scaling)
    rows_d = np.ones(10, np.float32)
    rows_d[3:7] = t
    expected = {
        "q.weight": arrays["q.weight"] * s,
        "k.weight": arrays["k.weight"] * s,
        "up.weight": arrays["up.weight"] * s / rows_d[:, None],
        "norm.weight": arrays["norm.weight"] / s,
    }

    def weight(name: str) -> LogicalWeight:
        return LogicalWeight(name, arrays[name].shape, "linear", source=name)

    for name, want in expected.items():
        w = weight(name)
        np.testing.assert_allclose(source.read(w, 0, 0, want.shape[0]), want, rtol=1e-6)
        np.testing.assert_allclose(source.read(w, 0, 2, 5), want[2:5], rtol=1e-6)
        if want.ndim == 2:
            got = source.read(w, 1, 2, 6, rows=(1, 8))
            np.testing.assert_allclose(got, want[1:8, 2:6], rtol=1e-6)
    fused = LogicalWeight(
        "qk.weight", (18, 8), "linear", parts=(weight("q.weight"), weight("k.weight"))
    )
    both = np.concatenate([expected["q.weight"], expected["k.weight"]])
    np.testing.assert_allclose(source.read(fused, 0, 0, 18), both, rtol=1e-6)
    np.testing.assert_allclose(source.read(fused, 0, 10, 15), both[10:15], rtol=1e-6)


def _folds(name: str, **overrides: Any) -> dict[str, Fold]:
    import onnx

    from engine.calibration import _linear_inputs, float_model
    from engine.progress import CancelToken

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if name == "gemma4":
            from tests._support.tiny_gemma import make_checkpoint as make_gemma4

            make_gemma4(root / "checkpoint")
        else:
            make_checkpoint(root / "checkpoint", name, **overrides)
        model = float_model(root / "checkpoint", root / "work", CancelToken())
        proto = onnx.load(str(model), load_external_data=False)
        inputs = _linear_inputs(proto)
        return {weight: find_folds(proto, inputs).get(a) for weight, a in inputs.items()}


@pytest.mark.parametrize("name", ["qwen3", "phi3", "gemma3", "gemma4"])
def test_each_family_folds_into_its_norms_and_up_projections(name: str):
    by_weight = _folds(name)
    layer = "layers.0"
    if name == "phi3":  # fused qkv_proj and gate_up_proj, split after the MatMul
        width = 2 * 136  # gate and up, intermediate 136 each
        assert by_weight[f"{layer}.self_attn.qkv_proj.weight"] == Fold(
            f"{layer}.input_layernorm.weight"
        )
        assert by_weight[f"{layer}.mlp.gate_up_proj.weight"] == Fold(
            f"{layer}.post_attention_layernorm.weight"
        )
        assert by_weight[f"{layer}.mlp.down_proj.weight"] == Fold(
            f"{layer}.mlp.gate_up_proj.weight", (width // 2, width)
        )
    else:
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert by_weight[f"{layer}.self_attn.{proj}.weight"] == Fold(
                f"{layer}.input_layernorm.weight"
            )
        mlp_norm = "post_attention_layernorm" if name == "qwen3" else "pre_feedforward_layernorm"
        for proj in ("gate_proj", "up_proj"):
            assert by_weight[f"{layer}.mlp.{proj}.weight"] == Fold(f"{layer}.{mlp_norm}.weight")
        down = by_weight[f"{layer}.mlp.down_proj.weight"]
        assert down is not None and down.weight == f"{layer}.mlp.up_proj.weight"
        assert down.rows is not None and down.rows[0] == 0 and down.rows[1] >= 128
    # attention's output projection reads the attention, which nothing scales
    assert by_weight[f"{layer}.self_attn.o_proj.weight"] is None
    if name == "gemma4":  # the per-layer input's gate and projection: no fold either
        assert by_weight[f"{layer}.per_layer_input_gate.weight"] is None
        assert by_weight[f"{layer}.per_layer_projection.weight"] is None
    if name in ("qwen3", "phi3"):  # an untied head after the final norm
        assert by_weight["lm_head.weight"] == Fold("norm.weight")


def _loud(model: Any, norms: tuple[str, ...]) -> None:
    """Give a few channels of each of these norms' gains 8x their value: activations with
    outlier channels, as trained models have (random ones have none for AWQ to find)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(norms):
                param[::9] *= 8.0


def _stored_norms(model: Any, result: Any) -> Any:
    """The transformers model with each norm gain the package stores (AWQ divided them by
    its scales); Gemma 3's ``1 + w`` gains back to ``w``."""
    import onnx
    import torch
    from onnx import numpy_helper

    proto = onnx.load(str(result.output / "model.onnx"))
    arrays = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for wp in result.plan.decoder.weights:
            w = wp.weight
            if wp.storage == "float" and len(w.shape) == 1 and w.source in params:
                stored = arrays[wp.name].astype(np.float32) - np.float32(w.offset)
                params[w.source].copy_(torch.from_numpy(stored))
    return model


@pytest.mark.parametrize(
    ("name", "ep", "method"),
    [
        ("qwen3", "cpu", "awq"),
        ("qwen3", "cpu", "awq-gptq"),
        ("gemma3", "cpu", "awq"),
        ("phi3", "cpu", "awq"),
        ("qwen3", "webgpu", "awq"),
    ],
)
def test_an_awq_package_computes_its_own_weights(name: str, ep: str, method: str, tmp_path):
    """Everything AWQ changed is in the package's bytes: the dequantized linears (their
    columns scaled) and the norm gains (divided) run in transformers give the package's
    logits; and the norms really were divided."""
    model = make_checkpoint(tmp_path / "plain", name)
    norms = ("input_layernorm.weight", "post_attention_layernorm.weight")
    norms += ("pre_feedforward_layernorm.weight",)
    _loud(model, norms)
    model.save_pretrained(tmp_path / "checkpoint")
    for item in (tmp_path / "plain").glob("tokenizer*"):
        (tmp_path / "checkpoint" / item.name).write_bytes(item.read_bytes())
    tokens, _ = hf_greedy(model, PROMPT, 12)
    options = ExportOptions(
        ep=ep, dtype="fp32", weight_bits=4, block_size=16, accuracy_level=0, quant_method=method
    )
    result = export(tmp_path / "pkg", model_dir=tmp_path / "checkpoint", options=options)
    (note,) = [n for n in result.notes if n.startswith("AWQ: ")]
    assert " inputs scaled " in note, note
    ours = forced_logits(tmp_path / "pkg", PROMPT, tokens)
    restored = _stored_norms(dequantized_model(model, result), result)
    theirs = hf_forced_logits(restored, PROMPT, tokens)
    assert float(np.abs(ours - theirs).max()) <= 1e-4
    import torch

    layer_norm = dict(model.named_parameters())["model.layers.0.input_layernorm.weight"]
    stored = dict(restored.named_parameters())["model.layers.0.input_layernorm.weight"]
    assert not torch.allclose(layer_norm, stored)


def test_awq_needs_what_gptq_needs(tmp_path: Path):
    from engine.errors import OptionsError

    with pytest.raises(OptionsError, match=r"awq.* quantizes linear weights"):
        ExportOptions(quant_method="awq").resolve()
    with pytest.raises(OptionsError, match="random weights have none"):
        export(
            tmp_path / "random",
            preset="gemma4-tiny",
            options=ExportOptions(weight_bits=4, quant_method="awq-gptq", random_weights=True),
        )
    assert not (tmp_path / "random").exists()


def test_scaled_values_stay_float32_whatever_the_checkpoint_dtype():
    """A bf16 checkpoint's scaled gains and weights are not rounded back to bf16 before the
    package's dtype (twice rounded, up to 0.35% per gain)."""
    import ml_dtypes

    rng = np.random.default_rng(4)
    gains = rng.uniform(0.5, 2, 8).astype(ml_dtypes.bfloat16)
    scales = rng.uniform(0.3, 3, 8).astype(np.float32)
    scaling = Scaling()
    scaling.add([], Fold("norm.weight"), scales, 8)
    source = ScaledSource(ArraySource({"norm.weight": gains}), scaling)
    got = source.read(LogicalWeight("norm.weight", (8,), "norm", source="norm.weight"), 0, 0, 8)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, gains.astype(np.float32) / scales, rtol=1e-6)


def test_the_summary_says_when_awq_found_nothing_to_scale():
    from engine.calibration import Calibration

    (note,) = Calibration({}, awq=True).notes()
    assert "no quantized linear's input could take its scales" in note
    assert Calibration({}).notes() == []
