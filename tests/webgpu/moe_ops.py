"""Which com.microsoft QMoE activations onnxruntime-webgpu runs on the WebGPU EP (CPU
fallback disabled). Prints one JSON object: activation -> "ok" or the error's first line.

    .venv-webgpu/bin/python tests/webgpu/moe_ops.py

Gemma 4's experts need GELU(tanh)-gated units (``geglu``); 1.27 runs ``swiglu`` only,
which is why engine/models/gemma4/moe.py gathers the experts' weights instead.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import webgpu_ort
from onnx import TensorProto, helper, numpy_helper

TOKENS, HIDDEN, WIDTH, EXPERTS, TOP_K, BLOCK, BITS = 3, 32, 32, 4, 2, 16, 4


def run(activation: str, fusion: int) -> str:
    rng = np.random.default_rng(0)
    rows = 2 * WIDTH if fusion else WIDTH
    tensors = {
        "q1": rng.integers(0, 255, (EXPERTS, rows, HIDDEN * BITS // 8), dtype=np.uint8),
        "s1": (0.01 * rng.random((EXPERTS, rows, HIDDEN // BLOCK))).astype(np.float32),
        "q2": rng.integers(0, 255, (EXPERTS, HIDDEN, WIDTH * BITS // 8), dtype=np.uint8),
        "s2": (0.01 * rng.random((EXPERTS, HIDDEN, WIDTH // BLOCK))).astype(np.float32),
    }
    attrs = dict(
        k=TOP_K,
        activation_type=activation,
        normalize_routing_weights=1,
        expert_weight_bits=BITS,
        block_size=BLOCK,
    )
    if fusion:
        attrs["swiglu_fusion"] = fusion
    node = helper.make_node(
        "QMoE", ["x", "r", "q1", "s1", "", "q2", "s2"], ["y"], domain="com.microsoft", **attrs
    )
    graph = helper.make_graph(
        [node],
        "qmoe",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [TOKENS, HIDDEN]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [TOKENS, EXPERTS]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in tensors.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = webgpu_ort.session(model.SerializeToString(), options)
        session.run(
            None,
            {
                "x": rng.standard_normal((TOKENS, HIDDEN)).astype(np.float32),
                "r": rng.standard_normal((TOKENS, EXPERTS)).astype(np.float32),
            },
        )
    except Exception as exc:  # the refusal is the measurement
        return str(exc).splitlines()[0]
    return "ok"


def main() -> None:
    cases = {"geglu fused [gate|up]": ("geglu", 2), "geglu interleaved": ("geglu", 1)}
    cases |= {"swiglu interleaved": ("swiglu", 1), "gelu (ungated)": ("gelu", 0)}
    report = {"onnxruntime": ort.__version__}
    report |= {name: run(*args) for name, args in cases.items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
