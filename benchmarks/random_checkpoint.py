"""Write a random full-size checkpoint of a preset (config.json + sharded bf16 safetensors
+ index) without torch, streaming: memory stays at one chunk whatever the model's size.
Prints one JSON object.

    python benchmarks/random_checkpoint.py --preset gemma4-e2b OUT_DIR [--tokenizer 4096]

``--tokenizer N`` adds a byte-level BPE tokenizer of N ids trained on the built-in
calibration text (what GPTQ / AWQ exports of the checkpoint tokenize with).

Values come from the engine's seeded ``RandomSource`` (what ``--random-weights`` exports),
so an export of this checkpoint exercises the checkpoint reader on the same sizes as the
architecture-only benchmarks (``export_e2b.py --model OUT_DIR``).
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset, preset_config
from engine.weights.sources import RandomSource

CHUNK_ELEMENTS = 16 * 1024 * 1024
MAX_SHARD_BYTES = 4 * 1024**3


def checkpoint_weights(preset: str) -> list[LogicalWeight]:
    """Every weight the text export reads, once, by checkpoint key."""
    export_plan = plan(load_preset(preset), ExportOptions(ep="cpu", random_weights=True))
    seen: dict[str, LogicalWeight] = {}
    for session in export_plan.sessions:
        for wp in session.weights:
            if wp.weight.source is not None and not wp.shares:
                seen.setdefault(wp.weight.source, wp.weight)
    return list(seen.values())


def shards(weights: list[LogicalWeight]) -> list[list[LogicalWeight]]:
    out: list[list[LogicalWeight]] = [[]]
    size = 0
    for w in weights:
        nbytes = math.prod(w.shape) * 2
        if out[-1] and size + nbytes > MAX_SHARD_BYTES:
            out.append([])
            size = 0
        out[-1].append(w)
        size += nbytes
    return out


def write_shard(path: Path, weights: list[LogicalWeight], source: RandomSource) -> int:
    header: dict[str, object] = {}
    offset = 0
    for w in weights:
        nbytes = math.prod(w.shape) * 2
        header[str(w.source)] = {
            "dtype": "BF16",
            "shape": list(w.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for w in weights:
            if not w.shape:
                f.write(source.read(w, 0, 0, 1).astype(ml_dtypes.bfloat16).tobytes())
                continue
            row = math.prod(w.shape[1:])
            step = max(1, CHUNK_ELEMENTS // max(row, 1))
            for begin in range(0, w.shape[0], step):
                end = min(w.shape[0], begin + step)
                chunk = source.read(w, 0, begin, end).astype(ml_dtypes.bfloat16)
                f.write(np.ascontiguousarray(chunk).tobytes())
    return offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", type=int, metavar="VOCAB", help="add a tokenizer")
    args = parser.parse_args()
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in preset_config(args.preset).items() if not k.startswith("_")}
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    groups = shards(checkpoint_weights(args.preset))
    source = RandomSource(args.seed)
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        total += write_shard(out / name, group, source)
        weight_map.update({str(w.source): name for w in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if args.tokenizer:
        from trained_reference import train_tokenizer  # beside this script

        from engine.calibration import sample_text

        train_tokenizer(sample_text(), args.tokenizer, out)
    print(
        json.dumps(
            {
                "preset": args.preset,
                "out": str(out),
                "tensors": len(weight_map),
                "shards": len(groups),
                "bytes": total,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
