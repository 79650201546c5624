"""Run one session of a package (an encoder: vision, speech) on the WebGPU EP.

Runs inside the WebGPU environment (scripts/setup-webgpu.sh makes .venv-webgpu); never
imports the engine. Node placement as tests/webgpu/run_package.py measures it (a strict
session with CPU fallback disabled, plus onnxruntime's verbose "Node placements" log), then
one run per feed set with the strict session. Writes one JSON report.

usage:
  python tests/webgpu/run_session.py MODEL.onnx FEEDS.npz OUT.npz --json-out REPORT.json

FEEDS.npz holds ``<run>/<input name>`` arrays; OUT.npz gets ``<run>/<output name>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import webgpu_ort
from run_package import _session_options, node_placement, probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("feeds", type=Path)
    parser.add_argument("outputs", type=Path)
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"probe": probe()}
    if report["probe"]["adapter_ok"]:
        report["placement"] = node_placement(args.model)
        report["runs"] = _run(args.model, args.feeds, args.outputs)
    args.json_out.write_text(json.dumps(report, indent=1))
    return 0


def _run(model: Path, feeds_path: Path, outputs_path: Path) -> dict[str, Any]:
    try:
        session = webgpu_ort.session(model, _session_options(strict=True))
    except Exception as exc:
        return {"error": str(exc).strip().splitlines()[-1][:2000]}
    feeds: dict[str, dict[str, np.ndarray]] = {}
    with np.load(feeds_path) as data:
        for key in data.files:
            run, name = key.split("/", 1)
            feeds.setdefault(run, {})[name] = data[key]
    names = [o.name for o in session.get_outputs()]
    results: dict[str, Any] = {}
    saved: dict[str, np.ndarray] = {}
    for run, inputs in feeds.items():
        started = time.perf_counter()
        try:
            outputs = session.run(None, inputs)
        except Exception as exc:
            results[run] = {"error": str(exc).strip().splitlines()[-1][:2000]}
            continue
        results[run] = {"seconds": round(time.perf_counter() - started, 4)}
        for name, value in zip(names, outputs, strict=True):
            saved[f"{run}/{name}"] = value
            results[run][name] = {"dtype": str(value.dtype), "shape": list(value.shape)}
    np.savez(outputs_path, **saved)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
