"""Build the PyInstaller bundle, check what went in, and smoke-test it.

    python packaging/build.py [--skip-build] [--dist dist] [--json]

Steps: run PyInstaller on packaging/export_studio.spec (onedir); check the bundle has both
executables, the presets, and none of the excluded heavy packages; run the frozen app's
``--self-test`` offscreen, time its start to a shown window, and build the tiny preset
with the frozen engine CLI. Prints one JSON report; exits nonzero on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "packaging" / "export_studio.spec"
BUNDLE_NAME = "export-studio"
EXECUTABLES = ("export-studio", "export-studio-engine")
# Folder names that must not be in the bundle (they would mean a heavy or conflicting
# package slipped in).
FORBIDDEN = (
    "torch",
    "transformers",
    "PyQt5",
    "PyQt6",
    "PySide2",
    "tkinter",
    "QtWebEngineCore",
    "onnxruntime_genai",
)
REQUIRED_DATA = ("resources/presets/gemma4-tiny.json", "resources/presets/gemma4-e2b.json")
REQUIRED_PACKAGES = ("tokenizers",)
"""Packages the engine imports only when it runs (PyInstaller may not see them): tokenizers
checks every checkpoint's tokenizer.json."""


def build(dist: Path, work: Path) -> float:
    """Run PyInstaller; returns seconds taken."""
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller",
            "--noconfirm",
            "--clean",
            "--log-level",
            "WARN",
            "--distpath",
            str(dist),
            "--workpath",
            str(work),
            str(SPEC),
        ],
        cwd=ROOT,
        check=True,
    )
    return time.perf_counter() - started


def check_bundle(bundle: Path) -> list[str]:
    """Problems with a built onedir bundle (empty list when it looks right)."""
    problems = []
    if not bundle.is_dir():
        return [f"no bundle folder at {bundle}"]
    for name in EXECUTABLES:
        exe = bundle / name
        if not exe.is_file() or not os.access(exe, os.X_OK):
            problems.append(f"missing executable {name}")
    internal = bundle / "_internal" if (bundle / "_internal").is_dir() else bundle
    for data in REQUIRED_DATA:
        if not (internal / data).is_file():
            problems.append(f"missing resource {data}")
    for package in REQUIRED_PACKAGES:
        if not (internal / package).is_dir():
            problems.append(f"missing package {package}")
    for path in internal.rglob("*"):
        if path.is_dir() and path.name in FORBIDDEN:
            problems.append(f"excluded package bundled: {path.relative_to(bundle)}")
        elif path.is_file() and any(
            path.name.startswith(f"lib{n}") or path.name.startswith(n)
            for n in ("Qt6WebEngine", "libQt6WebEngine", "libtorch")
        ):
            problems.append(f"excluded library bundled: {path.relative_to(bundle)}")
    return problems


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _timed_json(report: dict, name: str, command: list[str]) -> dict:
    """Run a frozen engine command that prints JSON; its seconds go in the report."""
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    report[f"{name}_seconds"] = round(time.perf_counter() - began, 2)
    if done.returncode != 0:
        raise RuntimeError(f"frozen {name.replace('_', ' ')} failed: {done.stderr}")
    return json.loads(done.stdout)


def smoke(bundle: Path) -> dict:
    """Run the frozen executables; returns their results (raises on failure)."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    report: dict = {}
    began = time.perf_counter()
    proc = subprocess.run(
        [str(bundle / "export-studio"), "--self-test"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report["self_test_seconds"] = round(time.perf_counter() - began, 2)
    report["self_test_output"] = proc.stdout.strip().splitlines()[-1:] if proc.stdout else []
    if proc.returncode != 0:
        raise RuntimeError(f"--self-test failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Path(tmp) / "settings.ini"
        began = time.perf_counter()
        shown = subprocess.run(
            [str(bundle / "export-studio"), "--exit-when-shown", "--settings", str(settings)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        report["start_to_exit_seconds"] = round(time.perf_counter() - began, 2)
        if shown.returncode != 0:
            raise RuntimeError(f"start failed: {shown.stderr}")
        report["start"] = json.loads(shown.stdout.strip().splitlines()[-1])
        out = Path(tmp) / "pkg"
        engine = bundle / "export-studio-engine"
        command = ["build", "--preset", "gemma4-tiny", "--random-weights", "--quiet", "--json"]
        built = _timed_json(report, "engine_build", [str(engine), *command, str(out)])
        files = built["files"]
        missing = {"model.onnx", "model.onnx.data", "genai_config.json"} - set(files)
        if missing:
            raise RuntimeError(f"frozen engine build wrote no {sorted(missing)}")
        report["engine_build_files"] = sorted(files)
        # bench runs each setting in a spawned child: the frozen program again
        quick = ["--prompt-len", "4", "--new-tokens", "2", "--repeats", "1", "--warmup", "0"]
        bench = _timed_json(
            report, "engine_bench", [str(engine), "bench", str(out), *quick, "--json"]
        )
        report["engine_bench_decode_tokens_per_second"] = bench["decode_tokens_per_second"]
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", default=str(ROOT / "dist"))
    parser.add_argument("--work", default=str(ROOT / "build"))
    parser.add_argument("--skip-build", action="store_true", help="check an existing bundle")
    args = parser.parse_args()
    dist = Path(args.dist)
    bundle = dist / BUNDLE_NAME
    report: dict = {"bundle": str(bundle)}
    try:
        if not args.skip_build:
            report["build_seconds"] = round(build(dist, Path(args.work)), 1)
        problems = check_bundle(bundle)
        report["problems"] = problems
        if problems:
            raise RuntimeError("; ".join(problems))
        report["bundle_bytes"] = folder_bytes(bundle)
        report.update(smoke(bundle))
        report["ok"] = True
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        report["ok"] = False
        report["error"] = str(exc)[-4000:]
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
