"""Engine changes that wait for a GPU A/B (benchmarks/device/candidates/*.patch) still apply
to this engine and, applied, build what they promise: a patch that rotted while main moved
on would cost the device call it was prepared for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CANDIDATES = sorted((REPO / "benchmarks" / "device" / "candidates").glob("*.patch"))

_V_CASTS = """
import onnx_ir as ir
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset
from engine.rewrites import apply_rewrites

options = ExportOptions(ep="cuda", dtype="bf16", modalities=("text",))
export_plan = plan(load_preset("gemma4-e2b"), options)
model = build_decoder(export_plan)
apply_rewrites(model, export_plan.caps)
scattered = {id(n.outputs[0]): n for n in model.graph if n.op_type == "ScatterElements"}
casts = [
    scattered[id(n.inputs[0])].inputs[0].name
    for n in model.graph
    if n.op_type == "Cast" and id(n.inputs[0]) in scattered
]
print(sum(".value" in name for name in casts), sum(".key" in name for name in casts))
"""
_WHICH = """
import engine, pathlib
print(pathlib.Path(engine.__file__).parent)
"""


def _applied(patch: Path, root: Path) -> Path:
    """This checkout's engine, resources and tests copied under ``root`` with ``patch``
    applied (``git apply`` outside a repository works as ``patch -p1``)."""
    for part in ("engine", "resources", "tests"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        ["git", "apply", "--verbose", str(patch)], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{patch.name} no longer applies:\n{done.stderr}"
    return root


def _v_k_casts(engine_root: Path) -> tuple[int, int]:
    env = {**os.environ, "PYTHONPATH": str(engine_root)}
    done = subprocess.run(  # cwd too: ``-c`` puts it first on sys.path
        [sys.executable, "-c", _V_CASTS + _WHICH],
        cwd=engine_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    values, keys, where = done.stdout.split()
    assert Path(where) == engine_root / "engine", where
    return int(values), int(keys)


def test_there_are_candidates_or_none_is_documented():
    readme = (REPO / "benchmarks" / "device" / "README.md").read_text()
    for patch in CANDIDATES:
        assert f"candidates/{patch.name}" in readme, f"{patch.name} is not described"


@pytest.mark.parametrize("patch", CANDIDATES, ids=[p.stem for p in CANDIDATES])
def test_candidate_applies(patch: Path, tmp_path: Path):
    _applied(patch, tmp_path)


def test_pv_bf16_drops_the_value_casts(tmp_path: Path):
    """E2B bf16 CUDA: main casts every KV owner's K and V buffer to fp32; the candidate
    casts K only (P @ V over V as the bf16 cache holds it). Delete this test with the patch
    when it lands or is dropped."""
    patch = REPO / "benchmarks" / "device" / "candidates" / "pv-bf16.patch"
    assert patch.exists(), "pv-bf16.patch is gone: delete this test with it"
    before = _v_k_casts(REPO)
    after = _v_k_casts(_applied(patch, tmp_path))
    assert before[0] > 0 and before[1] > 0, before
    assert after == (0, before[1]), (before, after)
