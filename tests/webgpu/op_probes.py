"""One-op probes of what onnxruntime-webgpu 1.27 runs, and how precisely: the facts the
static-buffer lowering (engine/graph/static_attention.py) is built on.

Runs inside the WebGPU environment; each probe builds a one-node model, runs it on the
WebGPU EP with CPU fallback disabled (an op without a WebGPU kernel fails to load) and,
where it computes, compares it with float64 numpy. Prints one JSON object.

    .venv-webgpu/bin/python tests/webgpu/op_probes.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import webgpu_ort
from onnx import TensorProto, helper

F16, F32, I32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
WEBGPU = "WebGpuExecutionProvider"
_vi = helper.make_tensor_value_info


def _session(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 21) -> Any:
    graph = helper.make_graph(nodes, "probe", inputs, outputs)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return webgpu_ort.session(model.SerializeToString(), options)


def _run(nodes, inputs, outputs, feeds, opset: int = 21) -> list[np.ndarray] | str:
    try:
        return list(_session(nodes, inputs, outputs, opset).run(None, feeds))
    except Exception as exc:  # the message is the finding
        return str(exc).strip().splitlines()[-1][:200]


def matmul_accumulation() -> dict[str, Any]:
    """fp16 x @ W: error against float64 over the fp16 rounding of the exact result."""
    rng = np.random.default_rng(0)
    out = {}
    for k in (2048, 12288):
        x = rng.standard_normal((1, 1, k)).astype(np.float16)
        w = (rng.standard_normal((k, 1536)) * 0.03).astype(np.float16)
        exact = x.astype(np.float64)[0] @ w.astype(np.float64)
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        got = _run([node], [_vi("x", F16, [1, 1, k]), _vi("w", F16, [k, 1536])],
                   [_vi("y", F16, None)], {"x": x, "w": w})  # fmt: skip
        rounding = float(np.abs(exact.astype(np.float16) - exact).max())
        error = float(np.abs(got[0][0] - exact).max()) if not isinstance(got, str) else got
        out[f"K={k}"] = {"error": error, "fp16_rounding": rounding}
    return out


def int64_producers() -> dict[str, str]:
    """Which ops make or take int64 on the device (int64 arithmetic runs on the CPU)."""
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    cases = {
        "Cast float->int64": ([helper.make_node("Cast", ["x"], ["y"], to=I64)], x),
        "ArgMax float->int64": ([helper.make_node("ArgMax", ["x"], ["y"], axis=-1)], x),
    }
    out = {}
    for name, (nodes, data) in cases.items():
        got = _run(nodes, [_vi("x", F32, [1, 6])], [_vi("y", I64, None)], {"x": data})
        out[name] = "on the device" if not isinstance(got, str) else got
    return out


def rotary_int64_positions() -> str:
    rng = np.random.default_rng(1)
    heads, dim, seq, rows = 3, 512, 2, 16
    q = rng.standard_normal((1, seq, heads * dim)).astype(np.float32)
    cos, sin = (rng.standard_normal((rows, dim // 2)).astype(np.float32) for _ in range(2))
    pos = np.array([[5, 6]], np.int64)
    node = helper.make_node("RotaryEmbedding", ["q", "p", "c", "s"], ["y"],
                            domain="com.microsoft", num_heads=heads, interleaved=0)  # fmt: skip
    inputs = [_vi("q", F32, [1, seq, heads * dim]), _vi("p", I64, [1, seq]),
              _vi("c", F32, [rows, dim // 2]), _vi("s", F32, [rows, dim // 2])]  # fmt: skip
    got = _run([node], inputs, [_vi("y", F32, None)], {"q": q, "p": pos, "c": cos, "s": sin})
    if isinstance(got, str):
        return got
    x = q.reshape(seq, heads, dim)
    c, s = cos[pos[0]][:, None], sin[pos[0]][:, None]
    half = dim // 2
    ref = np.concatenate(
        [x[..., :half] * c - x[..., half:] * s, x[..., half:] * c + x[..., :half] * s], -1
    )
    return f"on the device, max error {float(np.abs(got[0] - ref.reshape(1, seq, -1)).max()):.1e}"


def scatter_in_place(length: int = 65536) -> dict[str, Any]:
    """ScatterElements with its output bound to its data input's buffer: written in place
    (no copy: the time does not grow with the buffer)."""
    dim = 256
    node = helper.make_node("ScatterElements", ["data", "index", "update"], ["out"], axis=2)
    inputs = [
        _vi("data", F32, [1, 1, length, dim]),
        _vi("index", I32, [1, 1, 1, dim]),
        _vi("update", F32, [1, 1, 1, dim]),
    ]
    session = _session([node], inputs, [_vi("out", F32, None)])
    from gqa_cases import _Device  # device-resident OrtValues (the Python API cannot make them)

    buffer = _Device("webgpu").new(np.zeros((1, 1, length, dim), np.float32))
    seconds = []
    for step in range(4):
        binding = session.io_binding()
        binding.bind_ortvalue_input("data", buffer)
        binding.bind_cpu_input("index", np.full((1, 1, 1, dim), step, np.int32))
        binding.bind_cpu_input("update", np.full((1, 1, 1, dim), step + 1.0, np.float32))
        binding.bind_ortvalue_output("out", buffer)
        began = time.perf_counter()
        session.run_with_iobinding(binding)
        seconds.append(time.perf_counter() - began)
    rows = buffer.numpy()[0, 0, :5, 0].tolist()
    return {"first_rows": rows, "in_place": rows == [1.0, 2.0, 3.0, 4.0, 0.0],
            "ms_per_write": round(1000 * sorted(seconds)[1], 3), "buffer_rows": length}  # fmt: skip


def split_outputs() -> dict[int, str]:
    """Each Split output is a shader binding: how many one Split may have."""
    out = {}
    for count in (7, 15, 16):
        names = [f"y{i}" for i in range(count)]
        node = helper.make_node("Split", ["x"], names, axis=-1, num_outputs=count)
        got = _run([node], [_vi("x", F32, [1, count * 4])], [_vi(n, F32, None) for n in names],
                   {"x": np.ones((1, count * 4), np.float32)}, opset=18)  # fmt: skip
        out[count] = "runs" if not isinstance(got, str) else "fails: " + got[:80]
    return out


def main() -> None:
    report = {
        "onnxruntime": ort.__version__,
        "matmul_fp16_accumulation": matmul_accumulation(),
        "int64": int64_producers(),
        "rotary_embedding_int64_positions_fp32_head_512": rotary_int64_positions(),
        "scatter_elements_in_place": scatter_in_place(),
        "split_outputs": split_outputs(),
    }
    sys.stdout.write(json.dumps(report, indent=1) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip the WebGPU device teardown


if __name__ == "__main__":
    main()
