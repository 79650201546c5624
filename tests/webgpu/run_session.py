"""Run one ONNX session (an encoder: speech, vision) on WebGPU with inputs from an .npz.

Runs inside the WebGPU environment (scripts/setup-webgpu.sh); never imports the engine.
The session is created with ``session.disable_cpu_ep_fallback=1`` and the WebGPU EP only,
so creation fails if any node would run on the CPU; a separate verbose session records
onnxruntime's "Node placements" log (run_package.node_placement). Each input set
``NAME__i`` in the .npz (``i`` = 0, 1, ...) is one run; outputs are saved the same way.

usage:
  python tests/webgpu/run_session.py MODEL.onnx INPUTS.npz OUTPUTS.npz --json-out R.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_package import WEBGPU, node_placement


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("outputs")
    parser.add_argument("--json-out", required=True)
    args = parser.parse_args()
    report: dict = {"onnxruntime": ort.__version__, "model": args.model}
    try:
        report["placement"] = node_placement(Path(args.model))
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        session = ort.InferenceSession(args.model, options, providers=[WEBGPU])
        report["providers"] = session.get_providers()
        feeds = np.load(args.inputs)
        runs: dict[int, dict[str, np.ndarray]] = {}
        for key in feeds.files:
            name, _, index = key.rpartition("__")
            runs.setdefault(int(index), {})[name] = feeds[key]
        names = [o.name for o in session.get_outputs()]
        saved, seconds = {}, []
        for index, feed in sorted(runs.items()):
            start = time.perf_counter()
            values = session.run(None, feed)
            seconds.append(time.perf_counter() - start)
            saved.update({f"{n}__{index}": v for n, v in zip(names, values, strict=True)})
        np.savez(args.outputs, **saved)
        report["seconds"] = seconds
    except Exception as exc:  # the report says what failed; the caller asserts on it
        report["error"] = f"{type(exc).__name__}: {exc}"
    Path(args.json_out).write_text(json.dumps(report, indent=1))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    raise SystemExit(main())
