"""How fast the planner is on the full-size presets (the app recomputes it live).

    python benchmarks/plan_speed.py

Prints one JSON object: median and max milliseconds per plan, per preset and option set.
"""

from __future__ import annotations

import json
import statistics
import time

from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset

CASES = {
    "webgpu-fp16": ExportOptions(ep="webgpu"),
    "webgpu-int4-int4": ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4),
    "cpu-fp32": ExportOptions(ep="cpu"),
}


def main(repeats: int = 50) -> None:
    results = {}
    for preset in ("gemma4-e2b", "gemma4-e4b"):
        spec = load_preset(preset)
        for name, options in CASES.items():
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                result = plan(spec, options)
                times.append((time.perf_counter() - began) * 1000)
            results[f"{preset}/{name}"] = {
                "median_ms": round(statistics.median(times), 2),
                "max_ms": round(max(times), 2),
                "initializers": sum(1 for _ in result.decoder.tensors()),
                "total_bytes": result.nbytes,
            }
    print(
        json.dumps(
            {"benchmark": "plan_speed", "repeats": repeats, "goal_ms": 50, "results": results},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
