"""Widths that are not whole blocks run on the WebGPU EP (lavapipe or a GPU) as on the CPU:
MatMulNBits with K padded to whole blocks, GatherBlockQuantized with a partial last block."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.engine.test_webgpu import REPO, _clean_env, _setup_hint, webgpu_python

pytestmark = pytest.mark.webgpu


def test_padded_and_partial_blocks_run_on_webgpu():
    python = webgpu_python()
    if not python.exists():
        pytest.fail(f"{python} does not exist: {_setup_hint(python)}")
    done = subprocess.run(
        [str(python), str(REPO / "tests" / "webgpu" / "odd_blocks.py")],
        capture_output=True,
        text=True,
        timeout=900,
        env=_clean_env(),
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "WebGpuExecutionProvider" in report.pop("providers")
    assert len(report) == 10
    # float32 accumulation order only (measured up to 4e-7; lavapipe is looser than a GPU)
    assert all(diff <= 1e-5 for diff in report.values()), report
