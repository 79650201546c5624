"""The equivalent command line: the CLI reads back exactly the options it was made from."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cli_line import PROGRAM, build_line, parse_build_line
from engine.commands._args import refuse_unused_quantization
from engine.errors import OptionsError
from engine.options import ExportOptions, unused_quantization
from tests._support.cli import cli

OPTIONS = st.builds(
    ExportOptions,
    ep=st.sampled_from(["cpu", "cuda", "webgpu", "dml", "trt-rtx"]),
    dtype=st.sampled_from([None, "fp32", "fp16", "bf16"]),
    weight_bits=st.sampled_from([None, 4, 8]),
    embedding_bits=st.sampled_from([None, 4, 8]),
    block_size=st.sampled_from([16, 32, 64, 128, 256]),
    embedding_block_size=st.sampled_from([None, 16, 64, 128]),
    symmetric=st.booleans(),
    quant_method=st.sampled_from(["rtn", "search"]),
    quantize_lm_head=st.booleans(),
    accuracy_level=st.sampled_from([None, 0, 1, 4]),
    graph_capture=st.sampled_from(["auto", "on", "off"]),
    max_buffer_size=st.sampled_from([None, 1024**3, 256 * 1024**2, 123_456_789]),
    max_length=st.sampled_from([None, 2, 4096]),
    attention=st.sampled_from(["auto", "gqa", "standard"]),
    random_weights=st.booleans(),
    seed=st.sampled_from([0, 7]),
    modalities=st.sampled_from([None, ("text",), ("text", "vision"), ("text", "vision", "audio")]),
    keep_float=st.sampled_from([(), ("lm_head.weight",), ("layers.*.mlp.*", "a,b weights")]),
    keep_int8=st.sampled_from([(), ("layers.0.*",)]),
    size_budget=st.sampled_from([None, 2 * 1024**3, 20_131_840]),
    target_kld=st.sampled_from([None, 0.003, 1e-5]),
    force=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(options=OPTIONS, overwrite=st.booleans(), preset=st.booleans())
def test_the_cli_reads_back_the_options_the_line_was_made_from(options, overwrite, preset):
    source = {"preset": "gemma4-e2b"} if preset else {"model_dir": "/models/my gemma"}
    line = build_line("out/my pkg", options=options, overwrite=overwrite, **source)
    assert line.missing == ()
    assert line.argv[0] == "build"
    args, parsed = parse_build_line(line.argv[1:])
    expected = (
        options if options.random_weights else ExportOptions(**{**asdict(options), "seed": 0})
    )
    # settings for weights the export does not quantize change nothing: the line leaves
    # them out
    left_out = ExportOptions()
    unused = unused_quantization(options)
    expected = replace(expected, **{k: getattr(left_out, k) for k in unused})
    assert parsed == expected
    try:
        parsed.resolve()
    except OptionsError:
        pass  # refused for a reason of its own (the studio refuses it too)
    else:
        refuse_unused_quantization(parsed)  # and not for a flag the line should have left out
    assert args.overwrite is overwrite
    assert args.output == str(Path("out/my pkg"))
    assert (args.preset, args.model) == (
        ("gemma4-e2b", None) if preset else (None, "/models/my gemma")
    )
    assert shlex.split(line.text)[: len(PROGRAM)] == list(PROGRAM)
    assert shlex.split(line.text)[len(PROGRAM) :] == list(line.argv)


def test_defaults_give_the_shortest_line():
    line = build_line("out", options=ExportOptions(), preset="gemma4-tiny")
    assert line.text == "python -m engine build --preset gemma4-tiny out"


def test_options_without_a_flag_are_listed_not_dropped(monkeypatch):
    """Every option has a flag today; one whose flag is gone is listed, not dropped."""
    from engine import cli_line

    parser = cli_line._build_parser()
    action = next(a for a in parser._actions if a.dest == "embedding_block_size")
    parser._remove_action(action)
    for flag in action.option_strings:
        parser._option_string_actions.pop(flag)
    parser.set_defaults(embedding_block_size=None)  # what options_from_args reads
    monkeypatch.setattr(cli_line, "_build_parser", lambda: parser)
    line = build_line(
        "out", options=ExportOptions(embedding_bits=4, embedding_block_size=64), preset="p"
    )
    assert line.missing == ("embedding_block_size=64",)
    assert "--embedding-bits 4" in line.text


def test_the_embedding_block_size_has_a_flag():
    """The README's INT8-table rows use it; the studio's Copy CLI command carries it."""
    line = build_line(
        "out", options=ExportOptions(embedding_bits=8, embedding_block_size=128), preset="p"
    )
    assert line.missing == () and "--embedding-block-size 128" in line.text
    _, parsed = parse_build_line(line.argv[1:])
    assert parsed.embedding_block_size == 128


def test_sizes_are_written_in_exact_binary_units():
    line = build_line("o", options=ExportOptions(max_buffer_size=256 * 1024**2), preset="p")
    assert "--max-buffer-size 256MiB" in line.text
    odd = build_line("o", options=ExportOptions(max_buffer_size=123_456_789), preset="p")
    assert "--max-buffer-size 123456789" in odd.text


def test_one_model_source_is_required():
    with pytest.raises(ValueError):
        build_line("o", options=ExportOptions())
    with pytest.raises(ValueError):
        build_line("o", options=ExportOptions(), preset="p", model_dir="m")


def test_the_line_runs_and_exports_those_options(tmp_path):
    options = ExportOptions(weight_bits=4, block_size=16, random_weights=True, seed=3)
    line = build_line(tmp_path / "pkg", options=options, preset="gemma4-tiny")
    result = cli(*line.argv, "--quiet")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "pkg" / "export_studio.json").read_text())
    resolved = options.resolve()
    for key in ("weight_bits", "block_size", "seed", "random_weights", "dtype"):
        assert manifest["options"][key] == getattr(resolved, key), key


def test_inputs_are_written_as_one_comma_separated_flag():
    line = build_line("o", options=ExportOptions(modalities=("text", "vision")), preset="p")
    assert "--modalities text,vision" in line.text
    assert "--modalities" not in build_line("o", options=ExportOptions(), preset="p").text
