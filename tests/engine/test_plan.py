"""The planner: exact sizes for the full-size presets, and limits honoured for any shape."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import OptionsError
from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.plan import _Limits, _plan_weight, plan
from engine.presets import load_preset

MiB = 1024 * 1024
V = 262144
TEXT = ("text",)
"""The presets carry vision and audio towers; these sizes are the text package's."""


def ple_table_bytes(bits: int | None, dim: int = 256, block: int = 32) -> int:
    """One per-layer table [V, dim], computed by hand from the op layouts."""
    if bits is None:
        return V * dim * 2  # fp16
    blocks = dim // block
    return V * dim * bits // 8 + V * blocks * 2 + V * math.ceil(blocks * bits / 8)


def test_per_layer_table_sizes_from_the_seed():
    assert ple_table_bytes(None) == 134_217_728  # 128 MiB
    assert ple_table_bytes(4) == 38_797_312  # 37 MiB: 32 + 4 scales + 1 zero points
    assert ple_table_bytes(8) == 73_400_320


# Layers per piece: as many per-layer tables as fit the 128 MiB storage binding (fp16: one;
# INT4: 4 x 32 MiB of codes; INT8: 2 x 64 MiB), the last piece holding the rest.
@pytest.mark.parametrize(("preset", "layers"), [("gemma4-e2b", 35), ("gemma4-e4b", 42)])
@pytest.mark.parametrize(("bits", "per_piece"), [(None, 1), (4, 4), (8, 2)])
def test_webgpu_per_layer_tables_split_exactly(
    preset: str, layers: int, bits: int | None, per_piece: int
):
    p = plan(load_preset(preset), ExportOptions(ep="webgpu", embedding_bits=bits, modalities=TEXT))
    table = p.decoder.weight("embed_tokens_per_layer.weight")
    counts = [(piece.stop - piece.start) // 256 for piece in table.pieces]
    assert table.is_split and counts == [per_piece] * (layers // per_piece) + (
        [layers % per_piece] if layers % per_piece else []
    )
    assert [piece.nbytes for piece in table.pieces] == [n * ple_table_bytes(bits) for n in counts]
    assert table.nbytes == layers * ple_table_bytes(bits)
    assert all(piece.largest_buffer <= 128 * MiB for piece in table.pieces)


def test_directml_per_layer_table_in_pieces_of_its_4_gib_buffers():
    """DirectML allows 4 GiB buffers and has no binding limit: E2B's fp16 table (35 x 128
    MiB) is one piece of 32 layers and one of 3."""
    p = plan(load_preset("gemma4-e2b"), ExportOptions(ep="dml", modalities=TEXT))
    table = p.decoder.weight("embed_tokens_per_layer.weight")
    assert [(piece.stop - piece.start) // 256 for piece in table.pieces] == [32, 3]
    assert max(piece.largest_buffer for piece in table.pieces) == 4 * 1024 * MiB


def test_e2b_fused_table_and_token_embedding_fp16():
    cpu = plan(load_preset("gemma4-e2b"), ExportOptions(ep="cuda", modalities=TEXT))
    assert cpu.decoder.weight("embed_tokens_per_layer.weight").nbytes == 4_697_620_480
    assert not cpu.decoder.weight("embed_tokens_per_layer.weight").is_split
    web = plan(load_preset("gemma4-e2b"), ExportOptions(ep="webgpu", modalities=TEXT))
    embed = web.decoder.weight("embed_tokens.weight")
    assert embed.unsplit_nbytes == 768 * MiB
    assert [p.nbytes for p in embed.pieces] == [256 * MiB] * 3
    head = web.decoder.weight("lm_head.weight")
    assert head.shares == "embed_tokens.weight" and head.nbytes == 0


def test_e4b_token_embedding_int4_is_370_mib_in_two_pieces():
    p = plan(load_preset("gemma4-e4b"), ExportOptions(ep="webgpu", embedding_bits=4))
    embed = p.decoder.weight("embed_tokens.weight")
    assert embed.nbytes == 370 * MiB
    assert len(embed.pieces) == 2
    assert [t.nbytes for t in embed.pieces[0].tensors] == [160 * MiB, 20 * MiB, 5 * MiB]


def test_e4b_token_embedding_fp16_splits_into_five():
    p = plan(load_preset("gemma4-e4b"), ExportOptions(ep="webgpu"))
    embed = p.decoder.weight("embed_tokens.weight")
    assert embed.unsplit_nbytes == 1280 * MiB
    assert [piece.nbytes for piece in embed.pieces] == [256 * MiB] * 5


def test_custom_limit_raises_or_lowers_the_split():
    spec = load_preset("gemma4-e2b")
    big = plan(spec, ExportOptions(ep="webgpu", max_buffer_size=8 * 1024**3))
    assert not any(w.is_split for w in big.decoder.weights)
    small = plan(spec, ExportOptions(ep="webgpu", max_buffer_size=128 * MiB))
    assert len(small.decoder.weight("embed_tokens.weight").pieces) == 6


def test_int4_webgpu_e2b_decoder_matches_seed_order_of_magnitude():
    """Seed #403: decoder 5.8 GB -> 2.7 GB by quantizing the per-layer tables (INT4
    weights both sides). Our decoder also holds the token embedding."""
    spec = load_preset("gemma4-e2b")
    fp16_tables = plan(spec, ExportOptions(ep="webgpu", weight_bits=4, modalities=TEXT))
    int4_tables = plan(
        spec, ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4, modalities=TEXT)
    )
    saved = fp16_tables.nbytes - int4_tables.nbytes
    assert saved > 3.4e9
    assert 2.5e9 < int4_tables.nbytes < 3.0e9


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_webgpu_e2b_rope_caches_are_fp32_over_the_rotated_pairs(dtype: str):
    """The static-buffer lowering's RoPE caches: fp32 whatever the package's dtype, only
    the frequency pairs that rotate (all 128 sliding, 64 of a full layer's 256), so they
    take the bytes of fp16 full-width caches: 192 MiB at E2B's 131,072 positions."""
    options = ExportOptions(ep="webgpu", dtype=dtype, modalities=TEXT)
    decoder = plan(load_preset("gemma4-e2b"), options).decoder
    caches = {wp.name: wp for wp in decoder.weights if wp.weight.role == "rope_cache"}
    shapes = {name: (wp.weight.shape, wp.dtype) for name, wp in caches.items()}
    assert shapes == {
        **{f"rope.sliding.{p}_cache": ((131072, 128), "fp32") for p in ("cos", "sin")},
        **{f"rope.full.{p}_cache": ((131072, 64), "fp32") for p in ("cos", "sin")},
    }
    assert sum(wp.nbytes for wp in caches.values()) == 192 * MiB
    cpu = plan(load_preset("gemma4-e2b"), ExportOptions(ep="cpu", modalities=TEXT)).decoder
    assert cpu.weight("rope.full.cos_cache").weight.shape == (131072, 256)


def test_quantization_errors_before_any_work():
    spec = load_preset("gemma4-tiny")
    with pytest.raises(OptionsError, match="power of two"):
        plan(spec, ExportOptions(weight_bits=4, block_size=48))
    with pytest.raises(OptionsError, match="must be 4 or 8"):
        plan(spec, ExportOptions(embedding_bits=2))
    # The tied LM head reads the quantized table's bytes as whole MatMulNBits blocks.
    with pytest.raises(OptionsError, match="does not divide its 64 columns") as info:
        plan(spec, ExportOptions(weight_bits=4, embedding_bits=4, block_size=128))
    assert "--embedding-block-size 16 or 32 or 64" in str(info.value)


# ---------------------------------------------------------------- property tests

ROLES = ("linear", "embedding", "ple_table", "lm_head", "norm")


@st.composite
def weights_and_options(draw):
    role = draw(st.sampled_from(ROLES))
    block = draw(st.sampled_from([16, 32, 64]))
    rows = draw(st.integers(1, 4096))
    if role == "norm":
        shape: tuple[int, ...] = (draw(st.integers(1, 8192)),)
    elif role == "ple_table":
        layers, dim = draw(st.integers(1, 40)), block * draw(st.integers(1, 8))
        shape = (rows, layers * dim)
    else:
        shape = (rows, block * draw(st.integers(1, 64)))
    scale = float(shape[1] // layers) ** 0.5 if role == "ple_table" else None
    weight = LogicalWeight("w", shape, role, scale=scale)
    bits = draw(st.sampled_from([None, 4, 8]))
    options = ExportOptions(
        ep="webgpu",
        dtype=draw(st.sampled_from(["fp16", "fp32"])),
        weight_bits=bits,
        embedding_bits=bits,
        block_size=block,
    ).resolve()
    limit = draw(st.integers(1024, 8 * MiB))
    return weight, options, limit


@settings(max_examples=300, deadline=None)
@given(weights_and_options())
def test_every_planned_buffer_fits_or_is_reported(case):
    weight, options, limit = case
    dtype = options.dtype or "fp16"
    wp = _plan_weight(weight, options, _Limits(limit, None), dtype)
    total = sum(math.prod(t.shape) for t in wp.tensors())
    assert total > 0
    for piece in wp.pieces:
        if piece.largest_buffer > limit:
            # Reported: either the weight kept whole with a reason, or split pieces flagged.
            assert "max_buffer_size" in wp.exceeds
            assert wp.note or "max_buffer_size" in wp.pieces_exceed
    # Pieces tile the split axis exactly.
    axis = wp.pieces[0].axis
    bounds = [(p.start, p.stop) for p in wp.pieces]
    assert bounds[0][0] == 0 and bounds[-1][1] == weight.shape[axis]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def test_a_warning_about_a_table_two_sessions_hold_is_said_once():
    """E2B with its towers: the 4-bit token table is in the embedding session and is the
    decoder's tied head; its storage-binding warning names both sessions, once."""
    export_plan = plan(
        load_preset("gemma4-e2b"), ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4)
    )
    about_table = [w for w in export_plan.warnings if w.startswith("embed_tokens.weight ")]
    assert len(about_table) == 1, export_plan.warnings
    assert about_table[0].endswith("(in the embedding and decoder sessions)")
    assert len(set(export_plan.warnings)) == len(export_plan.warnings)


def test_the_plan_keeps_the_session_trees_it_was_walked_from(monkeypatch):
    """Later stages (the builder, the audit, the app's readiness) take each session's tree
    from the plan: none is made again, and building one twice gives the same graph."""
    from dataclasses import replace

    import onnx

    import engine.models as models
    from engine.models import build_session, family_for, plan_sessions
    from tests._support.structure import structural_proto

    export_plan = plan(load_preset("gemma4-e2b"), ExportOptions(ep="webgpu"))
    assert [s.name for s in export_plan.sessions] == ["vision", "speech", "embedding", "decoder"]
    made: list[str] = []
    gemma4 = family_for("gemma4")

    def counted(*args):
        made.append("sessions")
        return gemma4.sessions(*args)

    monkeypatch.setattr(models, "_families", lambda: (replace(gemma4, sessions=counted),))
    trees = plan_sessions(export_plan)
    assert all(t is s.tree for t, s in zip(trees, export_plan.sessions, strict=True))
    tiny = plan(load_preset("gemma4-tiny"), ExportOptions(ep="webgpu"))
    assert made == ["sessions"]  # planning makes them, once
    first, again = (build_session(tiny, "decoder") for _ in range(2))
    assert made == ["sessions"]
    assert onnx.printer.to_text(structural_proto(first).graph) == (
        onnx.printer.to_text(structural_proto(again).graph)
    )
