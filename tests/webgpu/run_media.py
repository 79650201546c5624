"""Run a multimodal package through onnxruntime-genai on one EP, with images and audio.

Runs inside the WebGPU environment (or the main one with ``--ep cpu``): genai's own
processors, greedy tokens and every step's logits, capture on or off; for the WebGPU EP
also whether every decoder node is placed on it (a strict onnxruntime session with CPU
fallback disabled). Prints nothing; writes one JSON report and an ``.npz`` of logits.

    .venv-webgpu/bin/python tests/webgpu/run_media.py PKG --image A.png --audio B.wav \
        --steps 12 --capture 0 --json-out r.json --save-logits l.npz
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's engine

import numpy as np

from engine.runtime.genai_runner import GenaiRunner
from engine.runtime.media import MediaPrompt


def _decoder_on_webgpu(package: Path) -> bool | str:
    """True when onnxruntime places every decoder node on WebGPU, else its message."""
    import onnxruntime as ort

    config = json.loads((package / "genai_config.json").read_text())
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        ort.InferenceSession(
            str(package / config["model"]["decoder"]["filename"]),
            options,
            providers=["WebGpuExecutionProvider"],
        )
    except Exception as exc:  # the message is the finding
        return str(exc)[-400:]
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--ep", default="webgpu")
    parser.add_argument("--image", action="append", default=[])
    parser.add_argument("--audio", action="append", default=[])
    parser.add_argument("--text", default="look and listen")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--capture", type=int, choices=(0, 1), default=0)
    parser.add_argument("--json-out", type=Path, required=True)
    parser.add_argument("--save-logits", type=Path, required=True)
    args = parser.parse_args()
    report: dict[str, object] = {"ep": args.ep, "capture": bool(args.capture)}
    try:
        if args.ep == "webgpu":
            report["decoder_on_webgpu"] = _decoder_on_webgpu(args.package)
        runner = GenaiRunner(args.package, ep=args.ep, graph_capture=bool(args.capture))
        prompt = MediaPrompt.build(args.text, tuple(args.image), tuple(args.audio))
        run = runner.generate_media(prompt, args.steps, keep_logits=True)
        report["provider"] = runner.provider
        report["tokens"] = list(run.tokens)
        np.savez(args.save_logits, logits=np.stack(run.logits))
    except Exception as exc:  # reported, not raised: the caller asserts on the report
        report["error"] = f"{type(exc).__name__}: {exc}"
    args.json_out.write_text(json.dumps(report, indent=1))
    sys.stdout.flush()
    os._exit(0)  # skip the WebGPU device teardown


if __name__ == "__main__":
    main()
