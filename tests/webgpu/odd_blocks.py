"""Padded MatMulNBits and partial-block GatherBlockQuantized one-op models on the WebGPU EP,
against numpy. Runs in the WebGPU environment; prints one JSON object.

    .venv-webgpu/bin/python tests/webgpu/odd_blocks.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's engine

from engine.quantize import QuantizedBlocks, dequantize, quantize
from engine.quantize.reference import (
    gather_block_quantized_model,
    matmul_nbits_model,
)

MATMUL = [(8, 32, 4), (56, 32, 4), (33, 16, 4), (40, 16, 8), (8, 32, 8)]
"""(K, block size, bits): K padded to whole blocks."""
GATHER = [(56, 32, 4), (34, 32, 4), (40, 16, 8), (8, 32, 8), (100, 64, 4)]
"""(D, block size, bits): a partial last block; 4-bit ones with an even block count."""


def main() -> None:
    import webgpu_ort

    def run(model, feeds):
        return webgpu_ort.session(model.SerializeToString()).run(None, feeds)[0]

    rng = np.random.default_rng(0)
    report: dict[str, object] = {"providers": webgpu_ort.available_providers()}
    for k, bs, bits in MATMUL:
        w = (rng.standard_normal((24, k)) * 0.1).astype(np.float32)
        blocks = quantize(w, bits=bits, block_size=bs)
        x = rng.standard_normal((3, k)).astype(np.float32)
        model = matmul_nbits_model(blocks, k=k, n=24, bits=bits, block_size=bs, batch=3)
        want = x @ dequantize(blocks, bits=bits, block_size=bs, cols=k).T
        report[f"matmulnbits k={k} bs={bs} bits={bits}"] = float(
            np.abs(run(model, {"x": x}) - want).max()
        )
    for d, bs, bits in GATHER:
        table = rng.standard_normal((20, d)).astype(np.float32)
        full = quantize(table, bits=bits, block_size=bs)
        blocks = QuantizedBlocks(full.gather_data(d, bits), full.scales, full.zero_points)
        ids = np.array([0, 3, 19, 7], np.int64)
        model = gather_block_quantized_model(blocks, bits=bits, block_size=bs, num_ids=4)
        want = dequantize(blocks, bits=bits, block_size=bs)[ids]
        report[f"gatherblockquantized d={d} bs={bs} bits={bits}"] = float(
            np.abs(run(model, {"ids": ids}) - want).max()
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
