"""Refusals before any work, with the numbers, and what the user is told up front."""

from __future__ import annotations

import json
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import preflight
from engine.errors import OptionsError, PackageError, SpecError
from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.cli import ROOT, cli
from tests._support.fake_checkpoint import tiny_config


def config_only(folder: Path, **overrides: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tiny_config(**overrides)))
    return folder


def random(**options: object) -> ExportOptions:
    return ExportOptions(random_weights=True, **options)  # type: ignore[arg-type]


def test_absurd_sizes_are_refused_before_any_work_with_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # vocab 1e12 planned 582 TiB: no model's tokens can be counted with int32.
    model = config_only(tmp_path / "huge", vocab_size=10**12)
    with pytest.raises(SpecError, match="'vocab_size' is 1,000,000,000,000, larger than any"):
        export(tmp_path / "out", model_dir=model, options=random())
    # The largest vocabulary that can be counted still needs 512 GiB for its table.
    shutil.rmtree(model)
    model = config_only(tmp_path / "huge", vocab_size=2**31 - 1, hidden_size_per_layer_input=0)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=10 * 2**30))
    with pytest.raises(PackageError) as info:
        export(tmp_path / "out", model_dir=model, options=random())
    message = str(info.value)
    assert re.search(r"the package would take 512\.0 GiB \(549,757,049,688 B\)", message), message
    assert "has only 10.0 GiB free" in message and "--weight-bits 4" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge"]


def test_rope_caches_larger_than_memory_are_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """max_position_embeddings 1e9: 179 GiB of RoPE caches, which died with MemoryError."""
    model = config_only(tmp_path / "long", max_position_embeddings=10**9)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        preflight.shutil, "disk_usage", lambda path: usage._replace(free=2**60)
    )  # a disk large enough: memory is what runs out
    monkeypatch.setattr(preflight, "available_memory", lambda: 16 * 2**30)
    with pytest.raises(PackageError) as info:
        export(tmp_path / "out", model_dir=model, options=random())
    message = str(info.value)
    assert message.startswith("writing rope.")
    assert "of memory at once" in message and "only 16.0 GiB is available" in message
    assert "--max-length" in message
    # A shorter length is the way out.
    export(tmp_path / "out", model_dir=model, options=random(max_length=256))


def test_a_plan_over_the_free_disk_space_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(PackageError, match=r"would take 1\.\d MiB .* has only 1000 B free"):
        export(tmp_path / "deep" / "out", preset="gemma4-tiny", options=random())
    assert list(tmp_path.iterdir()) == []


def test_a_buffer_limit_the_user_chose_is_enforced_unless_forced(tmp_path: Path):
    with pytest.raises(OptionsError) as info:
        export(tmp_path / "out", preset="gemma4-tiny", options=random(max_buffer_size=1024))
    message = str(info.value)
    assert "larger than the buffer limit you chose (--max-buffer-size 1.0 KiB)" in message
    assert "--force" in message and "embed_tokens.weight" in message
    assert list(tmp_path.iterdir()) == []
    result = export(
        tmp_path / "out", preset="gemma4-tiny", options=random(max_buffer_size=1024, force=True)
    )
    assert result.notes[0].startswith("WARNING: 57 tensor(s) are larger than the buffer limit")


def test_the_cli_says_a_forced_package_will_not_load_loudly(tmp_path: Path):
    args = ["build", "--preset", "gemma4-tiny", "--random-weights", "--max-buffer-size", "1KiB"]
    refused = cli(*args, str(tmp_path / "a"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: 57 tensor(s) are larger than the buffer limit")
    forced = cli(*args, "--force", "--quiet", "--json", str(tmp_path / "b"))
    assert forced.returncode == 0
    assert forced.stderr.startswith("WARNING: 57 tensor(s) are larger than the buffer limit")
    assert "will not load on CPU" in forced.stderr
    assert json.loads(forced.stdout)["notes"][0].startswith("WARNING")


def test_a_clamped_max_length_is_said(tmp_path: Path):
    result = export(tmp_path / "out", preset="gemma4-tiny", options=random(max_length=10**9))
    assert result.plan.context_length == 512
    (note,) = [n for n in result.notes if "max_position_embeddings" in n]
    assert "the package supports 512 tokens" in note
    done = cli(
        "build", "--preset", "gemma4-tiny", "--random-weights", "--max-length", "1e9",
        str(tmp_path / "cli"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "note: --max-length 1,000,000,000 is longer than" in done.stdout


def test_a_length_beyond_int32_is_refused(tmp_path: Path):
    with pytest.raises(OptionsError, match="int32"):
        export(tmp_path / "out", preset="gemma4-tiny", options=random(max_length=2**31))


def test_a_write_error_is_one_line_and_leaves_nothing(tmp_path: Path):
    """A disk that fills mid-write, imitated with a file-size limit (EFBIG instead of ENOSPC)."""

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    out = tmp_path / "pkgs" / "out"
    done = subprocess.run(
        [sys.executable, "-m", "engine", "build", "--preset", "gemma4-tiny", "--random-weights",
         "--quiet", str(out)],
        cwd=ROOT, capture_output=True, text=True, preexec_fn=small_files, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: writing the package to '{out}' failed: File too large")
    assert "nothing was left behind" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_plan_says_what_build_would_refuse_or_clamp():
    done = cli(
        "plan", "--preset", "gemma4-tiny", "--max-length", "1e9", "--max-buffer-size", "1KiB"
    )
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: ")]
    assert any("the package supports 512 tokens" in n for n in notes)
    assert any(n.startswith("note: build refuses this plan: 57 tensor(s)") for n in notes)
    typo = cli("plan", "--preset", "gemma4-tiny", "--weight-bits", "4", "--keep-float", "foo*")
    assert typo.returncode == 2 and "--keep-float foo* matches no weight" in typo.stderr


def test_an_address_space_limit_counts_as_the_memory_available(tmp_path: Path):
    """``ulimit -v``: RoPE caches of 12M positions need 2.1 GiB at once; 1.5 GiB is allowed."""
    model = config_only(tmp_path / "long", max_position_embeddings=12_000_000)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1536 * 2**20, resource.RLIM_INFINITY))

    done = subprocess.run(
        [sys.executable, "-m", "engine", "build", "--model", str(model), "--random-weights",
         str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, preexec_fn=limited, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: writing rope.full.cos_cache needs at least 2.1 GiB")
    assert "only 1.5 GiB is available to this process" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long"]


@pytest.mark.parametrize(("ep", "measured"), [("trt-rtx", False), ("dml", False), ("cuda", True)])
def test_plan_and_build_say_when_an_eps_packages_never_ran_on_its_hardware(
    tmp_path: Path, ep: str, measured: bool
):
    done = cli("plan", "--preset", "gemma4-tiny", "--ep", ep)
    assert done.returncode == 0, done.stderr
    said = [n for n in done.stdout.splitlines() if "untested on real hardware" in n]
    assert (not said) if measured else said[0].startswith("note: ")
    built = cli(
        "build",
        "--preset",
        "gemma4-tiny",
        "--random-weights",
        "--ep",
        ep,
        "--json",
        str(tmp_path / "pkg"),
    )
    assert built.returncode == 0, built.stderr
    notes = json.loads(built.stdout)["notes"]
    assert any("untested on real hardware" in n for n in notes) is not measured
