"""The install extras the README names: ``.[studio]`` brings every studio feature; a plain
install brings every module the engine needs without one."""

from __future__ import annotations

import ast
import re
import sys

import tomllib

from tests._support.cli import ROOT


def extras() -> dict[str, dict[str, str]]:
    """extra -> {distribution: its requirement}."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = {}
    for extra, requirements in project["optional-dependencies"].items():
        named = {}
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
            named[name] = requirement
        out[extra] = named
    return out


def test_the_studio_extra_has_the_window_genai_and_transformers_pinned_as_the_tests_run_them():
    found = extras()
    studio, dev = found["studio"], found["dev"]
    assert studio["export-studio"] == "export-studio[gui,webgpu]"
    assert found["webgpu"]["onnxruntime-ep-webgpu"] == dev["onnxruntime-ep-webgpu"]
    for name in ("onnxruntime-genai", "torch", "transformers"):
        assert studio[name] == dev[name], f"{name}: the studio and the tests would differ"
        assert "==" in studio[name], f"{name} unpinned: pip may pull another build"


def test_the_readme_names_the_studio_extra():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'pip install ".[studio]"' in readme


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


STUDIO_ONLY = {"onnxruntime-genai", "torch", "transformers"}
"""What the engine imports only for the studio's features (the genai runtime, Verify),
each behind an error that names ``.[studio]``."""


def test_every_module_the_engine_imports_comes_with_a_plain_install_or_the_studio_extra():
    """A plain ``pip install .`` once lacked ``tokenizers``, which every export of a
    checkpoint with a tokenizer.json imports."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {_normal(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in project["dependencies"]}
    imported = set()
    for path in (ROOT / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {
        _normal(m)
        for m in imported
        if m not in sys.stdlib_module_names and m not in ("engine", "resources")
    }
    assert "tokenizers" in third_party and "numpy" in third_party
    missing = third_party - base - STUDIO_ONLY
    assert not missing, f"the engine imports {sorted(missing)}, which a plain install lacks"
    assert set(extras()["studio"]) >= STUDIO_ONLY
