"""A benchmark in this process against the same benchmark in a process of its own.

The CLI's ``bench`` and the studio's Benchmark tab run each setting in a spawned child
(``run_bench(..., isolated=True)``, :mod:`engine.child`) so that Ctrl-C and Cancel are
answered at once. This measures what that costs: the same package, runtime and setting,
in this process and isolated, alternating for ``--rounds``; decode tok/s (median of the
timed runs), load time, time to first token and the wall time of each call (the child's
start included).

Prints one JSON object. Run from the repository root:

    python benchmarks/bench_isolation.py PACKAGE [--runtime genai|ort] [--graph-capture on|off]
        [--prompt-len 128] [--new-tokens 64] [--repeats 3] [--rounds 2]

The H100 results (WebGPU and CUDA, E2B INT4) are in
``benchmarks/results/child_process_bench-2026-12-07-h100-webgpu-cuda-e2b-e4b.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.runtime.bench import BenchConfig, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--runtime", choices=("genai", "ort"), default="genai")
    parser.add_argument("--graph-capture", choices=("on", "off"), default="on")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = BenchConfig(
        runtime=args.runtime,
        prompt_length=args.prompt_len,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        warmup=1,
    )
    rows = []
    for round_ in range(args.rounds):
        for isolated in (False, True):
            began = time.perf_counter()
            result, _ = run_bench(
                args.package, config, graph_capture=args.graph_capture == "on", isolated=isolated
            )
            rows.append(
                dict(
                    round=round_,
                    isolated=isolated,
                    decode_tokens_per_second=round(result.decode_tokens_per_second, 1),
                    runs=[round(x, 1) for x in result.decode_tokens_per_second_runs],
                    load_seconds=round(result.load_seconds, 2),
                    time_to_first_token_ms=round(result.time_to_first_token_seconds * 1e3, 1),
                    wall_seconds=round(time.perf_counter() - began, 2),
                    tokens_equal_first_row=None,
                    tokens=list(result.tokens),
                    adapter=result.adapter,
                )
            )
    first = rows[0]["tokens"]
    for row in rows:
        row["tokens_equal_first_row"] = row.pop("tokens") == first

    def median(isolated: bool, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["isolated"] == isolated)

    print(
        json.dumps(
            {
                "benchmark": "bench_isolation",
                "package": args.package,
                "settings": vars(args),
                "rows": rows,
                "summary": {
                    side: {
                        "decode_tokens_per_second": median(isolated, "decode_tokens_per_second"),
                        "wall_seconds": median(isolated, "wall_seconds"),
                    }
                    for side, isolated in (("in_process", False), ("isolated", True))
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":  # the isolated runs spawn a process that imports this module
    main()
