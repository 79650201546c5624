"""The command line: exit codes, messages and the files it writes."""

from __future__ import annotations

import json
from pathlib import Path

from tests._support.cli import cli


def test_build_tiny_preset_writes_a_package(tmp_path: Path):
    out = tmp_path / "pkg"
    result = cli(
        "build", "--preset", "gemma4-tiny", "--random-weights", "--ep", "cpu", "--quiet", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    assert {"model.onnx", "model.onnx.data", "genai_config.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["type"] == "gemma4_text"


def test_build_refuses_existing_output_with_exit_code_2(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")  # an empty folder would be written into
    result = cli("build", "--preset", "gemma4-tiny", "--random-weights", "--quiet", str(tmp_path))
    assert result.returncode == 2
    assert "--overwrite" in result.stderr and "Traceback" not in result.stderr


def test_info_json_reports_the_architecture():
    result = cli("info", "--preset", "gemma4-e2b", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["layers"] == 35 and info["kv_cache_layers"] == 15


def test_info_text_reads_as_words_not_python():
    result = cli("info", "--preset", "gemma4-e2b")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("  ", 1) for line in result.stdout.splitlines())
    shown = {key.strip(): value.strip() for key, value in lines.items()}
    assert shown["head dim"] == "sliding 256, full 512"
    assert shown["towers"] == "vision, audio" and shown["experts"] == "none"
    assert shown["tie word embeddings"] == "yes" and shown["parameters"] == "5,104,298,467"
    assert not any(c in result.stdout for c in "{}[]'") and "None" not in result.stdout


def test_no_arguments_prints_usage_and_where_to_start():
    result = cli()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m engine")
    assert "python -m engine build --preset gemma4-tiny --random-weights" in result.stdout


def test_plan_text_and_json_agree_on_total():
    args = ("plan", "--preset", "gemma4-e2b", "--ep", "webgpu", "--embedding-bits", "4")
    text = cli(*args)
    data = json.loads(cli(*args, "--json").stdout)
    assert text.returncode == 0, text.stderr
    assert f"{data['total_bytes']:,} B" in text.stdout
    assert "9 pieces" in text.stdout  # 35 layers' INT4 tables, up to 4 to a piece


def test_bad_option_is_a_usage_error():
    result = cli("plan", "--preset", "gemma4-e2b", "--weight-bits", "3")
    assert result.returncode == 2
    assert "weight bits must be 4 or 8" in result.stderr


def test_quantization_flags_without_quantization_are_refused(tmp_path: Path):
    """Before: ``build --block-size 64 --symmetric`` of a float export exited 0 having
    used neither; now refused as ``--keep-int8`` is, with nothing written."""
    out = tmp_path / "pkg"
    flags = ("--block-size", "64", "--symmetric", "--quant-method", "search")
    result = cli("build", "--preset", "gemma4-tiny", "--random-weights", *flags, str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "error: --block-size, --symmetric, --quant-method shape quantized weights, but nothing "
        "is quantized; add --weight-bits 4 (and / or --embedding-bits 4), or leave them out"
    )
    assert not out.exists()
    plan = cli("plan", "--preset", "gemma4-tiny", "--accuracy-level", "4")
    assert plan.returncode == 2 and "--accuracy-level shapes quantized weights" in plan.stderr
    quantized = cli("plan", "--preset", "gemma4-tiny", "--embedding-bits", "4", *flags)
    assert quantized.returncode == 0, quantized.stderr
    tables = cli(
        "plan", "--preset", "gemma4-tiny", "--embedding-bits", "4", "--no-quantize-lm-head"
    )  # the flag named as it is spelled, and only --weight-bits advised
    assert tables.returncode == 2
    assert tables.stderr.strip() == (
        "error: --no-quantize-lm-head shapes quantized linear weights, but only the embedding "
        "tables are quantized; add --weight-bits 4, or leave it out"
    )
    table_block = ("--embedding-block-size", "64")
    weights = cli("plan", "--preset", "gemma4-tiny", "--weight-bits", "4", *table_block)
    assert weights.returncode == 2  # before: accepted, and the float tables ignored it
    assert weights.stderr.strip() == (
        "error: --embedding-block-size shapes quantized embedding tables, but the embedding "
        "tables stay float; add --embedding-bits 4, or leave it out"
    )
    tables_only = cli("plan", "--preset", "gemma4-tiny", *table_block)
    assert tables_only.returncode == 2  # the advice names what this flag needs, not weights
    assert "nothing is quantized; add --embedding-bits 4, or leave it out" in tables_only.stderr
    mixed = cli("plan", "--preset", "gemma4-tiny", "--accuracy-level", "4", *table_block)
    assert "add --weight-bits 4 and --embedding-bits 4, or leave them out" in mixed.stderr
    both = ("--weight-bits", "4", "--embedding-bits", "4", *table_block)
    assert cli("plan", "--preset", "gemma4-tiny", *both).returncode == 0
    bad = cli("plan", "--preset", "gemma4-tiny", "--block-size", "24")
    assert bad.returncode == 2 and "power of two" in bad.stderr  # its own reason first
    assert "nothing is quantized" not in bad.stderr, bad.stderr


def test_a_negative_seed_is_refused_by_build_as_by_bench(tmp_path: Path):
    """Before: ``build --seed=-1`` wrote a package while ``bench --seed -3`` was refused."""
    out = tmp_path / "pkg"
    result = cli("build", "--preset", "gemma4-tiny", "--random-weights", "--seed=-1", str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == "error: --seed must be 0 or more, got -1"
    assert not out.exists()
