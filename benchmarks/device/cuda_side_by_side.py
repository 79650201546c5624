"""Gemma 4 E2B on CUDA, ours against the peer exporter (mobius), in one device call (issue 19).

Run after the onnxruntime-gpu wheel's parts are on the machine, with onnxruntime-gpu and
onnxruntime-genai-cuda installed in ``--cuda-site`` (benchmarks/device/README.md):

1. records the environment and the CUDA runtime the children import;
2. builds one random full-size checkpoint (``--preset``) with transformers on the GPU (the
   peer's transformers first on PYTHONPATH, so both exporters read a config they know);
3. transformers' fp32 reference on the GPU (eager attention, TF32 off): greedy tokens after
   a seeded random prompt and the last logits row of every step;
4. ours fp32 (``ours_fp32``), run through our runner on the CUDA EP (without CUDA graphs:
   an fp32 CUDA package has no GroupQueryAttention, so no shared KV buffer), teacher-forced
   on transformers' tokens (max |logit diff|, cosine and top-1 per step) and free running
   (transformers' tokens reproduced before the first difference), then deleted (an fp32
   E2B package is ~20 GB of the disk's 64);
5. exports at once: ours INT4 + INT4 (default flags, and ``--symmetric --block-size 128``,
   the fastest CUDA layout), INT8 weights + INT4 tables, fp16, bf16, and mobius fp16;
   each export's wall time, peak RSS and decoder nodes; the checkpoint is deleted;
6. every package through onnxruntime-genai with CUDA graph off and on at the package's
   default ``search.max_length`` and at ``--short-length`` (prompt 128 random ids, 64 new
   tokens, median of 3 after a warm-up): decode tok/s, TTFT, prefill tok/s and the GPU
   memory the process held; a ``--long-prompt`` (1,024) prompt with CUDA graph on for
   prefill tok/s; our runner (``python -m engine bench --graph-capture both``) on ours;
   ours fp16 against transformers as in 4, with CUDA graphs.

Stages are subprocesses with timeouts inside one budget, most wanted first, and the JSON
(``$OUT/cuda_side_by_side.json``) is rewritten after every stage, so a crash or the budget
keeps what was measured; ``summary`` holds the table. ``--tiny`` runs the same steps at toy
size on the CPU EP (no bf16 there; the peer is skipped when it is not installed):
tests/benchmarks/test_cuda_side_by_side.py runs it.

    python3 benchmarks/device/cuda_side_by_side.py --cuda-site /tmp/site_cuda --budget-s 560
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from cuda_parity import RUN as PARITY_RUN
from families_gpu import cuda_env
from stage_report import Report
from webgpu_runtimes import child, compare, stdout_json
from webgpu_side_by_side import (
    REPO,
    STAGES,
    Action,
    Child,
    environment,
    exports,
    genai_bench,
    make_checkpoint,
    ours_bench,
    peer_env,
    remove,
    run_plan,
    summarize,
)

INT4 = ["--weight-bits", "4", "--embedding-bits", "4"]
OURS = {
    "int4": INT4,
    # the fastest INT4 layout measured on CUDA (MatMulNBits' M=1 kernel reads no zero points)
    "int4_sym128": [*INT4, "--symmetric", "--block-size", "128"],
    "int8": ["--weight-bits", "8", "--embedding-bits", "4"],
    "fp16": ["--dtype", "fp16"],
    "bf16": ["--dtype", "bf16"],
}
TEXT = ["--modalities", "text"]
DEFAULT_PACKAGES = "ours_fp32,ours_int4,ours_int4_sym128,ours_int8,ours_fp16,ours_bf16,mobius_fp16"
TINY_FLAGS = {"int4_sym128": ["--block-size", "32"]}
"""At toy size, what each variant adds to its flags (the last --block-size wins)."""
TINY_PACKAGES = "ours_fp32,ours_int4,ours_int4_sym128,ours_int8,ours_fp16,mobius_fp16"
"""The CPU EP has no bf16 kernels."""

REFERENCE = """
import argparse, json, sys
sys.path.insert(0, sys.argv[7])  # benchmarks/device
from webgpu_runtimes import reference
checkpoint, out, seed, prompt, steps, device = sys.argv[1:7]
args = argparse.Namespace(seed=int(seed), prompt_len=int(prompt), steps=int(steps), device=device)
print(json.dumps(reference(args, __import__("pathlib").Path(checkpoint), out)))
"""

RUNTIME = """
import json, onnxruntime as ort
out = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers()}
try:
    import onnxruntime_genai as og
    out["onnxruntime_genai"] = getattr(og, "__version__", "?")
except ImportError as exc:
    out["onnxruntime_genai"] = f"missing: {exc}"
print(json.dumps(out))
"""


def parity(
    args: argparse.Namespace,
    report: Report,
    name: str,
    package: Path,
    ref: dict[str, Any],
    timeout: float = 300,
) -> None:
    """One of our packages through our runner, teacher-forced on transformers' tokens and
    free running, against transformers' rows (``reference.npy``)."""
    work = Path(args.work)
    saved = work / f"{name}-logits.npy"
    # CUDA graphs where the package shares its KV buffers (GroupQueryAttention: fp16, bf16);
    # an fp32 CUDA package grows its cache by Concat and runs without.
    search = json.loads((package / "genai_config.json").read_text()).get("search", {})
    capture = "on" if args.ep != "cpu" and search.get("past_present_share_buffer") else "off"
    cmd = [sys.executable, "-c", PARITY_RUN, str(package), args.ep, capture]
    cmd += [json.dumps(ref["prompt"]), json.dumps(ref["tokens"]), str(saved)]
    stage = child(cmd, min(timeout, report.remaining() - 20), dict(os.environ), stdout=True)
    stage["graph_capture"] = capture
    stage.update(stdout_json(stage) or {})
    if saved.exists():
        stage["vs_transformers"] = compare(np.load(saved), np.load(work / "reference.npy"))
        saved.unlink()
    report.stage(f"parity_{name}", stage)


def prefill(args: argparse.Namespace, report: Report, name: str, package: Path) -> None:
    """Prefill of a ``--long-prompt`` prompt through genai, with the EP's capture on."""
    cmd = [sys.executable, str(STAGES), "genai", str(package), "--ep", args.ep]
    cmd += ["--prompt-len", str(args.long_prompt), "--new-tokens", "4"]
    cmd += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    cmd += ["--lengths", "default", "--captures", "off" if args.ep == "cpu" else "on"]
    report.stage(f"prefill_{name}", Child(cmd).json(min(180, report.remaining() - 20)))


def table(stages: dict[str, Any]) -> dict[str, Any]:
    """webgpu_side_by_side's summary plus TTFT, prefill, GPU memory and parity."""
    out = summarize(stages)
    out["genai_ttft_ms"], out["genai_gpu_memory_mib"] = {}, {}
    out["prefill_long_prompt_tok_s"], out["vs_transformers"] = {}, {}
    for key, value in stages.items():
        result = (value or {}).get("result") or {}
        if key.startswith("genai_"):
            name = key[len("genai_") :]
            if result.get("gpu_memory_mib"):
                out["genai_gpu_memory_mib"][name] = result["gpu_memory_mib"]
            for capture, entry in (result.get("captures") or {}).items():
                for row in entry.values():
                    if isinstance(row, dict) and "ttft_ms" in row:
                        label = f"capture_{capture}@{row['max_length']}"
                        out["genai_ttft_ms"].setdefault(name, {})[label] = row["ttft_ms"]
        if key.startswith("prefill_"):
            rows = [
                row
                for entry in (result.get("captures") or {}).values()
                for row in entry.values()
                if isinstance(row, dict)
            ]
            cell = next((r.get("prefill_tokens_per_second", r.get("error")) for r in rows), None)
            out["prefill_long_prompt_tok_s"][key[len("prefill_") :]] = (
                cell or value.get("stderr_tail", "")[-300:]
            )
        if key.startswith("parity_"):
            vs = value.get("vs_transformers") or {}
            out["vs_transformers"][key[len("parity_") :]] = {
                "max_abs_diff": vs.get("max_abs_diff"),
                "min_cosine": vs.get("min_cosine"),
                "top1_agreement": vs.get("top1_agreement"),
                "free_tokens_equal": value.get("free_tokens_equal"),
                "provider": value.get("provider"),
                "graph_capture": value.get("graph_capture"),
            }
    return out


ROOMY_GIB = 60
"""Scratch space the default packages need at once: E2B's bf16 checkpoint (10 GB), the fp32
package alone (19 GB), then the five others and mobius's (~40 GB). Call H's H100 had 18 GiB
free under /tmp and every export failed on a full disk."""


def scratch() -> Path:
    """/tmp, or the RAM-backed /dev/shm where only it has room for the packages."""
    free = {
        root: shutil.disk_usage(root).free / 2**30
        for root in (Path("/tmp"), Path("/dev/shm"))
        if root.is_dir()
    }
    roomy = free.get(Path("/tmp"), 0) < ROOMY_GIB < free.get(Path("/dev/shm"), 0)
    return (Path("/dev/shm") if roomy else Path("/tmp")) / "cuda-side-by-side"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy size on the CPU EP")
    parser.add_argument("--cuda-site", default="/tmp/site_cuda")
    parser.add_argument("--budget-s", type=float, default=560)
    parser.add_argument(
        "--work",
        default=None,
        help="scratch folder (default: cuda-side-by-side under /tmp, or under /dev/shm where "
        f"/tmp has less than {ROOMY_GIB} GiB free and /dev/shm more)",
    )
    parser.add_argument("--peer-wheels", default=str(REPO / ".whl" / "mobius"))
    parser.add_argument("--preset", default="gemma4-e2b", choices=("gemma4-e2b", "gemma4-e4b"))
    parser.add_argument("--packages", default=None, help=f"default {DEFAULT_PACKAGES}")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--long-prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--short-length", type=int, default=1032)
    parser.add_argument("--parity-prompt", type=int, default=16)
    parser.add_argument("--parity-steps", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export-timeout-s", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep checkpoint and packages")
    args = parser.parse_args()
    args.ep, device = ("cpu", "cpu") if args.tiny else ("cuda", "cuda")
    if args.tiny:
        args.preset = "gemma4-tiny"
    args.packages = set(
        (args.packages or (TINY_PACKAGES if args.tiny else DEFAULT_PACKAGES)).split(",")
    )
    known = {"ours_fp32", *(f"ours_{v}" for v in OURS), "mobius_fp16"}
    if args.packages - known:
        parser.error(f"unknown --packages {sorted(args.packages - known)}; known: {sorted(known)}")
    if not args.tiny:  # every child imports onnxruntime-gpu / genai-cuda from the site
        os.environ.update(cuda_env(args.cuda_site))
    args.work = args.work or str(scratch())
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = Path(os.environ.get("OUT") or work)
    report = Report(out / "cuda_side_by_side.json", args.budget_s, "cuda_side_by_side")
    report.data["settings"] = {
        k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()
    }
    env = environment(args)
    env["runtime"] = child([sys.executable, "-c", RUNTIME], 120, dict(os.environ), stdout=True)
    report.stage("environment", env)
    peer = peer_env(args, report) if "mobius_fp16" in args.packages else None

    checkpoint = make_checkpoint(args, report, peer)
    if checkpoint is None:
        return
    # transformers in a child of its own: a timeout, and no torch CUDA context left in this
    # process while the packages are measured
    cmd = [sys.executable, "-c", REFERENCE, str(checkpoint), str(work / "reference.npy")]
    cmd += [str(args.seed), str(args.parity_prompt), str(args.parity_steps), device]
    cmd += [str(Path(__file__).resolve().parent)]
    made = child(cmd, min(240, report.remaining() - 60), dict(os.environ), stdout=True)
    printed = stdout_json(made)
    ref: dict[str, Any] | None = printed if made.get("rc") == 0 else None
    report.stage("transformers", {**made, **(ref or {})})
    # fp32 first (its ~20 GB package cannot share the disk with the others), inside a cap
    # that leaves the speed exports their time
    if "ours_fp32" in args.packages and ref is not None and report.remaining() > 420:
        capped = argparse.Namespace(**{**vars(args), "export_timeout_s": 150})
        fp32 = exports(
            capped, report, checkpoint, None, {"fp32": ["--dtype", "fp32", *TEXT]}, False
        )
        for name, built_fp32 in fp32.items():
            parity(args, report, name, built_fp32, ref, timeout=120)
            shutil.rmtree(built_fp32, ignore_errors=True)  # even with --keep: the disk
    speed = {v: [*flags, *TEXT] for v, flags in OURS.items() if f"ours_{v}" in args.packages}
    if args.tiny:  # the toy model is 64 wide: its tied head takes no 128-wide blocks
        speed = {v: [*flags, *TINY_FLAGS.get(v, [])] for v, flags in speed.items()}
    packages = exports(args, report, checkpoint, peer, speed)
    remove(checkpoint, args)

    # Most wanted first; each package deleted after its last stage.
    plan = [
        ("genai", n)
        for n in ("ours_int4", "ours_int4_sym128", "ours_fp16", "mobius_fp16", "ours_bf16")
    ]
    plan += [("genai", "ours_int8")]
    plan += [("parity", "ours_fp16")]
    plan += [("prefill", n) for n in ("ours_int4", "ours_fp16", "mobius_fp16", "ours_bf16")]
    plan += [("prefill", n) for n in ("ours_int8", "ours_int4_sym128")]
    plan += [("runner", "ours_int4"), ("runner", "ours_fp16")]
    actions: dict[str, Action] = {
        "genai": genai_bench,
        "prefill": prefill,
        "runner": ours_bench,
        "parity": lambda a, r, n, p: parity(a, r, n, p, ref) if ref is not None else None,
    }
    run_plan(args, report, packages, plan, actions, table)


if __name__ == "__main__":
    main()
