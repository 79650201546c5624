"""Full-size Gemma 4 E2B (random weights) on the lent NVIDIA H200: WebGPU through Vulkan.

One call of the device tool runs everything (benchmarks/device/README.md has the exact
command): the environment is recorded, the gemma4-e2b preset is built for WebGPU at INT4
(weights and embeddings) and fp16, in parallel; each package is benchmarked through our
runner and through onnxruntime-genai with graph capture off and on (capture validated
against no capture); the CUDA EP is tried where an onnxruntime-gpu wheel was carried.

Every stage runs in its own subprocess with a timeout inside an overall time budget, and
the JSON report is rewritten after each stage, so a crash or a timeout still leaves the
results so far in ``$OUT/gpu_bench.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stage_report import Report

REPO = Path(__file__).resolve().parents[2]
BUILD_MODULES = ("numpy", "onnx", "onnx_ir", "onnxscript", "safetensors", "ml_dtypes")
OPTIONAL_MODULES = ("tqdm", "onnxruntime", "onnxruntime_genai", "torch", "transformers")
DISTRIBUTIONS = {
    "onnx_ir": "onnx-ir",
    "ml_dtypes": "ml-dtypes",
    "onnxruntime_genai": "onnxruntime-genai",
}
ORT_PROBE = (
    "import json, onnxruntime as o; print(json.dumps([o.__version__, o.get_available_providers()]))"
)
VARIANTS = {
    "int4": ["--weight-bits", "4", "--embedding-bits", "4"],
    "fp16": ["--dtype", "fp16"],
}


def run(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> dict[str, Any]:
    """Run a command (in ``cwd``, default the checkout); never raises. Returns rc, seconds,
    stdout, stderr tail."""
    started = time.monotonic()
    if timeout < 5:
        return {"cmd": " ".join(cmd), "skipped": "no time left in the budget"}
    try:
        done = subprocess.run(
            cmd, cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        out = {"rc": done.returncode, "stdout": done.stdout, "stderr_tail": done.stderr[-3000:]}
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        out = {"rc": None, "timeout_s": round(timeout), "stderr_tail": stderr[-3000:]}
    except OSError as exc:
        out = {"rc": None, "error": str(exc)}
    out["cmd"] = " ".join(cmd)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    modules = {}
    for name in BUILD_MODULES + OPTIONAL_MODULES:
        spec = importlib.util.find_spec(name)
        version = None
        if spec is not None:
            try:
                version = importlib.metadata.version(DISTRIBUTIONS.get(name, name))
            except importlib.metadata.PackageNotFoundError:
                version = "?"
        modules[name] = {"version": version, "path": spec.origin if spec else None}
    env["modules"] = modules
    env["build_blockers"] = [m for m in BUILD_MODULES if modules[m]["version"] is None]
    for dist in ("onnxruntime", "onnxruntime-webgpu", "onnxruntime-gpu", "onnxruntime-genai"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            env.setdefault("distributions", {})[dist] = importlib.metadata.version(dist)
    env["onnxruntime_probe"] = run([sys.executable, "-c", ORT_PROBE], 60)
    smi = "name,driver_version,memory.total"
    env["nvidia_smi"] = run(["nvidia-smi", f"--query-gpu={smi}", "--format=csv,noheader"], 30)
    env["vk_driver_files"] = os.environ.get("VK_DRIVER_FILES")
    env["vk_icd_exists"] = bool(env["vk_driver_files"]) and Path(env["vk_driver_files"]).is_file()
    env["cpus"] = os.cpu_count()
    return env


def start_build(
    preset: str, variant: str, ep: str, root: Path
) -> tuple[subprocess.Popen[str], Path, float]:
    out = root / f"{preset}-{ep}-{variant}"
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "build",
        "--preset",
        preset,
        "--random-weights",
        "--ep",
        ep,
        *VARIANTS[variant],
        "--quiet",
        "--json",
        "--overwrite",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, out, time.monotonic()


def finish_build(proc: subprocess.Popen[str], out: Path, started: float, timeout: float) -> dict:
    try:
        stdout, stderr = proc.communicate(timeout=max(timeout, 1))
        result: dict[str, Any] = {"rc": proc.returncode, "stderr_tail": stderr[-3000:]}
        try:
            result["result"] = json.loads(stdout)
        except json.JSONDecodeError:
            result["stdout_tail"] = stdout[-2000:]
    except subprocess.TimeoutExpired:
        proc.kill()
        result = {"rc": None, "timeout_s": round(timeout)}
    result["cmd"] = " ".join(str(a) for a in proc.args)  # type: ignore[union-attr]
    result["seconds"] = round(time.monotonic() - started, 1)
    result["package"] = str(out)
    result["ok"] = result.get("rc") == 0 and (out / "genai_config.json").is_file()
    return result


def bench(
    package: Path,
    runtimes: str,
    args: argparse.Namespace,
    timeout: float,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> dict:
    cmd = [
        sys.executable,
        "benchmarks/bench_runtime.py",
        str(package),
        "--runtimes",
        runtimes,
        "--graph-capture",
        "both",
        "--prompt-len",
        str(args.prompt_len),
        "--new-tokens",
        str(args.new_tokens),
        "--repeats",
        str(args.repeats),
        "--warmup",
        "1",
        *(extra or []),
    ]
    result = run(cmd, timeout, env)
    stdout = result.pop("stdout", "")
    try:
        result["report"] = json.loads(stdout)
    except json.JSONDecodeError:
        result["stdout_tail"] = stdout[-2000:]
    return result


def cuda_stage(report: Report, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The CUDA EP, only where an onnxruntime-gpu wheel was carried in .whl/."""
    stage: dict[str, Any] = {}
    probe = (
        "import json, torch; print(json.dumps([torch.__version__, torch.cuda.is_available(),"
        " torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available()"
        " else None]))"
    )
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    stage["system_torch"] = run([sys.executable, "-c", probe], min(60, report.remaining()), clean)
    stage["system_onnxruntime"] = run(
        [sys.executable, "-c", ORT_PROBE], min(30, report.remaining()), clean
    )
    wheels = sorted(glob.glob(str(REPO / ".whl" / "onnxruntime_gpu-*.whl")))
    if not wheels:
        stage["status"] = "not run"
        stage["reason"] = (
            "no onnxruntime-gpu wheel in .whl/ (the cp312 manylinux wheel is several hundred "
            "MB, over the device tool's 64 MiB upload); system_onnxruntime shows what the "
            "image's own onnxruntime offers"
        )
        return stage
    site = Path("/tmp/site-cuda")
    stage["install"] = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(site),
            *wheels,
        ],
        120,
    )
    libs = glob.glob(
        str(Path(sys.prefix) / "lib" / "python3*" / "*-packages" / "nvidia" / "*" / "lib")
    )
    env = dict(clean, PYTHONPATH=f"{site}:{REPO}")
    env["LD_LIBRARY_PATH"] = ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])
    out = root / f"{args.preset}-cuda-int4"
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "build",
        "--preset",
        args.preset,
        "--random-weights",
        "--ep",
        "cuda",
        *VARIANTS["int4"],
        "--quiet",
        "--json",
        "--overwrite",
        str(out),
    ]
    stage["build"] = run(cmd, min(240, report.remaining() - 60), env)
    if stage["build"].get("rc") == 0:
        stage["bench_ort"] = bench(out, "ort", args, min(180, report.remaining() - 10), env)
    stage["status"] = "run"
    return stage


def summarize(stages: dict[str, Any]) -> dict[str, Any]:
    """variant -> runtime -> decode tok/s off / on, capture speed-up and validation."""
    table: dict[str, Any] = {}
    for key, value in stages.items():
        if not key.startswith("bench_") or not isinstance(value, dict):
            continue
        variant = key.split("_")[1]
        report = value.get("report") or {}
        for runtime, run in (report.get("runs") or {}).items():
            row = {m: (run.get(m) or {}).get("decode_tokens_per_second") for m in ("off", "on")}
            row["capture_speedup"] = run.get("capture_speedup")
            row["capture_validated"] = run.get("capture_validated")
            row["errors"] = run.get("errors")
            table.setdefault(variant, {})[runtime] = row
        if not report.get("runs"):
            table.setdefault(variant, {})["error"] = report.get("error") or (
                "timeout" if value.get("timeout_s") else "no report"
            )
    for rows in table.values():
        ours, genai = rows.get("ort") or {}, rows.get("genai") or {}
        rows["ort_over_genai"] = {
            mode: ours[mode] / genai[mode] if ours.get(mode) and genai.get(mode) else None
            for mode in ("off", "on")
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=540, help="overall time budget")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default="int4,fp16")
    parser.add_argument("--preset", default="gemma4-e2b", help="gemma4-tiny for a dry run")
    parser.add_argument("--ep", default="webgpu")
    parser.add_argument("--work", default="/tmp/gpu-bench", help="where packages are built")
    parser.add_argument("--skip-cuda", action="store_true")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", REPO / "benchmarks" / "results"))
    report = Report(out / "gpu_bench.json", args.budget_s, "gpu_bench", indent=2)
    report.stage("environment", environment())
    if report.data["stages"]["environment"]["build_blockers"]:
        report.data["error"] = "missing build modules; carry their wheels (README)"
        report.save()
        return
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    variants = [v for v in args.variants.split(",") if v in VARIANTS]
    # Builds run in parallel on the CPU; each variant is benchmarked on the GPU as soon
    # as its package is ready (the next build may still be running: noted per bench).
    builds = {v: start_build(args.preset, v, args.ep, root) for v in variants}
    for variant in variants:
        proc, path, started = builds[variant]
        build = finish_build(proc, path, started, report.remaining() - 30)
        report.stage(f"build_{variant}", build)
        if not build["ok"]:
            continue
        # Both runtimes in one process, runs interleaved; if that process dies (a crash
        # in one runtime), each runtime is retried alone while time remains.
        busy = [v for v, (p, _, _) in builds.items() if p.poll() is None]
        result = bench(path, "ort,genai", args, min(300, report.remaining() - 20))
        result["concurrent_builds"] = busy
        report.stage(f"bench_{variant}", result)
        if "runs" not in (result.get("report") or {}):
            for runtime in ("ort", "genai"):
                alone = bench(path, runtime, args, min(150, report.remaining() - 20))
                report.stage(f"bench_{variant}_{runtime}", alone)
        report.data["summary"] = summarize(report.data["stages"])
        report.save()
    for proc, _, _ in builds.values():
        if proc.poll() is None:
            proc.kill()
    if not args.skip_cuda:
        try:
            report.stage("cuda", cuda_stage(report, root, args))
        except Exception as exc:  # the report must be written whatever happens
            report.stage("cuda", {"status": "failed", "error": repr(exc)})
    report.data["summary"] = summarize(report.data["stages"])
    report.data["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    report.save()
    print(json.dumps(report.data.get("summary"), indent=2))


if __name__ == "__main__":
    main()
