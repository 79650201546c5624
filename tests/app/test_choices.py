"""Which choices the model allows (no Qt): inputs (towers) and block sizes, with the engine's
reasons, and options moved onto allowed values with a note."""

from __future__ import annotations

from pathlib import Path

from app.choices import default_output, fit_options, model_constraints
from app.source import ModelSource
from app.state import options_from_json, options_to_json
from engine.models import spec_from_config
from engine.options import ExportOptions
from engine.presets import load_preset, preset_config

TEXT, IMAGES, ALL = ("text",), ("text", "vision"), ("text", "vision", "audio")


def test_inputs_a_model_has_no_tower_for_are_ruled_out_with_the_engines_reason():
    tiny = model_constraints(load_preset("gemma4-tiny"), ExportOptions())
    assert tiny.reason("modalities", TEXT) is None
    assert tiny.reason("modalities", None) is None
    assert "no vision tower (it has: text)" in (tiny.reason("modalities", IMAGES) or "")
    assert "no vision or audio tower" in (tiny.reason("modalities", ALL) or "")
    assert "“Inputs”" in (tiny.reason("modalities", ALL) or "")  # the app's words, no flag

    e2b = model_constraints(load_preset("gemma4-e2b"), ExportOptions())
    assert all(e2b.reason("modalities", m) is None for m in (None, TEXT, IMAGES, ALL))

    moe = model_constraints(load_preset("gemma4-26b-a4b"), ExportOptions())
    assert moe.reason("modalities", TEXT) is None
    assert "both ways" in (moe.reason("modalities", IMAGES) or "")


def test_inputs_the_model_cannot_take_move_to_everything_it_takes_with_a_note():
    constraints = model_constraints(load_preset("gemma4-tiny"), ExportOptions())
    fitted, notes = fit_options(ExportOptions(modalities=IMAGES, weight_bits=4), constraints)
    assert fitted == ExportOptions(weight_bits=4)
    assert notes == [
        "Inputs text, images is not available (the model has no vision tower (it has: text); "
        "choose “Inputs” among those): set to everything the model takes"
    ]
    assert fit_options(ExportOptions(modalities=TEXT), constraints) == (
        ExportOptions(modalities=TEXT),
        [],
    )


def test_block_sizes_follow_the_planner_for_the_inputs_chosen():
    """The towers' weights are planned too. A vision MLP width no block size divides
    (16 x 193) rules nothing out: MatMulNBits pads K to whole blocks as ONNX Runtime's
    quantizer does, so the studio offers what the planner accepts, towers or not."""
    config = preset_config("gemma4-e2b")
    config["vision_config"]["intermediate_size"] = 3088  # 16 x 193
    spec = spec_from_config(config)
    for modalities in (None, TEXT):
        chosen = model_constraints(spec, ExportOptions(weight_bits=4, modalities=modalities))
        assert all(chosen.reason("block_size", size) is None for size in (16, 32, 64, 128, 256))


def test_chosen_inputs_survive_a_restart_and_name_the_output_folder():
    options = ExportOptions(ep="webgpu", modalities=IMAGES)
    assert options_from_json(options_to_json(options)) == options
    preset = ModelSource("preset", "gemma4-e2b")
    assert Path(default_output(preset, options)).name == "gemma4-e2b-webgpu-fp16-text-vision"
    assert Path(default_output(preset, ExportOptions())).name == "gemma4-e2b-cpu-fp32"


def test_embedding_block_sizes_follow_what_the_eps_kernels_read():
    """WebGPU reads 4-bit embedding rows of an even block count only: with tables split
    into 32-column pieces (one layer each: two take 16 KiB of codes), 32 is ruled out there
    (not on the CPU), and "same as weights" (32) moves to 16, said in a note."""
    tiny = load_preset("gemma4-tiny")
    small = 8 * 1024
    webgpu = ExportOptions(ep="webgpu", embedding_bits=4, max_buffer_size=small)
    constraints = model_constraints(tiny, webgpu)
    assert "odd count" in (constraints.reason("embedding_block_size", 32) or "")
    assert constraints.reason("embedding_block_size", 16) is None
    fitted, notes = fit_options(webgpu, constraints)
    assert fitted.embedding_block_size == 16 and fitted.block_size == 32
    assert notes and notes[0].startswith("Embedding block size 32 does not fit")
    cpu = ExportOptions(embedding_bits=4, max_buffer_size=small)
    assert model_constraints(tiny, cpu).reason("embedding_block_size", 32) is None
