"""Export the full-size Gemma 4 26B-A4B architecture (random weights), or as many of its
layers as this machine's disk holds, and check the package against the plan. Prints one
JSON object.

    python benchmarks/moe_export.py [--preset gemma4-26b-a4b] [--ep webgpu] [--dtype fp16]
        [--weight-bits 4] [--embedding-bits 4] [--layers N] [--out DIR] [--keep]

What it reports:

* wall time and peak RSS of the export, against the budget streaming promises: 2 GiB plus
  the largest single planned tensor (the writer materialises at most its 1 GiB in-flight
  budget plus one oversized tensor; the expert tensors [E, 2I, H] are the largest ones);
* the written package against the plan, initializer by initializer (dtype, shape, bytes),
  and the external data file's size against the sum of the external initializers;
* with ``--prefill-tokens N``: the peak RSS of one N-token prefill of the package on the
  CPU EP, in a fresh process (the per-token lowering gathers N x top_k experts' weights,
  the per-expert one at most one copy of a layer's experts);
* ``layers``: the number of decoder layers exported. With ``--layers`` left out, every
  layer when the disk has room for the whole package (plus 10 %), otherwise the most
  layers that fit (a slice of the preset: the same embedding, the first N layers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import onnx

from engine.dtypes import ir_dtype
from engine.models import spec_from_config
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import ExportPlan, plan
from engine.presets import preset_config

DISK_MARGIN = 1.10
RSS_ALLOWANCE = 2 * 1024**3


def sliced_config(preset: str, layers: int | None) -> dict[str, Any]:
    """The preset's config with only its first ``layers`` decoder layers (all if None)."""
    config = preset_config(preset)
    if layers is not None and layers < config["num_hidden_layers"]:
        config["num_hidden_layers"] = layers
        config["layer_types"] = config["layer_types"][:layers]
    return config


def plan_for(config: dict[str, Any], options: ExportOptions, name: str) -> ExportPlan:
    return plan(spec_from_config(config, name=name), options)


def choose_layers(preset: str, options: ExportOptions, folder: Path) -> tuple[int, int]:
    """(layers to export, free bytes): every layer if the package fits, else the most that do."""
    free = shutil.disk_usage(folder).free
    total = preset_config(preset)["num_hidden_layers"]
    for layers in range(total, 0, -1):
        needed = plan_for(sliced_config(preset, layers), options, preset).nbytes * DISK_MARGIN
        if needed <= free:
            return layers, free
    raise SystemExit(f"not even one layer of {preset} fits the {free:,} free bytes")


def compare_with_plan(package: Path, export_plan: ExportPlan) -> dict[str, Any]:
    """Every planned initializer against the written one; returns counts and mismatches."""
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    stored: dict[str, tuple[int, tuple[int, ...], int, bool]] = {}
    for init in proto.graph.initializer:
        external = init.data_location == onnx.TensorProto.EXTERNAL
        if external:
            length = int(next(e.value for e in init.external_data if e.key == "length"))
        else:
            length = len(init.raw_data)
        stored[init.name] = (init.data_type, tuple(init.dims), length, external)
    mismatches = []
    planned_bytes = 0
    for tensor in export_plan.decoder.tensors():
        got = stored.get(tensor.name)
        want = (ir_dtype(tensor.dtype).value, tensor.shape, tensor.nbytes)
        planned_bytes += tensor.nbytes
        if got is None or got[:3] != want:
            mismatches.append({"name": tensor.name, "planned": want, "stored": got})
    external = sum(v[2] for v in stored.values() if v[3])
    data_file = (package / "model.onnx.data").stat().st_size
    return {
        "planned_initializers": sum(1 for _ in export_plan.decoder.tensors()),
        "stored_initializers": len(stored),
        "mismatches": mismatches[:20],
        "mismatch_count": len(mismatches),
        "planned_bytes": planned_bytes,
        "plan_total_bytes": export_plan.nbytes,
        "external_bytes": external,
        "data_file_bytes": data_file,
        "byte_for_byte": not mismatches
        and planned_bytes == export_plan.nbytes
        and data_file == external,
    }


_PREFILL = """
import sys, time
import numpy as np, onnxruntime as ort
def status(key):  # VmHWM / VmRSS of this process (ru_maxrss survives fork + exec on Linux)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
path, tokens, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
inputs = {i.name: i for i in session.get_inputs()}
index = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
dtype = np.float16 if "float16" in inputs["past_key_values.0.key"].type else np.float32
feeds = {"input_ids": (np.arange(tokens, dtype=index) % 200 + 5)[None],
         "attention_mask": np.ones((1, tokens), index)}
for name, info in inputs.items():
    if name.startswith("past_key_values."):
        feeds[name] = np.zeros((1, info.shape[1], slots, info.shape[3]), dtype)
before = status("VmHWM")
began = time.perf_counter()
session.run(["logits"], feeds)
print(before, status("VmHWM"), time.perf_counter() - began)
"""


def prefill_memory(package: Path, tokens: int) -> dict[str, Any]:
    """Peak RSS of one prefill of ``tokens`` tokens on the CPU EP, in a fresh process: what
    the MoE lowering costs beyond the loaded weights. Past KV buffers are empty, or
    ``max_length`` slots where the package writes K / V by position (``static_kv``)."""
    import subprocess
    import sys

    from engine.runtime.package import open_package

    opened = open_package(package)
    slots = opened.max_length if opened.static_kv else 0

    done = subprocess.run(
        [sys.executable, "-c", _PREFILL, str(package / "model.onnx"), str(tokens), str(slots)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return {"tokens": tokens, "error": done.stderr.strip().splitlines()[-1:]}
    loaded, peak, seconds = done.stdout.split()
    return {
        "tokens": tokens,
        "peak_rss_before_prefill_bytes": int(loaded),
        "peak_rss_bytes": int(peak),
        "prefill_seconds": round(float(seconds), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gemma4-26b-a4b")
    parser.add_argument("--ep", default="webgpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--weight-bits", type=int, default=4)
    parser.add_argument("--embedding-bits", type=int, default=4)
    parser.add_argument("--layers", type=int, default=None, help="default: all that fit")
    parser.add_argument("--out", default=None, help="folder to write into (default: a temp dir)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--prefill-tokens",
        type=int,
        default=0,
        help="also measure one prefill of this many tokens on the CPU EP (peak RSS)",
    )
    args = parser.parse_args()

    options = ExportOptions(
        ep=args.ep,
        dtype=args.dtype,
        weight_bits=args.weight_bits,
        embedding_bits=args.embedding_bits,
        random_weights=True,
    )
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-moe-"))
    root.mkdir(parents=True, exist_ok=True)
    full_plan = plan_for(sliced_config(args.preset, None), options, args.preset)
    if args.layers is None:
        layers, free = choose_layers(args.preset, options, root)
    else:
        layers, free = args.layers, shutil.disk_usage(root).free
    config = sliced_config(args.preset, layers)
    model_dir = root / "config"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    export_plan = plan_for(config, options, args.preset)
    largest = max(t.nbytes for t in export_plan.decoder.tensors())
    largest_name = max(export_plan.decoder.tensors(), key=lambda t: t.nbytes).name

    load_before = os.getloadavg()
    began = time.perf_counter()
    result = export(root / "pkg", model_dir=model_dir, options=options, overwrite=True)
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak_rss = usage.ru_maxrss * 1024
    check = compare_with_plan(result.output, export_plan)
    report = {
        "benchmark": "moe_export",
        "preset": args.preset,
        "ep": result.plan.caps.name,
        "dtype": result.plan.options.dtype,
        "weight_bits": args.weight_bits,
        "embedding_bits": args.embedding_bits,
        "cpu_count": os.cpu_count(),
        "free_disk_bytes_before": free,
        "layers": layers,
        "layers_in_preset": full_plan.spec.num_layers,
        "full_preset_plan_bytes": full_plan.nbytes,
        "plan_bytes": export_plan.nbytes,
        "package_bytes": result.total_bytes,
        "wall_seconds": round(wall, 1),
        # On a shared machine the wall time says little alone: the process's own CPU time
        # and the load around it put it in context.
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "write_throughput_mb_s": round(result.total_bytes / wall / 1e6, 1),
        "peak_rss_bytes": peak_rss,
        "largest_tensor": largest_name,
        "largest_tensor_bytes": largest,
        "rss_budget_bytes": RSS_ALLOWANCE + largest,
        "rss_within_budget": peak_rss <= RSS_ALLOWANCE + largest,
        "plan_check": check,
        "graph_capture": result.capture,
        "moe_lowering": "per expert" if result.plan.caps.data_dependent_shapes else "per token",
        "prefill_on_cpu_ep": (
            prefill_memory(result.output, args.prefill_tokens) if args.prefill_tokens else None
        ),
        "files": result.files,
    }
    print(json.dumps(report, indent=2))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
