"""benchmarks/device/webgpu_ab.py at toy size on the WebGPU plugin (lavapipe without a GPU),
so a device call cannot be the first to find it broken: a flag's variant of this checkout
against the checkout's default options, both built, both decoded with capture on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support.webgpu import require_webgpu

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device" / "webgpu_ab.py"

pytestmark = [pytest.mark.webgpu]


def run(args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=SCRIPT.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_variant_of_this_checkout_is_built_and_decoded(tmp_path: Path):
    require_webgpu()
    sym = "--modalities text --weight-bits 4 --embedding-bits 4 --symmetric"
    args = ["--variants", f"sym={sym}", "--preset", "gemma4-tiny", "--rounds", "1"]
    args += ["--short-length", "192", "--new-tokens", "4", "--work", str(tmp_path / "work")]
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "webgpu_ab.json").read_text())
    assert report["builds"] == {"this": sym.removesuffix(" --symmetric"), "sym": sym}
    for name in ("this", "sym"):
        assert report["stages"][f"build_{name}"]["rc"] == 0
        rows = report["summary"][name]
        assert set(rows) == {"512", "192"}, rows  # the tiny preset's default, and the short one
        assert all(isinstance(v[0], float) and v[0] > 0 for v in rows.values()), rows


def test_nothing_to_compare_is_refused(tmp_path: Path):
    done = run([], tmp_path)
    assert done.returncode == 2 and "nothing to compare" in done.stderr
    done = run(["--variants", "this=--weight-bits 8"], tmp_path)
    assert done.returncode == 2 and "with a new name" in done.stderr
