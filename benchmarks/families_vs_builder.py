"""This engine against onnxruntime-genai's model builder on the same tiny checkpoints of
the non-Gemma families (tests/_support/tiny_llama.py: Llama, Mistral, Qwen2, Qwen3).

For each checkpoint and precision, both exporters run as their own process (the builder
as ``python -m onnxruntime_genai.models.builder``, this engine as ``python -m engine
build``), timed, with their peak RSS; then both packages are loaded by onnxruntime-genai
and generate greedily from the same prompt, and the tokens are compared with
transformers' own greedy run. Node counts (by op type) come from the ONNX files. Nothing
is downloaded: the checkpoints are made here.

Prints one JSON object. Run from the repository root:

    python benchmarks/families_vs_builder.py [--names llama,qwen3] [--steps 24]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]

MEASURED = (
    "import resource, runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "else:\n"
    "    code = 0\n"
    "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)\n"
    "sys.exit(code)\n"
)
"""``python -c MEASURED MODULE ARGS...``: runs a module as ``__main__`` and prints its own
peak RSS (``PEAK_RSS_KIB``) last, whatever happens."""

PRECISIONS: dict[str, dict[str, list[str]]] = {
    "fp32": {
        "ours": ["--dtype", "fp32"],
        "builder": ["-p", "fp32"],
    },
    "int4": {
        "ours": ["--dtype", "fp32", "--weight-bits", "4", "--block-size", "32"],
        "builder": ["-p", "int4", "--extra_options", "int4_block_size=32"],
    },
}


def _run(module: str, args: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", MEASURED, module, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    seconds = time.perf_counter() - started
    result: dict[str, Any] = {
        "exit_code": proc.returncode,
        "seconds": round(seconds, 2),
        "peak_rss_mib": peak_rss_mib(proc.stdout),
    }
    if proc.returncode:
        result["error_tail"] = (proc.stderr or proc.stdout)[-800:]
    return result


def peak_rss_mib(stdout: str) -> float | None:
    """The peak RSS a :data:`MEASURED` child printed, in MiB (None: it printed none)."""
    peak = [line for line in stdout.splitlines() if line.startswith("PEAK_RSS_KIB")]
    return round(int(peak[-1].split()[1]) / 1024, 1) if peak else None


def node_counts(package: Path) -> dict[str, Any]:
    """The package's ONNX nodes: ``total`` and ``by_op``."""
    import onnx

    counts: collections.Counter[str] = collections.Counter()
    for path in package.glob("*.onnx"):
        model = onnx.load(str(path), load_external_data=False)
        counts.update(node.op_type for node in model.graph.node)
    return {"total": sum(counts.values()), "by_op": dict(sorted(counts.items()))}


def _agreement(tokens: list[int], reference: list[int]) -> dict[str, Any]:
    first = next(
        (i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), None
    )
    return {"equal": tokens == reference, "first_difference_at_step": first}


def main() -> None:
    from tests._support.genai_loop import genai_greedy
    from tests._support.tiny_gemma import hf_greedy
    from tests._support.tiny_llama import CONFIGS, make_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(CONFIGS), help="tiny_llama config names")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    report: dict[str, Any] = {"prompt_tokens": len(PROMPT), "steps": args.steps, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in args.names.split(","):
            model_dir = root / name
            model = make_checkpoint(model_dir, name)
            reference, _ = hf_greedy(model, PROMPT, args.steps)
            for precision in args.precisions.split(","):
                flags = PRECISIONS[precision]
                case: dict[str, Any] = {}
                ours, theirs = (
                    root / f"{name}-{precision}-ours",
                    root / f"{name}-{precision}-builder",
                )
                case["ours"] = _run(
                    "engine",
                    ["build", "--model", str(model_dir), "--quiet", *flags["ours"], str(ours)],
                )
                case["builder"] = _run(
                    "onnxruntime_genai.models.builder",
                    ["-i", str(model_dir), "-o", str(theirs), "-e", "cpu",
                     "-c", str(root / "cache"), *flags["builder"]],
                )  # fmt: skip
                for side, package in (("ours", ours), ("builder", theirs)):
                    if case[side]["exit_code"]:
                        continue
                    try:
                        tokens = genai_greedy(package, PROMPT, args.steps)
                    except Exception as exc:  # the builder's package may fail in genai
                        case[side]["genai_error"] = str(exc)[:400]
                    else:
                        case[side]["vs_transformers"] = _agreement(tokens, reference)
                    case[side]["nodes"] = node_counts(package)
                    case[side]["package_bytes"] = sum(
                        f.stat().st_size for f in package.iterdir() if f.is_file()
                    )
                report["cases"][f"{name}/{precision}"] = case
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
