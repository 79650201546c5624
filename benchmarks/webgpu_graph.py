"""Node counts of the WebGPU decoder graph, the way the audit counts them (built graph, EP
rewrites applied, no weights needed): Gemma 4 E2B and E4B, fp16 / fp32 / INT4 weights +
INT4 embeddings, the text-only decoder (token ids in, per-layer inputs computed inside) and
the multimodal one (embeddings and per-layer inputs from the embedding session), against
mobius's 1,389 for the E2B fp16 WebGPU decoder.

    python benchmarks/webgpu_graph.py            # this checkout's engine
    PYTHONPATH=/path/to/other/checkout python benchmarks/webgpu_graph.py   # another commit
    .venv-webgpu/bin/python benchmarks/webgpu_graph.py --package PKG [--package PKG2]

``--package`` counts instead the nodes onnxruntime runs: the graph it optimizes for the WebGPU
EP (its fusions applied), saved through ``optimized_model_filepath``; run it in the WebGPU
environment. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

# This checkout's engine, not whichever one the environment has installed.
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.audit import audit_model
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset
from engine.rewrites import apply_rewrites

MOBIUS_E2B_FP16_NODES = 1389
"""mobius 0.1.0's E2B fp16 WebGPU decoder as issue 12 counted it (its package's model.onnx
holds 1,112 nodes: ``decoder_nodes`` in results/webgpu_side_by_side-*.json)."""
CASES = {
    "fp16": dict(ep="webgpu"),
    "fp32": dict(ep="webgpu", dtype="fp32"),
    "int4+int4": dict(ep="webgpu", weight_bits=4, embedding_bits=4),
}
DECODERS = {"text": ("text",), "multimodal": ("text", "vision")}
# The ops of the attention core and KV handling, to see where the nodes go.
ATTENTION_OPS = (
    "GroupQueryAttention",
    "RotaryEmbedding",
    "ScatterElements",
    "Softmax",
    "Transpose",
    "Reshape",
    "Cast",
)


def _commit() -> str:
    import engine

    root = Path(engine.__file__).resolve().parents[1]
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def count(preset: str, options: ExportOptions) -> dict[str, object]:
    export_plan = plan(load_preset(preset), options)
    model = build_decoder(export_plan)
    apply_rewrites(model, export_plan.caps)
    audit = audit_model(model, export_plan.caps)
    ops = Counter(audit.op_counts)
    return {
        "nodes": sum(ops.values()),
        "capture_ready": audit.capture_ready,
        "attention_ops": {op: ops[op] for op in ATTENTION_OPS if ops[op]},
        "op_counts": dict(sorted(ops.items())),
    }


def runtime_nodes(package: Path) -> dict[str, object]:
    """Nodes of onnxruntime's optimized graph of a package's decoder on the WebGPU EP."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        ort.InferenceSession(
            str(package / "model.onnx"), options, providers=["WebGpuExecutionProvider"]
        )
        model = onnx.load(str(Path(tmp) / "optimized.onnx"), load_external_data=False)
    ops = Counter(node.op_type for node in model.graph.node)
    return {"nodes": sum(ops.values()), "op_counts": dict(sorted(ops.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, action="append", default=[])
    args = parser.parse_args()
    if args.package:
        report = {str(p): runtime_nodes(p) for p in args.package}
        print(json.dumps({"benchmark": "webgpu_graph", "runtime": report}, indent=2))
        return
    results = {
        f"{preset}/{decoder}/{name}": count(preset, ExportOptions(**options, modalities=modalities))
        for preset in ("gemma4-e2b", "gemma4-e4b")
        for decoder, modalities in DECODERS.items()
        for name, options in CASES.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "webgpu_graph",
                "commit": _commit(),
                "mobius_e2b_fp16_nodes": MOBIUS_E2B_FP16_NODES,
                "command": "python -m engine audit --preset PRESET --ep webgpu "
                "--modalities text|text,vision "
                "[--dtype fp32 | --weight-bits 4 --embedding-bits 4] --json",
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
