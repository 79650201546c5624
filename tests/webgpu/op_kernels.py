"""Which (op, dtype) pairs onnxruntime-webgpu runs on the WebGPU EP: one-node models at the
engine's opset, CPU fallback disabled. Prints one JSON object: ``"Op/dtype[@opset]"`` ->
"ok", "host" (no WebGPU kernel: the node would fall back to the CPU) or the error's
first line.

    .venv-webgpu/bin/python tests/webgpu/op_kernels.py

engine/caps.py's WebGPU ``host_ops`` and ``host_op_dtypes`` record what this measures
(tests/engine/test_webgpu.py checks they agree).
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import webgpu_ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 23
"""engine/graph/context.py's default-domain opset."""
TYPES = {
    "float": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "bool": TensorProto.BOOL,
}
NUMPY = {"float": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}
NUMPY["bool"] = np.bool_


def run(
    op: str,
    dtype: str,
    n_inputs: int,
    consts: tuple[np.ndarray, ...] = (),
    out_dtype: str | None = None,
    opset: int = OPSET,
    **attrs: object,
) -> str:
    """Place one ``op`` node on ``n_inputs`` [1, 4] inputs of ``dtype`` (then ``consts``)."""
    x = np.array([[1, 0, 1, 1]]).astype(NUMPY[dtype])
    names = [f"x{i}" for i in range(n_inputs)]
    inits = [numpy_helper.from_array(c, f"c{i}") for i, c in enumerate(consts)]
    node = helper.make_node(op, names + [i.name for i in inits], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(n, TYPES[dtype], [1, 4]) for n in names],
        [helper.make_tensor_value_info("y", TYPES[out_dtype or dtype], None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = webgpu_ort.session(model.SerializeToString(), options)
        session.run(None, {n: x for n in names})
    except Exception as exc:
        text = str(exc).strip().splitlines()[-1]
        return "host" if "fallback to CPU EP has been explicitly disabled" in text else text[:200]
    return "ok"


def measure() -> dict[str, str]:
    axis = np.array(1, np.int32)
    bounds = {d: (np.array(0, NUMPY[d]), np.array(1, NUMPY[d])) for d in ("float", "int32")}
    slice_args = (np.array([0], np.int32), np.array([2], np.int32), np.array([1], np.int32))
    out: dict[str, str] = {}
    for d in ("float", "float16", "int32"):
        out[f"CumSum/{d}"] = run("CumSum", d, 1, (axis,))
        out[f"Max/{d}"] = run("Max", d, 2)
        out[f"Min/{d}"] = run("Min", d, 2)
    for d in ("float", "int32", "bool"):
        out[f"Equal/{d}"] = run("Equal", d, 2, out_dtype="bool")
        out[f"Slice/{d}"] = run("Slice", d, 1, slice_args)
        out[f"Gather/{d}"] = run("Gather", d, 1, (np.array([0, 2], np.int32),), axis=1)
    for d in ("float", "int32"):
        out[f"Less/{d}"] = run("Less", d, 2, out_dtype="bool")
        out[f"Clip/{d}"] = run("Clip", d, 1, bounds[d])
        out[f"ReduceSum/{d}"] = run("ReduceSum", d, 1, (np.array([1], np.int64),))
        out[f"Compress/{d}"] = run("Compress", d, 1, (np.array([True, False, True, True]),), axis=1)
    for op in ("And", "Or", "Xor"):
        out[f"{op}/bool"] = run(op, "bool", 2)
    for opset in (21, OPSET):
        out[f"Sin/float@{opset}"] = run("Sin", "float", 1, opset=opset)
        out[f"Cos/float@{opset}"] = run("Cos", "float", 1, opset=opset)
    return out


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
