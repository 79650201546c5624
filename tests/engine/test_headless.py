"""The engine is headless: it imports without Qt, and ``import engine`` stays light."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_engine_module_imports_with_qt_blocked():
    result = run_python("""
        import importlib, pkgutil, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("PySide6", "shiboken6", "pyqtgraph", "superqt", "app"):
                    raise ImportError(f"engine imported {name}")
        sys.meta_path.insert(0, Block())
        import engine
        for mod in pkgutil.walk_packages(engine.__path__, "engine."):
            if mod.name != "engine.__main__":
                importlib.import_module(mod.name)
        print("ok", len(sys.modules))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_import_engine_loads_no_runtime_or_torch():
    result = run_python("""
        import sys
        import engine
        names = ("onnxruntime", "torch", "transformers", "onnx", "onnxscript")
        heavy = [m for m in names if m in sys.modules]
        print(heavy)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
