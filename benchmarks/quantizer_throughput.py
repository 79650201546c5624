"""Block quantizer throughput and quality against ONNX Runtime's MatMulNBitsQuantizer.

For a [4096, 4096] float32 linear weight and a [262144, 256] float16 embedding table (one
Gemma 4 per-layer table), at 4 and 8 bits: our round-to-nearest seconds from float array to
packed arrays, the seconds ONNX Runtime's quantizer takes on the same weight as a MatMul B
(``[K, N]``: the weight transposed, prepared outside the timing; its time includes building
and processing the one-MatMul model), the speedup, whether the bytes are identical, and the
mean squared reconstruction error of round-to-nearest and of the range search.

Times are the best of ``--repeats`` interleaved runs (the ratio of medians is given too, as
the machine may be shared). Prints one JSON object. Run from the repository root:

    python benchmarks/quantizer_throughput.py [--repeats 3] [--block-size 32] [--small]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.quantize import QuantizedBlocks, dequantize, quantize
from engine.quantize import layout as _layout
from engine.quantize.reference import ort_quantize


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _same_bytes(a: QuantizedBlocks, b: QuantizedBlocks) -> bool:
    return all(
        x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in [
            (a.qweight, b.qweight),
            (a.scales, b.scales),
            (a.zero_points, b.zero_points),
        ]
    )


def _mse(blocks: QuantizedBlocks, weight: np.ndarray, bits: int, block_size: int) -> float:
    total = 0.0
    for start in range(0, weight.shape[0], 16384):  # bounded memory for the big table
        stop = start + 16384
        part = QuantizedBlocks(
            blocks.qweight[start:stop], blocks.scales[start:stop], blocks.zero_points[start:stop]
        )
        diff = dequantize(part, bits=bits, block_size=block_size) - weight[start:stop]
        total += float(np.einsum("ij,ij->", diff, diff, dtype=np.float64))
    return total / weight.size


def _case(
    label: str, weight: np.ndarray, bits: int, block_size: int, repeats: int, search: bool
) -> dict[str, Any]:
    dtype = weight.dtype
    ours_times, ort_times = [], []
    for _ in range(repeats):  # interleaved, so that load changes hit both alike
        t, ours = _timed(
            lambda: quantize(weight, bits=bits, block_size=block_size, scale_dtype=dtype)
        )
        ours_times.append(t)
        t, ref = _timed(
            lambda: ort_quantize(weight, bits=bits, block_size=block_size, symmetric=False)
        )
        ort_times.append(t)
    ours_s, ort_s = min(ours_times), min(ort_times)
    row: dict[str, Any] = {
        "tensor": label,
        "shape": list(weight.shape),
        "dtype": str(dtype),
        "bits": bits,
        "rtn_s": round(ours_s, 4),
        "matmulnbits_quantizer_s": round(ort_s, 4),
        "speedup": round(ort_s / ours_s, 2),
        "speedup_of_medians": round(
            statistics.median(ort_times) / statistics.median(ours_times), 2
        ),
        "identical_bytes": _same_bytes(ours, ref),
        "mse_rtn": _mse(ours, weight, bits, block_size),
    }
    if search:
        search_s, better = _timed(
            lambda: quantize(
                weight, bits=bits, block_size=block_size, scale_dtype=dtype, method="search"
            )
        )
        row["search_s"] = round(search_s, 3)
        row["mse_search"] = _mse(better, weight, bits, block_size)
        row["mse_search_over_rtn"] = round(row["mse_search"] / row["mse_rtn"], 4)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timing runs; the best counts")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="our worker threads")
    parser.add_argument("--no-search", action="store_true", help="skip the search MSE")
    parser.add_argument("--small", action="store_true", help="1/16 of the rows (smoke run)")
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)  # the ORT quantizer logs every node
    _layout.MAX_THREADS = args.threads

    import onnxruntime

    warm = np.ones((8, 64), np.float32)  # first calls pay for imports and thread start-up
    quantize(warm, bits=4, block_size=32)
    ort_quantize(warm, bits=4, block_size=32, symmetric=False)

    rng = np.random.default_rng(0)
    div = 16 if args.small else 1
    tensors = [
        ("linear", rng.standard_normal((4096 // div, 4096), dtype=np.float32) * 0.02),
        ("ple_table", (rng.standard_normal((262144 // div, 256)) * 0.05).astype(np.float16)),
    ]
    rows = [
        _case(label, w, bits, args.block_size, args.repeats, not args.no_search)
        for label, w in tensors
        for bits in (4, 8)
    ]
    speedups = [r["speedup"] for r in rows]
    report = {
        "benchmark": "quantizer_throughput",
        "block_size": args.block_size,
        "symmetric": False,
        "repeats": args.repeats,
        "threads": _layout.threads(),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "numpy": np.__version__,
        "onnxruntime": onnxruntime.__version__,
        "results": rows,
        "min_speedup": min(speedups),
        "goal_10x_met": min(speedups) >= 10,
        "all_identical_bytes": all(r["identical_bytes"] for r in rows),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
