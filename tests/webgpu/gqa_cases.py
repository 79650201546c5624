"""One-op GroupQueryAttention reproducers for the WebGPU EP, against a numpy reference.

Runs inside the WebGPU environment (onnxruntime-webgpu + onnx + numpy). Each case is the
exact GQA configuration the Gemma 4 WebGPU package uses: do_rotary=1 with cos/sin caches,
scale=1.0, past/present share buffer [1, kv, MAX, H], a KV-owner node and a KV-shared
node (empty k/v, the owner's present KV as its past), driven like onnxruntime-genai:
a prefill of S0 tokens, then STEPS single-token decode steps.

Knobs (command line, key=value): total=static|actual (total_sequence_length = MAX, the
static mask width, or the valid length), bias=none|causal|window (an additive
[1, 1, S, T] attention_bias, T = total_sequence_length), window=W (sliding window for
the reference and the bias; lws=1 also sets local_window_size=W), capture=0|1,
provider=webgpu|cpu, shared=1|0 (0 replaces the KV-shared node by Identity(q2); note that
under capture an Identity from a graph input to a graph output replays stale values from
the second decode step on, so read only the owner column then), s0, steps, max, heads,
kv, head.

Prints one JSON object: per step max |out - ref| of the owner and of the shared node.

    python tests/webgpu/gqa_cases.py total=static bias=window window=4 capture=1
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

_KEEP: list[Any] = []


def _parse(argv: list[str]) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(
        total="static",
        bias="none",
        window=4,
        lws=0,
        capture=0,
        provider="webgpu",
        s0=6,
        steps=10,
        max=32,
        heads=4,
        kv=2,
        head=16,
        seed=0,
        shared=1,
        dtype="fp32",
        timing=0,
        packed=0,
        smooth=0,
    )
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in cfg:
            raise SystemExit(f"unknown knob {key}")
        cfg[key] = type(cfg[key])(value)
    return cfg


def _model(cfg: dict[str, Any]) -> bytes:
    nh, kv, h, mx = cfg["heads"], cfg["kv"], cfg["head"], cfg["max"]
    f32, i32 = _elem(cfg), TensorProto.INT32
    vi = helper.make_tensor_value_info
    attrs: dict[str, Any] = dict(
        domain="com.microsoft", num_heads=nh, kv_num_heads=kv, scale=1.0, do_rotary=1
    )
    if cfg["lws"]:
        attrs["local_window_size"] = cfg["window"]
    if cfg["smooth"]:
        attrs["smooth_softmax"] = 1
    bias = ["bias"] if cfg["bias"] != "none" else []
    common = ["sl", "tl", "cos", "sin", "", *bias]
    empty = helper.make_tensor("empty", f32, [1, 0, kv * h], [])
    # shared=2: the KV-shared node is given the owner's new keys/values again (it rewrites
    # the same slots) instead of empty ones.
    shared_kv = ["k", "v"] if cfg["shared"] == 2 else ["empty", "empty"]
    nodes = [
        helper.make_node(
            "GroupQueryAttention", ["q", "k", "v", "pk", "pv", *common], ["y", "pk", "pv"], **attrs
        ),
        helper.make_node(
            "GroupQueryAttention",
            ["q2", *shared_kv, "pk", "pv", *common],
            ["y2", "unused_k", "unused_v"],
            **attrs,
        ),
    ]
    # An ONNX graph cannot name one value as both input and output; the owner's present
    # outputs get their own names and the runner binds them to the past buffers.
    nodes[0].output[:] = ["y", "present_k", "present_v"]
    if cfg["packed"]:  # the owner takes one packed [q | k | v] input
        nodes.insert(0, helper.make_node("Concat", ["q", "k", "v"], ["qkv"], axis=-1))
        nodes[1].input[:3] = ["qkv", "", ""]
    nodes[1].input[3:5] = ["present_k", "present_v"]
    inputs = [
        vi("q", f32, [1, "S", nh * h]),
        vi("k", f32, [1, "S", kv * h]),
        vi("v", f32, [1, "S", kv * h]),
        vi("q2", f32, [1, "S", nh * h]),
        vi("pk", f32, [1, kv, mx, h]),
        vi("pv", f32, [1, kv, mx, h]),
        vi("sl", i32, [1]),
        vi("tl", i32, []),
    ]
    if bias:
        inputs.append(vi("bias", f32, [1, 1, "S", "T"]))
    npd = _np_dtype(cfg)
    inits = [
        helper.make_tensor("cos", f32, [mx, h // 2], _rope(cfg)[0].astype(npd).tobytes(), raw=True),
        helper.make_tensor("sin", f32, [mx, h // 2], _rope(cfg)[1].astype(npd).tobytes(), raw=True),
        empty,
    ]
    outputs = [vi(n, f32, None) for n in ("y", "present_k", "present_v", "y2")]
    if not cfg["shared"]:  # the KV-shared node's q2 then feeds an Identity
        nodes[1] = helper.make_node("Identity", ["q2"], ["y2"])
    graph = helper.make_graph(nodes, "gqa", inputs, outputs, initializer=inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    return model.SerializeToString()


def _elem(cfg: dict[str, Any]) -> int:
    return TensorProto.FLOAT16 if cfg["dtype"] == "fp16" else TensorProto.FLOAT


def _np_dtype(cfg: dict[str, Any]) -> type:
    return np.float16 if cfg["dtype"] == "fp16" else np.float32


def _rope(cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    h, mx = cfg["head"], cfg["max"]
    inv = 1.0 / (10000.0 ** (np.arange(0, h, 2) / h))
    ang = np.outer(np.arange(mx), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rotate(x: np.ndarray, pos: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    cos, sin = (c.astype(np.float64)[pos] for c in _rope(cfg))  # [S, H/2]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _allowed(cfg: dict[str, Any], query_pos: int, key_pos: int) -> bool:
    if key_pos > query_pos:
        return False
    if cfg["bias"] == "window" or cfg["lws"]:
        return query_pos - key_pos < cfg["window"]
    return True


def _reference(cfg, q_all, k_all, v_all, q2_all, upto, start):
    """Outputs for queries start..upto-1 over keys 0..upto-1 (float64), owner and shared."""
    nh, kv, h = cfg["heads"], cfg["kv"], cfg["head"]
    pos_k = np.arange(upto)
    kr = _rotate(k_all[:upto].reshape(upto, kv, h).transpose(1, 0, 2), pos_k, cfg)
    vr = v_all[:upto].reshape(upto, kv, h).transpose(1, 0, 2)
    outs = []
    for q_src in (q_all, q2_all):
        pos_q = np.arange(start, upto)
        q = _rotate(q_src[start:upto].reshape(-1, nh, h).transpose(1, 0, 2), pos_q, cfg)
        rep = nh // kv
        kk = np.repeat(kr, rep, 0)
        vv = np.repeat(vr, rep, 0)
        s = np.einsum("nsh,nth->nst", q, kk)
        mask = np.array([[_allowed(cfg, p, j) for j in range(upto)] for p in pos_q])
        s = np.where(mask[None], s, -np.inf)
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("nst,nth->nsh", p, vv).transpose(1, 0, 2).reshape(len(pos_q), nh * h)
        outs.append(o)
    return outs


def _bias(cfg: dict[str, Any], start: int, seq: int, width: int) -> np.ndarray:
    npd = _np_dtype(cfg)
    b = np.full((1, 1, seq, width), np.finfo(npd).min, npd)
    for i in range(seq):
        for j in range(width):
            if _allowed(cfg, start + i, j):
                b[0, 0, i, j] = 0.0
    return b


class _Device:
    def __init__(self, provider: str) -> None:
        self.provider = provider

    def new(self, arr: np.ndarray) -> ort.OrtValue:
        arr = np.array(arr, copy=True, order="C")  # never alias the caller's data
        if self.provider == "cpu":
            return ort.OrtValue.ortvalue_from_numpy(arr)
        elem = {
            np.dtype(np.float32): TensorProto.FLOAT,
            np.dtype(np.float16): TensorProto.FLOAT16,
            np.dtype(np.int32): TensorProto.INT32,
        }
        t = elem[arr.dtype]
        vi = helper.make_tensor_value_info
        g = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "id",
            [vi("x", t, list(arr.shape))],
            [vi("y", t, None)],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        m.ir_version = 10
        s = webgpu_ort.session(m.SerializeToString())
        io = s.io_binding()
        io.bind_cpu_input("x", arr)
        io.bind_output("y", "webgpu")
        s.run_with_iobinding(io)
        value = io.get_outputs()[0]
        _KEEP.extend([s, io, value])
        return value

    def write(self, target: ort.OrtValue, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        if self.provider == "cpu":
            target.update_inplace(arr)
        else:
            ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(arr)], [target], None)


def _shared_err(cfg: dict[str, Any], y2: ort.OrtValue, ref: np.ndarray, q2: np.ndarray) -> float:
    expected = ref if cfg["shared"] else q2[0]
    return float(np.abs(y2.numpy()[0] - expected).max())


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    nh, kv, h, mx, s0, steps = (cfg[k] for k in ("heads", "kv", "head", "max", "s0", "steps"))
    provider = "WebGpuExecutionProvider" if cfg["provider"] == "webgpu" else "CPUExecutionProvider"
    rng = np.random.default_rng(cfg["seed"])
    n = s0 + steps
    npd = _np_dtype(cfg)
    q_all = rng.standard_normal((n, nh * h)).astype(npd)
    k_all = rng.standard_normal((n, kv * h)).astype(npd)
    v_all = rng.standard_normal((n, kv * h)).astype(npd)
    q2_all = rng.standard_normal((n, nh * h)).astype(npd)
    dev = _Device(cfg["provider"])
    pk = dev.new(np.zeros((1, kv, mx, h), npd))
    pv = dev.new(np.zeros((1, kv, mx, h), npd))

    def session(capture: bool):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if provider != "CPUExecutionProvider":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if capture:
            so.add_session_config_entry("ep.webgpuexecutionprovider.enableGraphCapture", "1")
        s = webgpu_ort.session(_model(cfg), so, [provider])
        _KEEP.append(s)
        return s

    def feeds(start: int, seq: int) -> dict[str, np.ndarray]:
        upto = start + seq
        width = mx if cfg["total"] == "static" else upto
        f = {
            "q": q_all[None, start:upto],
            "k": k_all[None, start:upto],
            "v": v_all[None, start:upto],
            "q2": q2_all[None, start:upto],
            "sl": np.array([upto - 1], np.int32),
            "tl": np.array(width, np.int32),
        }
        if cfg["bias"] != "none":
            f["bias"] = _bias(cfg, start, seq, width)
        return f

    def bind(s, values: dict[str, ort.OrtValue], y: ort.OrtValue, y2: ort.OrtValue):
        io = s.io_binding()
        for name, value in values.items():
            io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_input("pk", pk)
        io.bind_ortvalue_input("pv", pv)
        io.bind_ortvalue_output("y", y)
        io.bind_ortvalue_output("y2", y2)
        io.bind_ortvalue_output("present_k", pk)
        io.bind_ortvalue_output("present_v", pv)
        _KEEP.append(io)
        return io

    result: dict[str, Any] = {"config": cfg, "owner": [], "shared": [], "errors": []}
    capture = bool(cfg["capture"])
    # One session for the prefill and every decode step, like onnxruntime-genai; the
    # prefill runs uncaptured (gpu_graph_id -1), the decode steps are captured/replayed.
    static = cfg["total"] == "static"
    try:
        sess = session(capture)
        f = feeds(0, s0)
        vals = {k: dev.new(v) for k, v in f.items()}
        y = dev.new(np.zeros((1, s0, nh * h), npd))
        y2 = dev.new(np.zeros((1, s0, nh * h), npd))
        ro = ort.RunOptions()
        if capture:
            ro.add_run_config_entry("gpu_graph_id", "-1")
        sess.run_with_iobinding(bind(sess, vals, y, y2), ro)
        ref = _reference(cfg, q_all, k_all, v_all, q2_all, s0, 0)
        result["owner"].append(float(np.abs(y.numpy()[0] - ref[0]).max()))
        result["shared"].append(_shared_err(cfg, y2, ref[1], f["q2"]))
        y = dev.new(np.zeros((1, 1, nh * h), npd))
        y2 = dev.new(np.zeros((1, 1, nh * h), npd))
        vals = None
        io = None
        seconds: list[float] = []
        result["decode_seconds"] = seconds
        for t in range(s0, n):
            f = feeds(t, 1)
            if static and vals is not None:
                for k, v in f.items():
                    dev.write(vals[k], v)
            else:  # first decode step, or a growing bias in "actual" mode (no capture)
                vals = {k: dev.new(v) for k, v in f.items()}
                io = bind(sess, vals, y, y2)
            began = time.perf_counter()
            sess.run_with_iobinding(io)
            out = y.numpy()  # waits for the step
            seconds.append(time.perf_counter() - began)
            if cfg["timing"]:
                continue
            ref = _reference(cfg, q_all, k_all, v_all, q2_all, t + 1, t)
            result["owner"].append(float(np.abs(out[0] - ref[0]).max()))
            result["shared"].append(_shared_err(cfg, y2, ref[1], f["q2"]))
    except Exception as exc:
        result["errors"].append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:400]}")
    worst = max(result["owner"] + result["shared"], default=float("nan"))
    result["max_err"] = worst
    tolerance = 2e-2 if cfg["dtype"] == "fp16" else 1e-3
    result["ok"] = not result["errors"] and len(result["owner"]) == steps + 1 and worst < tolerance
    decode = sorted(result.get("decode_seconds", [])[1:])  # the first step captures
    result["median_decode_seconds"] = decode[len(decode) // 2] if decode else None
    result["min_decode_seconds"] = decode[0] if decode else None
    result.pop("decode_seconds", None)
    return result


if __name__ == "__main__":
    out = run(_parse(sys.argv[1:]))
    out["owner"] = [round(e, 6) for e in out["owner"]]
    out["shared"] = [round(e, 6) for e in out["shared"]]
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)
