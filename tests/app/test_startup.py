"""Start-up: the entry points work, and no heavy runtime is imported before the window shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--settings", str(tmp_path / "s.ini")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )


def test_window_shows_without_torch_transformers_or_onnxruntime(tmp_path):
    result = _run("--exit-when-shown", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[0])
    assert report["heavy_modules"] == []
    assert report["shown_s"] < 10  # the real budget (1.5 s) is benchmarks/app_startup.py's


def test_importing_app_is_free():
    heavy = "('PySide6', 'engine', 'numpy')"
    code = f"import sys, app; print(sorted(m for m in {heavy} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_help_lists_the_self_test(tmp_path):
    result = _run("--help", tmp_path=tmp_path)
    assert result.returncode == 0
    assert "--self-test" in result.stdout
