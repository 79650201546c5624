"""Run one of ``benchmarks/device``'s one-call scripts at toy size, as the device would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_device_script(name: str, args: list[str], tmp_path: Path, timeout: float) -> Any:
    """``benchmarks/device/NAME.py --tiny --work TMP/work ARGS`` with ``$OUT`` = TMP/out and
    no peer wheels; asserts it exits 0 and returns the JSON report it wrote there."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(REPO / "benchmarks" / "device" / f"{name}.py"), "--tiny"]
    cmd += ["--work", str(tmp_path / "work"), "--peer-wheels", str(tmp_path / "no-wheels")]
    done = subprocess.run(
        [*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / f"{name}.json").read_text())
