"""packaging/build.py: the bundle checks catch what must (and must not) be in a bundle.

The real build and smoke test run in CI through `python packaging/build.py` (about 70 s
to build, 30 s to smoke-test); these tests check the checker itself on fake bundles, and
that the spec keeps the heavy packages out.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_build_module():
    spec = importlib.util.spec_from_file_location(
        "packaging_build", ROOT / "packaging" / "build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def build():
    return load_build_module()


def fake_bundle(root: Path, build) -> Path:
    bundle = root / build.BUNDLE_NAME
    internal = bundle / "_internal"
    (internal / "resources" / "presets").mkdir(parents=True)
    for data in build.REQUIRED_DATA:
        (internal / data).write_text("{}")
    for package in build.REQUIRED_PACKAGES:
        (internal / package).mkdir()
    for name in build.EXECUTABLES:
        exe = bundle / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return bundle


def test_a_complete_bundle_passes(tmp_path: Path, build):
    assert build.check_bundle(fake_bundle(tmp_path, build)) == []


def test_missing_executable_and_resource_are_reported(tmp_path: Path, build):
    bundle = fake_bundle(tmp_path, build)
    (bundle / "export-studio-engine").unlink()
    (bundle / "_internal" / "resources" / "presets" / "gemma4-tiny.json").unlink()
    problems = build.check_bundle(bundle)
    assert "missing executable export-studio-engine" in problems
    assert "missing resource resources/presets/gemma4-tiny.json" in problems


@pytest.mark.parametrize("intruder", ["torch", "transformers", "PyQt5", "onnxruntime_genai"])
def test_excluded_packages_are_reported(tmp_path: Path, build, intruder: str):
    bundle = fake_bundle(tmp_path, build)
    (bundle / "_internal" / intruder).mkdir()
    assert any(intruder in p for p in build.check_bundle(bundle))


def test_missing_bundle_folder(tmp_path: Path, build):
    assert build.check_bundle(tmp_path / "nothing") == [
        f"no bundle folder at {tmp_path / 'nothing'}"
    ]


def test_spec_excludes_what_the_bundle_must_not_carry():
    spec = (ROOT / "packaging" / "export_studio.spec").read_text()
    for name in ("torch", "transformers", "PyQt5", "PyQt6", "PySide2", "QtWebEngineCore"):
        assert f'"{name}' in spec or f'.{name}"' in spec, name
    assert '"tokenizers"' not in spec  # a checkpoint's export loads its tokenizer.json


def test_a_bundle_without_tokenizers_is_reported(tmp_path: Path, build):
    bundle = fake_bundle(tmp_path, build)
    (bundle / "_internal" / "tokenizers").rmdir()
    assert build.check_bundle(bundle) == ["missing package tokenizers"]


def test_resources_are_found_through_one_helper(monkeypatch, tmp_path: Path):
    """Frozen: resources come from sys._MEIPASS/resources; unfrozen: the package folder."""
    import sys

    import resources

    assert (resources.resource_path("presets", "gemma4-tiny.json")).is_file()
    frozen = tmp_path / "resources" / "presets"
    frozen.mkdir(parents=True)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert resources.resource_root() == tmp_path / "resources"
