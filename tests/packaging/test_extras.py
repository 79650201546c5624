"""The install extras the README names: ``.[studio]`` brings every studio feature."""

from __future__ import annotations

import re

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
