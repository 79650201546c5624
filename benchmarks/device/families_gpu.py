"""Full-size Llama 3.2 1B, Qwen3 1.7B (random weights) and Gemma 4 E2B's text decoder on
the lent H200, on the CUDA EP (onnxruntime-gpu 1.31.1 + onnxruntime-genai-cuda 0.18.0)
and on WebGPU through Vulkan (onnxruntime-webgpu 1.27 + onnxruntime-genai 0.18.0), in one
device call.

For each preset and variant (INT4 weights + INT4 tables, fp16): the package is built with
``python -m engine build --preset P --random-weights --ep EP``; ``python -m engine audit``
measures where each node runs (a node that leaves the EP breaks CUDA graphs and
WebGPU capture); ``python -m engine bench --runtime genai --graph-capture both`` measures
decode tok/s with capture off and on (and that both give the same tokens), then our own
runner. Every stage is a subprocess with a timeout inside one budget; the JSON report
(``$OUT/families_gpu.json``) is rewritten after each, so a crash keeps what was measured.
Each package is deleted after its last stage (64 GiB disk).

The two runtimes cannot share a folder (onnxruntime-gpu and onnxruntime-webgpu are both
``onnxruntime``): the CUDA wheels go to ``--cuda-site``, the WebGPU ones to ``--webgpu-site``
(the device README's recipe), and each stage runs with its own PYTHONPATH.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_bench import run as _run
from stage_report import Report

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {
    "int4": ["--weight-bits", "4", "--embedding-bits", "4"],
    "fp16": ["--dtype", "fp16"],
}


_CUDA_GRAPH_SESSION = r"""
import sys, onnxruntime as ort
options = ort.SessionOptions()
options.log_severity_level = 0
try:
    ort.InferenceSession(sys.argv[1], options, providers=[
        ("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"])
    print("SESSION_OK")
except Exception as exc:
    print("SESSION_ERROR", exc)
"""
"""A CUDA session with CUDA graphs on, its verbose log kept: the nodes placed on the CPU
and the Memcpy nodes partitioning made (either refuses capture)."""


def _cuda_graph_check(package: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    model = next(iter(sorted(package.glob("*.onnx"))), None)
    if model is None:
        return {"error": "no .onnx file"}
    cmd = [sys.executable, "-c", _CUDA_GRAPH_SESSION, str(model)]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout}
    keep = ("Memcpy", "placed on [CPU", "cannot use the graph capture")
    lines = [line[-240:] for line in done.stderr.splitlines() if any(k in line for k in keep)]
    return {
        "rc": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "stdout": done.stdout[-2000:],
        "log_lines": lines[-60:],
    }


def cuda_env(site: str, engine: Path = REPO) -> dict[str, str]:
    """The environment of a child that runs onnxruntime-gpu from ``site`` (put first on
    PYTHONPATH; empty: this interpreter's own onnxruntime) with the image's CUDA libraries,
    importing the engine from ``engine`` (default this checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([site, str(engine)]) if site else str(engine)
    env["PYTHONUNBUFFERED"] = "1"
    libs = glob.glob(
        str(Path(sys.prefix) / "lib" / "python3*" / "*-packages" / "nvidia" / "*" / "lib")
    )
    env["LD_LIBRARY_PATH"] = ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--presets", default="llama3.2-1b,qwen3-1.7b,gemma4-e2b")
    parser.add_argument("--eps", default="cuda,webgpu")
    parser.add_argument("--variants", default="int4,fp16")
    parser.add_argument("--cuda-site", default="/tmp/site_cuda")
    parser.add_argument("--webgpu-site", default="/tmp/site")
    parser.add_argument("--work", default="/tmp/families")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    report = Report(out_dir / "families_gpu.json", args.budget_s, "families_gpu")
    sites = {"cuda": args.cuda_site, "webgpu": args.webgpu_site, "cpu": ""}  # cpu: a dry run
    probe = (
        "import json, onnxruntime as o, onnxruntime_genai as g; "
        "print(json.dumps([o.__version__, o.get_available_providers(), g.__version__]))"
    )
    for ep in args.eps.split(","):
        report.stage(f"probe_{ep}", _run([sys.executable, "-c", probe], 60, cuda_env(sites[ep])))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bench_flags = [
        "--prompt-len",
        str(args.prompt_len),
        "--new-tokens",
        str(args.new_tokens),
        "--repeats",
        "3",
        "--json",
    ]
    for preset in args.presets.split(","):
        for ep in args.eps.split(","):
            env = cuda_env(sites[ep])
            for variant in args.variants.split(","):
                name = f"{preset}/{ep}/{variant}"
                package = work / f"{preset}-{ep}-{variant}"
                stage: dict[str, Any] = {}
                build = [sys.executable, "-m", "engine", "build", "--preset", preset]
                build += ["--random-weights", "--ep", ep, "--modalities", "text"]
                build += [*VARIANTS[variant], "--quiet", "--json", "--overwrite", str(package)]
                stage["build"] = _run(build, min(300, report.remaining() - 30), env)
                report.stage(name, stage)
                if stage["build"].get("rc") == 0:
                    audit = [sys.executable, "-m", "engine", "audit", str(package), "--json"]
                    stage["audit"] = _run(audit, min(120, report.remaining() - 20), env)
                    report.stage(name, stage)
                    if ep == "cuda":
                        stage["cuda_graph_session"] = _cuda_graph_check(
                            package, min(120, report.remaining() - 20), env
                        )
                        report.stage(name, stage)
                    genai = [sys.executable, "-m", "engine", "bench", str(package), "--ep", ep]
                    genai += ["--runtime", "genai", "--graph-capture", "both", *bench_flags]
                    stage["bench_genai"] = _run(genai, min(240, report.remaining() - 20), env)
                    report.stage(name, stage)
                    ours = [sys.executable, "-m", "engine", "bench", str(package), "--ep", ep]
                    ours += ["--runtime", "ort", *bench_flags]
                    stage["bench_ort"] = _run(ours, min(180, report.remaining() - 10), env)
                    report.stage(name, stage)
                shutil.rmtree(package, ignore_errors=True)


if __name__ == "__main__":
    main()
