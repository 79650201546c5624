"""Export the full-size Gemma 4 E2B architecture (random weights) and report where time
and memory go. Prints one JSON object.

    python benchmarks/export_e2b.py [--ep cpu] [--dtype fp16] [--weight-bits 4] [--embedding-bits 4]

Peak RSS is compared with the largest single planned tensor: streaming means the
export never holds much more than that tensor plus the writer's in-flight budget.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from engine.presets import load_preset
from engine.weights import sources


class TimedRandomSource(sources.RandomSource):
    """RandomSource that adds up the seconds spent producing source data."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.seconds = 0.0
        self.bytes = 0
        self._lock = threading.Lock()

    def read(self, weight: LogicalWeight, axis: int, start: int, stop: int) -> np.ndarray:
        began = time.perf_counter()
        out = super().read(weight, axis, start, stop)
        with self._lock:
            self.seconds += time.perf_counter() - began
            self.bytes += out.nbytes
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--ep", default="cpu")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--weight-bits", type=int, default=None)
    parser.add_argument("--embedding-bits", type=int, default=None)
    parser.add_argument("--out", default=None, help="folder to write into (default: a temp dir)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    options = ExportOptions(
        ep=args.ep,
        dtype=args.dtype,
        weight_bits=args.weight_bits,
        embedding_bits=args.embedding_bits,
        random_weights=True,
    )
    spec = load_preset(args.preset)
    export_plan = plan(spec, options)
    largest = max(t.nbytes for t in export_plan.decoder.tensors())

    timed = TimedRandomSource()
    original = sources.RandomSource
    sources.RandomSource = lambda seed=0: timed  # type: ignore[assignment,misc]
    import engine.pipeline as pipeline_module

    pipeline_module.RandomSource = sources.RandomSource  # type: ignore[attr-defined]
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-e2b-"))
    out = root / "pkg"
    stages: dict[str, float] = {}
    last = [time.perf_counter(), "start"]

    def progress(fraction: float, message: str) -> None:
        stage = message.split(" ")[0] if message.startswith("writing ") else message
        now = time.perf_counter()
        stages[str(last[1])] = stages.get(str(last[1]), 0.0) + now - float(last[0])
        last[0], last[1] = now, stage

    began = time.perf_counter()
    try:
        result = export(out, preset=args.preset, options=options, overwrite=True, progress=progress)
    finally:
        sources.RandomSource = original  # type: ignore[misc]
    wall = time.perf_counter() - began
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    total = result.total_bytes
    report = {
        "benchmark": "export_e2b",
        "preset": args.preset,
        "ep": args.ep,
        "dtype": args.dtype,
        "weight_bits": args.weight_bits,
        "embedding_bits": args.embedding_bits,
        "cpu_count": os.cpu_count(),
        "wall_seconds": round(wall, 2),
        "package_bytes": total,
        "plan_bytes": export_plan.nbytes,
        "write_throughput_mb_s": round(total / wall / 1e6, 1),
        "peak_rss_bytes": peak_rss,
        "largest_tensor_bytes": largest,
        "peak_rss_over_largest_gib": round((peak_rss - largest) / 1024**3, 2),
        "source_generation_seconds_summed": round(timed.seconds, 2),
        "source_bytes": timed.bytes,
        "stage_seconds": {k: round(v, 2) for k, v in stages.items()},
        "files": result.files,
    }
    print(json.dumps(report, indent=2))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
