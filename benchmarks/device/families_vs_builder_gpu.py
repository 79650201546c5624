"""Ours against onnxruntime-genai's model builder on the lent H200, full size: the same
random checkpoint of Llama-3.2-1B and Qwen3-1.7B exported by both, INT4, for the CUDA EP
(CUDA graphs) and WebGPU through Vulkan (graph capture), decode tok/s in one run.

For each preset a bf16 checkpoint is written here (``benchmarks/random_checkpoint.py``:
config.json, sharded safetensors and a small tokenizer for the builder, which saves one),
then for each EP both exporters run as their own process, timed, with their peak RSS:

* ours: ``python -m engine build --model CKPT --ep EP --weight-bits 4 --embedding-bits 4``
  (block 32, what the studio's INT4 choice writes);
* the builder: ``python -m onnxruntime_genai.models.builder -i CKPT -p int4 -e EP`` with its
  graph option for that EP (``enable_cuda_graph`` / ``enable_webgpu_graph``), as a user
  who wants capture would ask for it.

Each package is benchmarked through onnxruntime-genai (``python -m engine bench --runtime
genai --graph-capture both``: capture off and on, the same greedy tokens checked), its
bytes and node count recorded; a package is deleted after its last stage (64 GiB disk).
The checkpoints stay in ``--work`` so a second call (the other EP) while the machine is
warm reuses them. The JSON report (``$OUT/families_vs_builder_gpu.json``) is rewritten
after every stage.

    python3 benchmarks/device/families_vs_builder_gpu.py --eps cuda --cuda-site /tmp/site_cuda
    python3 benchmarks/device/families_vs_builder_gpu.py --eps webgpu --webgpu-site /tmp/site
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from families_vs_builder import MEASURED, node_counts, peak_rss_mib  # noqa: E402 (just added)

_TOKENIZER = (
    "import json, sys; from pathlib import Path; "
    "from tests._support.tiny_gemma import make_tokenizer; "
    "make_tokenizer(Path(sys.argv[1]), json.loads(Path(sys.argv[1], 'config.json').read_text())"
    "['vocab_size'])"
)
GRAPH_OPTION = {
    "cuda": "enable_cuda_graph=1",
    "webgpu": "enable_webgpu_graph=1",
    "cpu": "shared_embeddings=true",
}


def _measured(module: str, args: list[str], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    result = _run([sys.executable, "-c", MEASURED, module, *args], timeout, env)
    result["peak_rss_mib"] = peak_rss_mib(result.get("stdout", ""))
    result["stdout"] = result.get("stdout", "")[-1500:]
    return result


def _package_facts(package: Path) -> dict[str, Any]:
    nodes = node_counts(package)
    return {
        "bytes": sum(f.stat().st_size for f in package.rglob("*") if f.is_file()),
        "nodes": nodes["total"],
        "by_op": nodes["by_op"],
    }


def _bench_summary(bench: dict[str, Any]) -> dict[str, Any]:
    """The decode and prefill rates from ``engine bench --json`` output, when it ran."""
    try:
        data = json.loads(bench.get("stdout", ""))
    except ValueError:
        return {}
    return {"result": data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--presets", default="llama3.2-1b,qwen3-1.7b")
    parser.add_argument("--eps", default="cuda")
    parser.add_argument("--cuda-site", default="/tmp/site_cuda")
    parser.add_argument("--webgpu-site", default="/tmp/site")
    parser.add_argument("--work", default="/tmp/fvb")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--sides", default="ours,builder")
    parser.add_argument("--ours-flags", default="", help="more `engine build` flags, e.g. "
                        "'--block-size 128'")  # fmt: skip
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    title = "families_vs_builder_gpu"
    report = Report(out_dir / f"{title}.json", args.budget_s, title)
    sites = {"cuda": args.cuda_site, "webgpu": args.webgpu_site, "cpu": ""}  # cpu: a dry run
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bench_flags = ["--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    bench_flags += ["--repeats", "3", "--json", "--quiet"]
    for preset in args.presets.split(","):
        checkpoint = work / f"ckpt-{preset}"
        if not (checkpoint / "tokenizer.json").is_file():
            env = cuda_env(sites[args.eps.split(",")[0]])
            made = _run(
                [sys.executable, "benchmarks/random_checkpoint.py", "--preset", preset,
                 str(checkpoint)], min(240, report.remaining() - 60), env,
            )  # fmt: skip
            made["tokenizer"] = _run([sys.executable, "-c", _TOKENIZER, str(checkpoint)], 60, env)
            report.stage(f"{preset}/checkpoint", made)
        for ep in args.eps.split(","):
            env = cuda_env(sites[ep])
            for side in args.sides.split(","):
                name = f"{preset}/{ep}/{side}"
                package = work / f"{preset}-{ep}-{side}"
                shutil.rmtree(package, ignore_errors=True)
                stage: dict[str, Any] = {}
                timeout = min(300, report.remaining() - 40)
                if side == "ours":
                    build = ["build", "--model", str(checkpoint), "--ep", ep, "--weight-bits", "4"]
                    build += ["--embedding-bits", "4", *args.ours_flags.split(), "--quiet"]
                    build += ["--overwrite", str(package)]
                    stage["build"] = _measured("engine", build, timeout, env)
                else:
                    build = ["-i", str(checkpoint), "-o", str(package), "-p", "int4", "-e", ep]
                    build += ["-c", str(work / "cache"), "--extra_options", GRAPH_OPTION[ep]]
                    stage["build"] = _measured(
                        "onnxruntime_genai.models.builder", build, timeout, env
                    )
                report.stage(name, stage)
                if stage["build"].get("rc") == 0:
                    stage["package"] = _package_facts(package)
                    bench = [sys.executable, "-m", "engine", "bench", str(package), "--ep", ep]
                    bench += ["--runtime", "genai", "--graph-capture", "both", *bench_flags]
                    stage["bench_genai"] = _run(bench, min(240, report.remaining() - 20), env)
                    stage["bench_genai"].update(_bench_summary(stage["bench_genai"]))
                    report.stage(name, stage)
                shutil.rmtree(package, ignore_errors=True)
                shutil.rmtree(work / "cache", ignore_errors=True)


if __name__ == "__main__":
    main()
