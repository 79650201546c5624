"""Node counts of the WebGPU decoder graph, the way the audit counts them (built graph, EP
rewrites applied, no weights needed): Gemma 4 E2B and E4B, fp16 / fp32 / INT4 weights +
INT4 embeddings, against mobius's 1,389 for the E2B fp16 WebGPU decoder.

    python benchmarks/webgpu_graph.py            # the engine on PYTHONPATH
    PYTHONPATH=/path/to/other/checkout python benchmarks/webgpu_graph.py   # another commit

Prints one JSON object.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

from engine.audit import audit_model
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset
from engine.rewrites import apply_rewrites

MOBIUS_E2B_FP16_NODES = 1389
"""mobius 0.1.0's E2B fp16 WebGPU decoder (issue 12)."""
CASES = {
    "fp16": ExportOptions(ep="webgpu"),
    "fp32": ExportOptions(ep="webgpu", dtype="fp32"),
    "int4+int4": ExportOptions(ep="webgpu", weight_bits=4, embedding_bits=4),
}
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


def main() -> None:
    results = {
        f"{preset}/{name}": count(preset, options)
        for preset in ("gemma4-e2b", "gemma4-e4b")
        for name, options in CASES.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "webgpu_graph",
                "commit": _commit(),
                "mobius_e2b_fp16_nodes": MOBIUS_E2B_FP16_NODES,
                "command": "python -m engine audit --preset PRESET --ep webgpu "
                "[--dtype fp32 | --weight-bits 4 --embedding-bits 4] --json",
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
