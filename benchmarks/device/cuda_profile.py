"""Where a decode step's GPU time goes on the CUDA EP: Gemma 4 E2B's text decoder (random
weights, fp16 and INT4 + INT4 tables) through onnxruntime-genai-cuda, CUDA graphs off and
on, every kernel timed by CUPTI through torch's profiler (the image's torch shares the
process's CUDA context, so the kernels onnxruntime launches are recorded too; onnxruntime's
own profiler times only the host side of CUDA nodes in a release build).

Per package and mode: the decode rate without the profiler (``--steps`` tokens after a
``--prompt-len`` prompt), then one profiled window of the same steps: kernel launches and
GPU microseconds per token, the busiest kernels (name, launches per token, µs per token),
the GEMV / GEMM launches by kernel and grid (which projection shapes cost what),
and the share of the step the GPU is busy at all (the rest is launch and host time). Also
the prefill rate of a 1,024-token prompt (first call excluded), and one more such prefill
profiled: its kernels by name and grid (``prefill_top_kernels``).

    python3 benchmarks/device/cuda_profile.py --cuda-site /tmp/site_cuda

``--baseline DIR`` also builds every variant with the engine in DIR (another commit's
``engine/`` and ``resources/``, e.g. ``git archive REV engine resources``) and measures the
two packages one after the other, ``<variant>@baseline`` first, so a change is compared
within one run on one machine; ``--baseline DIR1,DIR2`` measures each in turn (stages
``<variant>@<DIR's name>``), then this checkout's; ``--baseline-variants`` names the
variants the baselines build (the others, this checkout's only). ``--captures 1`` measures
CUDA graphs on only.

``--lengths 4096,1032`` measures each package at those ``search.max_length`` values (stage
keys ``graph_on@<length>``; default the package's own, 4,096; results before
``2026-12-06c`` were taken at 1,032); ``--sequence VARIANTS`` also
writes every kernel of two decode steps in launch order (``$OUT/sequence-*.json``).

Writes ``$OUT/cuda_profile.json`` after every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from families_gpu import cuda_env
from gpu_bench import run as _run
from stage_report import Report

_INT4 = ["--weight-bits", "4", "--embedding-bits", "4"]
_FPA = {"ORT_FPA_INTB_GEMM": "1"}
_PLE_FP16 = ["--keep-float", "layers.*.per_layer_input_gate.weight"]
_PLE_FP16 += ["--keep-float", "layers.*.per_layer_projection.weight"]
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "fp16": (["--dtype", "fp16"], {}),
    "bf16": (["--dtype", "bf16"], {}),
    "int4": (_INT4, {}),
    "int4-b64": ([*_INT4, "--block-size", "64"], {}),
    "int4-b128": ([*_INT4, "--block-size", "128"], {}),
    # onnxruntime-gpu's fpA_intB GEMM / GEMV (TensorRT-LLM's weight-only kernels) is opt-in:
    # session config ep.cuda.fpa_intb_gemm (which genai 0.18's genai_config cannot set) or
    # this environment variable; without it MatMulNBits runs its own M=1 kernel.
    "int4-fpa": (_INT4, _FPA),
    "int4-b64-fpa": ([*_INT4, "--block-size", "64"], _FPA),
    "int4-b128-fpa": ([*_INT4, "--block-size", "128"], _FPA),
    "int4-sym": ([*_INT4, "--symmetric"], {}),
    # the fpA_intB path in onnxruntime-gpu's default (compact) build takes only scale-only
    # (symmetric) weights, block 32: the asymmetric packages above never reached it
    "int4-sym-fpa": ([*_INT4, "--symmetric"], _FPA),
    "int4-b64-sym-fpa": ([*_INT4, "--block-size", "64", "--symmetric"], _FPA),
    "int4-b128-sym-fpa": ([*_INT4, "--block-size", "128", "--symmetric"], _FPA),
    "int8-sym-fpa": (["--weight-bits", "8", "--embedding-bits", "4", "--symmetric"], _FPA),
    "int4-b128-sym": ([*_INT4, "--block-size", "128", "--symmetric"], {}),
    "int8": (["--weight-bits", "8", "--embedding-bits", "4"], {}),
    "int8-sym": (["--weight-bits", "8", "--embedding-bits", "4", "--symmetric"], {}),
    # the per-layer input's two small projections (1536 -> 256 -> 1536) left in fp16
    "int4-b128-sym-ple-fp16": ([*_INT4, "--block-size", "128", "--symmetric", *_PLE_FP16], {}),
    # GroupQueryAttention's decode kernels: XQA (TensorRT-LLM's, on by default for fp16 /
    # bf16 where the shape is eligible) off, so Flash decode serves those layers; Flash's
    # split-KV decode off (one kernel where it launched a split and a combine).
    "fp16-noxqa": (["--dtype", "fp16"], {"ORT_ENABLE_XQA": "0"}),
    "int4-noxqa": (_INT4, {"ORT_ENABLE_XQA": "0"}),
    "fp16-nosplitkv": (["--dtype", "fp16"], {"ORT_DISABLE_FLASH_DECODE": "1"}),
    "int4-nosplitkv": (_INT4, {"ORT_DISABLE_FLASH_DECODE": "1"}),
}

# Variants that set session config entries in the decoder's genai_config (genai passes
# unknown ``session_options`` keys to AddConfigEntry): the same package, a patched copy of
# its genai_config beside links to its other files.
SESSION_ENTRIES: dict[str, dict[str, str]] = {
    "int4-sym-fpa-config": {"ep.cuda.fpa_intb_gemm": "1"},
}
VARIANTS["int4-sym-fpa-config"] = ([*_INT4, "--symmetric"], {})

_PROFILE = r"""
import collections, json, os, sys, tempfile, time
import torch  # first: its CUPTI-backed profiler records every kernel of the process
import numpy as np
import onnxruntime_genai as og

package, capture, prompt_len, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
entries = json.loads(os.environ.get("PROFILE_SESSION_ENTRIES") or "{}")
if entries:  # a copy of the package: links to its files, genai_config patched
    patched = tempfile.mkdtemp()
    for f in os.listdir(package):
        if f != "genai_config.json":
            os.symlink(os.path.join(package, f), os.path.join(patched, f))
    doc = json.load(open(os.path.join(package, "genai_config.json")))
    doc["model"]["decoder"].setdefault("session_options", {}).update(entries)
    json.dump(doc, open(os.path.join(patched, "genai_config.json"), "w"))
    package = patched
config = og.Config(package)
config.clear_providers()
config.append_provider("cuda")
config.set_provider_option("cuda", "enable_cuda_graph", capture)
model = og.Model(config)
rng = np.random.default_rng(0)
out = {"capture": capture == "1"}

# one length: one captured graph; default the package's own (what genai uses), at least
# the 1,024-token prefill's
default = json.load(open(os.path.join(package, "genai_config.json")))["search"]["max_length"]
LENGTH = int(os.environ.get("PROFILE_LENGTH") or max(default, prompt_len + 2 * steps + 8, 1032))
out["max_length"] = LENGTH

def generator():
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=LENGTH, do_sample=False)
    return og.Generator(model, params)

def decode(gen, n):
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(n):
        gen.generate_next_token()
    gen.get_next_tokens()
    torch.cuda.synchronize()
    return time.perf_counter() - started

prompt = rng.integers(10, 200, prompt_len).tolist()
rates = []
for _ in range(3):
    gen = generator()
    gen.append_tokens(prompt)
    decode(gen, 4)
    rates.append(steps / decode(gen, steps))
out["decode_tok_s"] = sorted(rates)[1]
gen = generator()
gen.append_tokens(prompt)
decode(gen, 4)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    window = decode(gen, steps)
trace = tempfile.mktemp(suffix=".json")
prof.export_chrome_trace(trace)
events = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") == "kernel"]
by_name = collections.defaultdict(lambda: [0, 0.0])
for e in events:
    by_name[e["name"]][0] += 1
    by_name[e["name"]][1] += float(e.get("dur", 0))
busy = sum(t for _, t in by_name.values())
out["profiled_ms_per_token"] = round(window / steps * 1e3, 3)
out["kernels_per_token"] = round(len(events) / steps, 1)
out["gpu_busy_us_per_token"] = round(busy / steps, 1)
out["gpu_busy_share"] = round(busy / (window * 1e6), 3)
top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
out["top_kernels"] = [
    {"kernel": name[:160], "per_token": round(n / steps, 1), "us_per_token": round(t / steps, 1),
     "share": round(t / busy, 3)} for name, (n, t) in top
]
sequence = os.environ.get("PROFILE_SEQUENCE_OUT")
if sequence:  # every kernel of the window's first two steps, in launch order
    ordered = sorted(events, key=lambda e: e["ts"])[: int(2 * len(events) / steps) + 1]
    rows = [[e["name"][:110], round(float(e.get("dur", 0)), 2), str(e.get("args", {}).get("grid"))]
            for e in ordered]
    json.dump(rows, open(sequence, "w"))
grids = collections.defaultdict(lambda: [0, 0.0])  # GEMV / GEMM launches by kernel and grid
for e in events:
    if any(key in e["name"] for key in ("MatMul", "nvjet", "gemv", "gemm", "Gemv", "Gemm", "fpA")):
        launches = grids[(e["name"][:70], str(e.get("args", {}).get("grid")))]
        launches[0] += 1
        launches[1] += float(e.get("dur", 0))
out["matmul_grids"] = [
    {"kernel": name, "grid": grid, "per_token": round(n / steps, 1),
     "us_each": round(t / n, 2), "us_per_token": round(t / steps, 1)}
    for (name, grid), (n, t) in sorted(grids.items(), key=lambda kv: -kv[1][1])[:24]
]
if prompt_len < 1024:
    timings = []
    for _ in range(3):
        gen = generator()
        torch.cuda.synchronize()
        started = time.perf_counter()
        gen.append_tokens(rng.integers(10, 200, 1024).tolist())
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - started)
    out["prefill_1024_tok_s"] = round(1024 / min(timings[1:]), 1)
    out["prefill_1024_first_s"] = round(timings[0], 3)
    # where a 1,024-token prefill's GPU time goes, by kernel and by GEMM grid
    gen = generator()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        started = time.perf_counter()
        gen.append_tokens(rng.integers(10, 200, 1024).tolist())
        torch.cuda.synchronize()
        window = time.perf_counter() - started
    prof.export_chrome_trace(trace)
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") == "kernel"]
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        launch = by_name[(e["name"][:160], str(e.get("args", {}).get("grid")))]
        launch[0] += 1
        launch[1] += float(e.get("dur", 0))
    busy = sum(t for _, t in by_name.values())
    out["prefill_profiled_ms"] = round(window * 1e3, 2)
    out["prefill_kernels"] = len(events)
    out["prefill_gpu_busy_ms"] = round(busy / 1e3, 2)
    out["prefill_top_kernels"] = [
        {"kernel": name, "grid": grid, "launches": n, "us": round(t, 1),
         "share": round(t / busy, 3)}
        for (name, grid), (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:30]
    ]
free, total = torch.cuda.mem_get_info()
out["gpu_used_mib_at_end"] = round((total - free) / 2**20)
print("PROFILE_JSON", json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--variants", default="fp16,int4")
    parser.add_argument("--cuda-site", default="/tmp/site_cuda")
    parser.add_argument("--work", default="/tmp/cuda_profile")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument(
        "--baseline", default="", help="other checkouts' engines to compare (comma-separated)"
    )
    parser.add_argument("--captures", default="0,1", help="CUDA graph modes: 0, 1 or both")
    parser.add_argument(
        "--baseline-variants", default="", help="variants the baselines build (default: all)"
    )
    parser.add_argument(
        "--lengths",
        default="",
        help="search.max_length values to measure (default: the package's own, 4,096 for "
        "these packages; results before 2026-12-06c were measured at 1,032)",
    )
    parser.add_argument(
        "--sequence", default="", help="variants whose kernels of two steps are saved in order"
    )
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    report = Report(out_dir / "cuda_profile.json", args.budget_s, "cuda_profile")
    env = cuda_env(args.cuda_site)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    built: dict[str, Path] = {}  # variants that differ only in the environment share a package
    dirs = [d for d in args.baseline.split(",") if d]
    engines = [("@" + Path(d).name.lstrip(".") if len(dirs) > 1 else "@baseline", d) for d in dirs]
    with_baseline = set(args.baseline_variants.split(",")) if args.baseline_variants else None
    for variant in args.variants.split(","):
        others = engines if with_baseline is None or variant in with_baseline else []
        for suffix, engine_dir in [*others, ("", "")]:
            name = variant + suffix
            _measure(name, variant, engine_dir, args, env, work, built, report)
    for package in built.values():
        shutil.rmtree(package, ignore_errors=True)


def _measure(
    name: str,
    variant: str,
    engine_dir: str,
    args: argparse.Namespace,
    env: dict[str, str],
    work: Path,
    built: dict[str, Path],
    report: Report,
) -> None:
    """Build (or reuse) one variant's package with the engine in ``engine_dir`` (empty:
    this checkout's) and profile it in each CUDA graph mode."""
    flags, extra_env = VARIANTS[variant]
    stage: dict[str, Any] = {}
    key = " ".join([*flags, engine_dir])
    build_env = env
    if engine_dir:
        build_env = cuda_env(args.cuda_site, Path(engine_dir).resolve())
        stage["engine"] = engine_dir
    if key in built:
        package = built[key]
        stage["build"] = {"rc": 0, "reused": str(package)}
    else:
        package = work / f"{args.preset}-{name.replace('@', '-')}"
        build = [sys.executable, "-m", "engine", "build", "--preset", args.preset]
        build += ["--random-weights", "--ep", "cuda", "--modalities", "text"]
        build += [*flags, "--quiet", "--overwrite", str(package)]
        cwd = str(Path(engine_dir).resolve()) if engine_dir else None
        stage["build"] = _run(build, min(300, report.remaining() - 60), build_env, cwd=cwd)
        built[key] = package
    stage["env"] = extra_env | SESSION_ENTRIES.get(variant, {})
    report.stage(name, stage)
    if stage["build"].get("rc") != 0:
        return
    lengths = [x for x in args.lengths.split(",") if x] or [""]
    for capture, length in [(c, n) for c in args.captures.split(",") for n in lengths]:
        profile = [sys.executable, "-c", _PROFILE, str(package), capture]
        profile += [str(args.prompt_len), str(args.steps)]
        child = env | extra_env | {"PROFILE_LENGTH": length}
        if variant in SESSION_ENTRIES:
            child = child | {"PROFILE_SESSION_ENTRIES": json.dumps(SESSION_ENTRIES[variant])}
        if variant in args.sequence.split(","):
            tag = f"{name.replace('@', '-')}-{capture}" + (f"-{length}" if length else "")
            out = Path(os.environ.get("OUT", "/tmp/out")) / f"sequence-{tag}.json"
            child = child | {"PROFILE_SEQUENCE_OUT": str(out)}
        done = _run(profile, min(180, report.remaining() - 10), child)
        lines = [x for x in done.get("stdout", "").splitlines() if x.startswith("PROFILE")]
        if lines:
            done = json.loads(lines[-1].split(" ", 1)[1]) | {"seconds": done["seconds"]}
        key = f"graph_{'on' if capture == '1' else 'off'}"
        key += f"@{length}" if len(lengths) > 1 else ""
        stage[key] = done
        report.stage(name, stage)


if __name__ == "__main__":
    main()
