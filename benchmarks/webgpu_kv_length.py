"""Decode cost against the KV buffer's length under WebGPU graph capture (issue 12, 3b).

The same prompt and tokens are decoded with capture at two ``max_length`` values (the
shared KV buffers' length), interleaved so drift hits both alike; prints decode tok/s per
length and their ratio. Runs in the WebGPU environment:

    .venv-webgpu/bin/python benchmarks/webgpu_kv_length.py --build /tmp/kv
    .venv-webgpu/bin/python benchmarks/webgpu_kv_length.py --package PKG [--package PKG2]

``--build`` exports Gemma 4 E2B's text decoder at toy width with random weights (fp16 with
INT4 weights and embeddings by default, as the H200 measurement of issue 12): its 35
layers, layer types, KV sharing, heads, head sizes (256 / 512) and 512-token sliding
window, hidden 256. Attention weighs more there than in E2B, so the buffer's share of the
decode cost is overstated rather than hidden. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

TOY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 8192,
    "vocab_size_per_layer_input": 8192,
    "hidden_size_per_layer_input": 64,
    "max_position_embeddings": 8192,
}
"""What the toy changes in E2B's text config (everything else is E2B's)."""


def build(out: Path, dtype: str, int4: bool) -> Path:
    """The toy-width E2B text package (WebGPU, random weights)."""
    from engine.options import ExportOptions
    from engine.pipeline import export
    from engine.presets import preset_config

    config = dict(preset_config("gemma4-e2b")["text_config"])
    config.update(TOY)
    config["architectures"] = ["Gemma4ForCausalLM"]
    source = out / "config"
    source.mkdir(parents=True, exist_ok=True)
    (source / "config.json").write_text(json.dumps(config))
    bits = 4 if int4 else None
    options = ExportOptions(
        ep="webgpu",
        dtype=dtype,
        weight_bits=bits,
        embedding_bits=bits,
        random_weights=True,
        max_length=4096,
    )
    return export(out / "package", model_dir=source, options=options, overwrite=True).output


def _commit() -> str:
    import engine

    root = Path(engine.__file__).resolve().parents[1]
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def measure(
    package: Path, lengths: list[int], prompt_length: int, new_tokens: int, repeats: int
) -> dict[str, Any]:
    from engine.runtime.bench import bench_prompt
    from engine.runtime.runner import Runner, RunnerOptions

    runners = {n: Runner(package, RunnerOptions(graph_capture=True, max_length=n)) for n in lengths}
    prompt = bench_prompt(runners[lengths[0]].package.vocab_size, prompt_length)
    speeds: dict[int, list[float]] = {n: [] for n in lengths}
    tokens: dict[int, list[int]] = {}
    for n, runner in runners.items():  # warm-up: capture records here
        tokens[n] = list(runner.generate(prompt, new_tokens).tokens)
    for _ in range(repeats):
        for n, runner in runners.items():
            speeds[n].append(runner.generate(prompt, new_tokens).decode_tokens_per_second)
    provider = {n: r.provider for n, r in runners.items()}
    median = {n: statistics.median(v) for n, v in speeds.items()}
    return {
        "provider": provider,
        "same_tokens": len({tuple(t) for t in tokens.values()}) == 1,
        "decode_tokens_per_second": {
            str(n): {"median": round(median[n], 2), "runs": [round(v, 2) for v in speeds[n]]}
            for n in lengths
        },
        "ratio_longest_over_shortest": round(median[lengths[-1]] / median[lengths[0]], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, help="export the toy E2B package here first")
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    parser.add_argument(
        "--float-weights", action="store_true", help="no INT4 weights and embeddings"
    )
    parser.add_argument("--package", type=Path, action="append", default=[])
    parser.add_argument("--lengths", default="192,4096")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    packages = list(args.package)
    if args.build is not None:
        packages.insert(0, build(args.build, args.dtype, not args.float_weights))
    lengths = [int(n) for n in args.lengths.split(",")]
    results = {
        str(p): measure(p, lengths, args.prompt_len, args.new_tokens, args.repeats)
        for p in packages
    }
    report = {
        "benchmark": "webgpu_kv_length",
        "commit": _commit(),
        "toy": TOY if args.build is not None else None,
        "dtype": args.dtype if args.build is not None else None,
        "int4_weights_and_embeddings": not args.float_weights if args.build is not None else None,
        "prompt_length": args.prompt_len,
        "new_tokens": args.new_tokens,
        "graph_capture": True,
        "results": results,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
