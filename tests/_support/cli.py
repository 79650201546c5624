"""Running ``python -m engine`` from tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``python -m engine ARGS`` from the repository root; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
