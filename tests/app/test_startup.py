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


QUICK_EXIT = """
import sys
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
from app.settings import AppSettings
from app.windows.main_window import MainWindow
app = QApplication(sys.argv[:1])
window = MainWindow(AppSettings(QSettings(sys.argv[1], QSettings.Format.IniFormat)))
window.show()
if sys.argv[2] == "close":
    window.close()
# the script ends here: its preview worker may still be running
"""


def test_a_window_created_and_dropped_at_once_leaves_no_worker_errors(tmp_path):
    for how in ("close", "drop"):
        result = subprocess.run(
            [sys.executable, "-c", QUICK_EXIT, str(tmp_path / "s.ini"), how],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr, f"{how}: {result.stderr}"
        assert "has been deleted" not in result.stderr, f"{how}: {result.stderr}"
