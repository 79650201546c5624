"""Plans of the 26B-A4B and 31B presets, checked against arithmetic on transformers' own
tensor shapes; written tiny MoE packages checked against their plans byte for byte.

The full-size presets are checked by arithmetic here: transformers 5.24 builds
``Gemma4ForCausalLM`` from each preset on the meta device (no memory), and every tensor's
bytes are computed from its shape with the storage formulas of DESIGN.md section 3,
independently of the planner. A random-weights 26B-A4B package written to disk is
checked byte for byte by benchmarks/moe_export.py (15 GB: too large for the test suite).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import ExportPlan, plan
from engine.presets import load_preset, preset_config
from engine.spec import MoeSpec
from tests._support.cli import cli
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_moe import TinyMoeModels

PRESETS = ["gemma4-26b-a4b", "gemma4-31b"]
MIB = 1024**2


@pytest.fixture(scope="module")
def transformers_shapes() -> dict[str, dict[str, tuple[int, ...]]]:
    """Checkpoint key -> shape of every tensor transformers' Gemma4ForCausalLM keeps for
    each preset (parameters, and the ``layer_scalar`` buffers it saves)."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    out = {}
    for name in PRESETS:
        config = {k: v for k, v in preset_config(name).items() if k != "architectures"}
        with torch.device("meta"):
            model = Gemma4ForCausalLM(Gemma4TextConfig(**config))
        shapes = {key: tuple(p.shape) for key, p in model.named_parameters()}
        shapes.update(
            {key: tuple(b.shape) for key, b in model.named_buffers() if "layer_scalar" in key}
        )
        out[name] = shapes
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_tensors_are_transformers_tensors(preset: str, transformers_shapes):
    """Every tensor the plan reads is one transformers has, with its shape, and the plan
    reads all of them (the tied LM head is the token embedding)."""
    export_plan = plan(load_preset(preset), ExportOptions())
    ours = {
        w.weight.source: w.weight.shape
        for w in export_plan.decoder.weights
        if w.weight.source is not None and not w.shares
    }
    assert ours == transformers_shapes[preset]


def test_moe_fields_are_read_and_checked():
    from engine.errors import SpecError
    from engine.models import spec_from_config

    spec = load_preset("gemma4-26b-a4b")
    assert {layer.moe for layer in spec.layers} == {MoeSpec(128, 8, 704)}
    assert {layer.intermediate_size for layer in spec.layers} == {2112}
    full = [layer for layer in spec.layers if layer.attention == "full"]
    assert {(layer.head_dim, layer.num_kv_heads, layer.k_eq_v) for layer in full} == {
        (512, 2, True)
    }
    assert all(layer.moe is None for layer in load_preset("gemma4-31b").layers)
    config = preset_config("gemma4-26b-a4b")
    for change, message in (
        ({"top_k_experts": 129}, "top_k_experts \\(129\\) exceeds num_experts \\(128\\)"),
        ({"moe_intermediate_size": None}, "needs a positive 'moe_intermediate_size'"),
        ({"num_experts": 0}, "needs a positive 'num_experts', got 0"),
    ):
        with pytest.raises(SpecError, match=message):
            spec_from_config({**config, **change})


def _dtype_bytes(dtype: str) -> int:
    return {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]


def _blocked(rows: int, cols: int, bits: int, block: int, scale_bytes: int, zp: bool) -> int:
    """Codes, scales and (packed) zero points of a [rows, cols] weight quantized along cols."""
    blocks = cols // block
    zero_points = rows * math.ceil(blocks * bits / 8) if zp else 0
    return rows * cols * bits // 8 + rows * blocks * scale_bytes + zero_points


def expected_bytes(
    key: str, shape: tuple[int, ...], options: ExportOptions, dtype: str | None = None
) -> int:
    """A checkpoint tensor's bytes in a package, from DESIGN.md's storage rules (``dtype``:
    a float tensor the package keeps in another dtype than its own)."""
    options = options.resolve()
    size = _dtype_bytes(dtype or options.dtype or "fp32")
    rows, cols = math.prod(shape[:-1]), shape[-1] if shape else 1
    weight_bits, block = options.weight_bits, options.block_size
    if key.endswith(("experts.gate_up_proj", "experts.down_proj")) and weight_bits:
        return _blocked(rows, cols, weight_bits, block, size, zp=True)
    if key.endswith("embed_tokens.weight") and options.embedding_bits:
        assert options.embedding_block_size is not None
        bits, emb_block = options.embedding_bits, options.embedding_block_size
        return _blocked(rows, cols, bits, emb_block, size, zp=True)
    is_linear = len(shape) == 2 and "embed_tokens" not in key and "router.proj" not in key
    if is_linear and weight_bits:
        return _blocked(rows, cols, weight_bits, block, size, zp=not options.symmetric)
    return math.prod(shape) * size


def _rope_bytes(export_plan: ExportPlan, options: ExportOptions) -> int:
    """cos + sin caches: [positions, head_dim / 2] in the package's dtype; for kinds on
    static buffers fp32 (CUDA's layers wider than its GQA serves), over the rotated pairs
    only under WebGPU's static capture graph: a proportional-RoPE full layer rotates a
    quarter of them."""
    from engine.graph.attention import static_kinds

    spec = export_plan.spec
    static = static_kinds(spec, export_plan.options)
    size = _dtype_bytes(options.resolve().dtype or "fp32")
    total = 0
    for kind, d in {layer.attention: layer.head_dim for layer in spec.layers}.items():
        cols = d // 2
        if (
            export_plan.caps.explicit_attention_over_cache
            and spec.rope[kind].kind == "proportional"
        ):
            cols = int(spec.rope[kind].partial_rotary_factor * d // 2)
        total += 2 * export_plan.context_length * cols * (4 if kind in static else size)
    return total


def _planned_and_expected(
    export_plan: ExportPlan, options: ExportOptions, shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """Planned and expected bytes per stored tensor (checkpoint key, or a fused weight's
    name), and every checkpoint key read. A fused projection (WebGPU's Q/K/V, gate/up) is
    its parts' rows, quantized per row: its bytes are the parts'. A fused per-head norm
    table holds each head's scale (ones for V) in its own dtype."""
    planned, expected, read = {}, {}, set()
    for w in export_plan.decoder.weights:
        weight = w.weight
        if w.shares:  # the tied LM head has no bytes of its own
            continue
        if weight.parts:
            sources = [p.source for p in weight.parts if p.source is not None]
            read.update(sources)
            planned[weight.name] = w.nbytes
            if weight.role == "norm":
                heads = sum(p.repeat for p in weight.parts)
                width = shapes[sources[0]][-1]
                size = _dtype_bytes(weight.dtype or options.resolve().dtype or "fp32")
                expected[weight.name] = heads * width * size
            else:
                expected[weight.name] = sum(
                    expected_bytes(key, shapes[key], options) for key in sources
                )
        elif weight.source:
            read.add(weight.source)
            planned[weight.source] = w.nbytes
            expected[weight.source] = expected_bytes(
                weight.source, shapes[weight.source], options, weight.dtype
            )
    return planned, expected, read


OPTIONS = {
    "cpu-fp32": ExportOptions(ep="cpu"),
    "cpu-int8": ExportOptions(ep="cpu", weight_bits=8, embedding_bits=8),
    "cpu-int4": ExportOptions(ep="cpu", weight_bits=4, embedding_bits=4),
    "cuda-fp16": ExportOptions(ep="cuda"),
    "cuda-int4-sym": ExportOptions(ep="cuda", weight_bits=4, embedding_bits=4, symmetric=True),
    "webgpu-fp16": ExportOptions(ep="webgpu"),
    "webgpu-int8": ExportOptions(ep="webgpu", weight_bits=8, embedding_bits=8),
    "webgpu-int4": ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4),
}


@pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
@pytest.mark.parametrize("preset", PRESETS)
def test_plan_bytes_equal_arithmetic(preset: str, options: ExportOptions, transformers_shapes):
    """Per tensor and in total; splits change where bytes go, never how many."""
    export_plan = plan(load_preset(preset), options)
    shapes = transformers_shapes[preset]
    planned, expected, read = _planned_and_expected(export_plan, options, shapes)
    assert read == set(shapes)
    assert planned == expected
    total = sum(expected.values()) + _rope_bytes(export_plan, options)
    print(f"{preset} {options.ep} w{options.weight_bits}e{options.embedding_bits}: {total:,} B")
    assert export_plan.nbytes == total


def test_26b_experts_split_under_the_webgpu_buffer_limit():
    """fp16 experts are 968 MiB (gate_up) and 484 MiB (down) per layer: each is cut along
    its rows into pieces of exactly 128 x 352 x 2816 and 128 x 1408 x 704 fp16 values
    (242 MiB), under the 256 MiB limit; INT4 gate_up (242 MiB of codes) stays whole but
    is over the 128 MiB storage binding size, which the plan says."""
    spec = load_preset("gemma4-26b-a4b")
    fp16 = plan(spec, ExportOptions(ep="webgpu"))
    for name, pieces, rows, cols in (("gate_up_proj", 4, 352, 2816), ("down_proj", 2, 1408, 704)):
        for layer in range(spec.num_layers):
            wp = fp16.decoder.weight(f"layers.{layer}.experts.{name}")
            assert wp.split_axis == 1 and len(wp.pieces) == pieces
            assert [p.stop - p.start for p in wp.pieces] == [rows] * pieces
            assert {p.nbytes for p in wp.pieces} == {128 * rows * cols * 2} == {253_755_392}
            assert max(p.largest_buffer for p in wp.pieces) <= 256 * MIB
    int4 = plan(spec, ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4))
    gate_up = int4.decoder.weight("layers.0.experts.gate_up_proj")
    assert not gate_up.is_split and gate_up.exceeds == ("max_storage_binding_size",)
    assert max(t.nbytes for t in gate_up.tensors()) == 128 * 1408 * 2816 // 2
    assert any("layers.0.experts.gate_up_proj" in w for w in int4.warnings)


def test_presets_are_listed_and_planned_by_the_cli():
    listing = cli("info", "--preset", "gemma4-26b-a4b", "--json")
    assert listing.returncode == 0, listing.stderr
    info = json.loads(listing.stdout)
    assert info["experts"] == {
        "moe_layers": 30,
        "num_experts": 128,
        "top_k": 8,
        "intermediate_size": 704,
    }
    # transformers counts 25.2 B language-model parameters for 26B-A4B and 30.7 B for 31B.
    assert info["parameters"] == 25_233_141_790
    args = ("plan", "--preset", "gemma4-31b", "--ep", "webgpu", "--weight-bits", "4")
    text, data = cli(*args), json.loads(cli(*args, "--json").stdout)
    assert text.returncode == 0, text.stderr
    assert f"{data['total_bytes']:,} B" in text.stdout
    assert (
        data["total_bytes"]
        == plan(load_preset("gemma4-31b"), ExportOptions(ep="webgpu", weight_bits=4)).nbytes
    )


# ------------------------------------------------------------------ written tiny packages


def stored_initializers(model_path: Path) -> dict[str, tuple[tuple[int, ...], int, bool]]:
    """name -> (shape, stored bytes, external) read from the saved file."""
    proto = onnx.load(str(model_path), load_external_data=False)
    out = {}
    for init in proto.graph.initializer:
        external = init.data_location == onnx.TensorProto.EXTERNAL
        if external:
            length = int(next(e.value for e in init.external_data if e.key == "length"))
        else:
            length = len(init.raw_data)
        out[init.name] = (tuple(init.dims), length, external)
    return out


@pytest.fixture(scope="module")
def moe_quant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return TinyMoeModels(tmp_path_factory.mktemp("moe_plan")).get("moe_quant")


@pytest.mark.parametrize(
    "options",
    [
        dict(ep="cpu"),
        dict(ep="webgpu", dtype="fp32", max_buffer_size=8192, force=True),
        dict(ep="cpu", weight_bits=4, embedding_bits=8, block_size=16),
        dict(
            ep="webgpu",
            weight_bits=8,
            embedding_bits=8,
            block_size=16,
            max_buffer_size=4096,
            force=True,
        ),
    ],
    ids=["float", "split-float", "int4", "split-int8"],
)
def test_written_moe_package_matches_the_plan_exactly(moe_quant, tmp_path: Path, options):
    model_dir, _ = moe_quant
    result = export(tmp_path / "pkg", model_dir=model_dir, options=ExportOptions(**options))
    stored = stored_initializers(result.output / "model.onnx")
    planned = {t.name: t for t in result.plan.decoder.tensors()}
    experts = [w for w in result.plan.decoder.weights if w.weight.role == "experts"]
    if options.get("max_buffer_size"):
        assert all(w.is_split for w in experts)
    for name, tensor in planned.items():
        assert name in stored, f"planned initializer {name} is not in the package"
        shape, nbytes, _ = stored[name]
        assert (shape, nbytes) == (tensor.shape, tensor.nbytes), name
    external = sum(v[1] for v in stored.values() if v[2])
    assert (result.output / "model.onnx.data").stat().st_size == external
    assert sum(stored[name][1] for name in planned) == result.plan.nbytes


@pytest.mark.parametrize(
    ("ep", "quantized"),
    [("webgpu", False), ("webgpu", True), ("cpu", True)],
    ids=["webgpu-fp32", "webgpu-int8", "cpu-int8"],
)
def test_split_experts_give_the_same_logits(moe_quant, tmp_path: Path, ep: str, quantized: bool):
    """Both lowerings (per token on WebGPU, per expert on the CPU) over split experts."""
    model_dir, _ = moe_quant
    common: dict[str, Any] = dict(ep=ep, dtype="fp32")
    if quantized:
        common.update(weight_bits=8, block_size=16, accuracy_level=0)
    whole = export(tmp_path / "whole", model_dir=model_dir, options=ExportOptions(**common))
    pieces = export(
        tmp_path / "split",
        model_dir=model_dir,
        # A limit this small leaves linear weights over it: forced, the experts split.
        options=ExportOptions(**common, max_buffer_size=4096 if quantized else 8192, force=True),
    )
    name = "layers.0.experts.gate_up_proj"
    assert not whole.plan.decoder.weight(name).is_split
    assert len(pieces.plan.decoder.weight(name).pieces) > 1
    prompt = [5, 17, 42, 99, 7, 250, 31, 64]
    tokens_a, logits_a = ort_greedy(whole.output, prompt, 12)
    tokens_b, logits_b = ort_greedy(pieces.output, prompt, 12)
    assert tokens_a == tokens_b
    # fp32 rounding of another summation order, amplified by Gemma 4's unscaled attention:
    # measured 1.3e-5 on logits up to 2.2 (WebGPU's static-buffer lowering; 7e-6 with GQA).
    # A piece read or placed wrongly moves them by far more.
    assert max(float(np.abs(a - b).max()) for a, b in zip(logits_a, logits_b, strict=True)) <= 3e-5
