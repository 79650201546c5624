"""What one op (or one small block) costs on the WebGPU EP under graph capture: the
alternatives the decoder could be built from, side by side in one run.

Each case is a chain of R copies of a block (each copy's output feeds the next, weights
distinct per copy so nothing stays in cache), bound to device buffers and replayed with
graph capture; a block's cost is ``(t(R) - t(1)) / (R - 1)``, so the run's fixed cost
drops out. Cases:

* ``elementwise`` / ``rmsnorm``: the per-kernel floor (Add, RMSNormalization on [1, H]);
* ``attention/<variant>@T,D``: one decode step of attention (8 heads over one KV head of
  T slots, fp32): the scores as an Einsum + Add of the mask (what the decoder has), as
  Gemm(q, K, transB, C = mask), or MatMul(K, q^T) + Transpose; then Softmax and P @ V,
  one MatMul or (``gemm_splitpvG``) G partial products over slices of T, P's rows
  transposed to [G, N, T / G], a batched MatMul with V as [G, T / G, D] and a ReduceSum
  (``gemm_bcastpvG``: P as [N, G, 1, T / G] broadcast against V, no Transpose;
  ``gemm_chunkpvG``: P and V split into G chunks of T, any T, G MatMuls summed by Adds,
  as the EP has no Sum kernel; ``gemm_headpv``: any T, P as [N, 1, T], each head a batch
  entry of its own against V [1, T, D] broadcast);
* ``mlp/<variant>``: H -> F -> H projections at E2B's widths as MatMulNBits (block size,
  accuracy level, fp16 or fp32 activations), MatMul on [1, 1, K] or [1, K], Gemm(transB)
  (at most 5 copies: fp32 weights stay under protobuf's 2 GiB), and split-K: the weight
  as [G, K / G, N] (the same bytes), a batched MatMul and a ReduceSum of the G partials;
* ``positions/<variant>@L``: the key positions 0..L-1 of a KV buffer of L slots under a
  static graph (no Shape), from a [1, L] row of its values: ``ones`` (Equal, Where: the
  NaN-safe ones the others start from), ``cumsum`` (then CumSum and Sub, as the packages
  have), ``convK`` (then a tower of 1-D Convs of K ones, dilations 1, K, K^2, ..., each
  window reaching back K^i * (K - 1) slots, the last with bias -1; as many levels as
  reach E2B's context, 131,072 slots);
* ``head/<dtype>``: the float LM head, MatMul(table [V, H], x^T) (at most 3 copies);
* ``proj/mmnb4/HxN/acc<L>`` and ``head/mmnb4/V/acc<L>``: E2B's INT4 projections (as
  H -> N -> H pairs) and LM head at MatMulNBits accuracy levels 0 and 4.

    python benchmarks/device/webgpu_ops.py [--tiny] [--repeats 9] [--replays 200]

Runs on this interpreter's WebGPU runtime (the onnxruntime-ep-webgpu plugin, or
onnxruntime-webgpu 1.27); prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "webgpu"))

import webgpu_ort
from onnx import TensorProto, helper, numpy_helper

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
NP = {F32: np.float32, F16: np.float16}
Block = Callable[["Chain", str, int], str]


class Chain:
    """Nodes and initializers of a chain of blocks under construction."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.rng = rng
        self._n = 0

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def node(self, op: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], domain=domain, **attrs))
        return out

    def init(self, array: np.ndarray, stem: str = "w") -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def randn(self, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> str:
        return self.init((scale * self.rng.standard_normal(shape)).astype(dtype))


def _model(block: Block, repeats: int, x_shape: list[int], dtype: int, seed: int) -> bytes:
    chain = Chain(np.random.default_rng(seed))
    value = "x"
    for i in range(repeats):
        value = block(chain, value, i)
    chain.nodes.append(helper.make_node("Identity", [value], ["y"]))
    graph = helper.make_graph(
        chain.nodes,
        "chain",
        [helper.make_tensor_value_info("x", dtype, x_shape)],
        [helper.make_tensor_value_info("y", dtype, x_shape)],
        initializer=chain.inits,
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def _replay_seconds(model: bytes, x: np.ndarray, replays: int, capture: bool = True) -> float:
    """Seconds per run of ``model``, inputs and output on device: replays under graph
    capture, or (``capture=False``) plain runs, each kernel dispatched by the host."""
    import onnxruntime as ort

    from engine.runtime.device_io import StaticTensors

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    # onnxruntime-webgpu 1.27's provider or the onnxruntime-ep-webgpu plugin, whichever
    # this interpreter has: both read the switch from the session config.
    options.add_session_config_entry(
        "ep.webgpuexecutionprovider.enableGraphCapture", "1" if capture else "0"
    )
    session = webgpu_ort.session(model, options)
    tensors = StaticTensors(
        {"x": (x.shape, x.dtype), "y": (x.shape, x.dtype)}, "webgpu", "WebGpuExecutionProvider"
    )
    tensors.write({"x": x, "y": np.zeros_like(x)})
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", tensors.values["x"])
    binding.bind_ortvalue_output("y", tensors.values["y"])
    for _ in range(3):  # the first run captures
        session.run_with_iobinding(binding)
    tensors.values["y"].numpy()
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(replays):
            session.run_with_iobinding(binding)
        tensors.values["y"].numpy()  # waits for the queue
        runs.append((time.perf_counter() - started) / replays)
    return statistics.median(runs)


def measure(
    block: Block, x: np.ndarray, dtype: int, repeats: int, replays: int, capture: bool = True
) -> dict:
    """Microseconds per block: the slope between a chain of 1 and one of ``repeats``."""
    times = {}
    for r in (1, repeats):
        model = _model(block, r, list(x.shape), dtype, seed=r)
        times[r] = _replay_seconds(model, x, replays, capture)
    return {
        "us_per_block": round(1e6 * (times[repeats] - times[1]) / (repeats - 1), 2),
        "us_chain_1": round(1e6 * times[1], 2),
        f"us_chain_{repeats}": round(1e6 * times[repeats], 2),
    }


# ---------------------------------------------------------------------------------- blocks


def elementwise(dtype: int) -> Block:
    def block(c: Chain, x: str, i: int) -> str:
        return c.node("Add", [x, c.init(np.array(1e-3, NP[dtype]), "c")])

    return block


def rmsnorm(dtype: int, width: int) -> Block:
    def block(c: Chain, x: str, i: int) -> str:
        return c.node("RMSNormalization", [x, c.init(np.ones(width, NP[dtype]))], epsilon=1e-6)

    return block


def attention(variant: str, heads: int, length: int, dim: int) -> Block:
    """One decode step over one KV head: x = q [1, 1, N, D] -> attention output, same shape."""
    mask = np.zeros((1, length), np.float32)
    mask[:, length * 3 // 4 :] = np.finfo(np.float32).min

    def block(c: Chain, x: str, i: int) -> str:
        k = c.randn((1, 1, length, dim), np.float32, 0.05)
        v = c.randn((1, 1, length, dim), np.float32)
        bias = c.init(mask.reshape(1, 1, 1, length) if variant == "einsum" else mask, "mask")
        if variant == "einsum":
            scores = c.node("Einsum", [x, k], equation="bsnd,bkld->bsnl")
            probs = c.node("Softmax", [c.node("Add", [scores, bias])], axis=-1)
            return c.node("MatMul", [probs, v])
        q2 = c.node("Reshape", [x, c.init(np.array([heads, dim], np.int64), "shape")])
        k2 = c.node("Reshape", [k, c.init(np.array([length, dim], np.int64), "shape")])
        v2 = c.node("Reshape", [v, c.init(np.array([length, dim], np.int64), "shape")])
        if variant.startswith("gemm"):
            scores = c.node("Gemm", [q2, k2, bias], transB=1)
        else:  # matmul_t: (K q^T)^T
            kq = c.node("MatMul", [k2, c.node("Transpose", [q2], perm=[1, 0])])
            scores = c.node("Add", [c.node("Transpose", [kq], perm=[1, 0]), bias])
        probs = c.node("Softmax", [scores], axis=-1)
        if variant.startswith("gemm_splitpv"):  # P @ V as G partial products over T, summed
            groups = int(variant[len("gemm_splitpv") :])
            shape = np.array([heads, groups, length // groups], np.int64)
            parts = c.node("Transpose", [c.node("Reshape", [probs, c.init(shape)])], perm=[1, 0, 2])
            v3 = c.node("Reshape", [v2, c.init(np.array([groups, -1, dim], np.int64))])
            partial = c.node("MatMul", [parts, v3])  # [G, N, D]
            out = c.node("ReduceSum", [partial, c.init(np.array([0], np.int64))], keepdims=0)
        elif variant.startswith("gemm_bcastpv"):  # the same, P's rows broadcast (no Transpose)
            groups = int(variant[len("gemm_bcastpv") :])
            shape = np.array([heads, groups, 1, length // groups], np.int64)
            parts = c.node("Reshape", [probs, c.init(shape)])
            v3 = c.node("Reshape", [v2, c.init(np.array([groups, -1, dim], np.int64))])
            partial = c.node("MatMul", [parts, v3])  # [N, G, 1, D]
            out = c.node("ReduceSum", [partial, c.init(np.array([1, 2], np.int64))], keepdims=0)
        elif variant == "gemm_headpv":  # any T: each head's row its own batch entry
            rows = c.node("Reshape", [probs, c.init(np.array([heads, 1, length], np.int64))])
            v3 = c.node("Reshape", [v2, c.init(np.array([1, length, dim], np.int64))])
            out = c.node("MatMul", [rows, v3])  # [N, 1, D], V broadcast over the heads
        elif variant.startswith("gemm_chunkpv"):  # G chunks of T (any T), G MatMuls, Adds
            groups = int(variant[len("gemm_chunkpv") :])
            names = [c.name("chunk") for _ in range(groups)]
            c.nodes.append(helper.make_node("Split", [probs], names, axis=-1, num_outputs=groups))
            rows = [c.name("rows") for _ in range(groups)]
            c.nodes.append(helper.make_node("Split", [v2], rows, axis=0, num_outputs=groups))
            products = [c.node("MatMul", [a, b]) for a, b in zip(names, rows, strict=True)]
            out = products[0]
            for product in products[1:]:  # Add: the WebGPU EP has no Sum kernel
                out = c.node("Add", [out, product])
        else:
            out = c.node("Gemm" if variant == "gemm_pv" else "MatMul", [probs, v2])
        return c.node("Reshape", [out, c.init(np.array([1, 1, heads, dim], np.int64), "shape")])

    return block


CONTEXT = 131072  # E2B's context length: the convolution towers reach this far back


def positions(variant: str) -> Block:
    """x [1, L] (a row of a KV buffer) -> its slots' positions 0..L-1 [1, L], float32."""
    levels = width = 1
    if variant.startswith("conv"):
        width = int(variant[4:])
        while width**levels < CONTEXT:
            levels += 1

    def block(c: Chain, x: str, i: int) -> str:
        one = c.init(np.array(1.0, np.float32), "one")
        ones = c.node("Where", [c.node("Equal", [x, x]), one, one])
        if variant == "ones":
            return ones
        if variant == "cumsum":
            summed = c.node("CumSum", [ones, c.init(np.array(1, np.int32), "axis")])
            return c.node("Sub", [summed, one])
        value = c.node("Reshape", [ones, c.init(np.array([0, 1, -1], np.int64), "shape")])
        kernel = c.init(np.ones((1, 1, width), np.float32), "k")
        for level in range(levels):
            step = width**level
            inputs = [value, kernel]
            if level == levels - 1:
                inputs.append(c.init(np.array([-1.0], np.float32), "bias"))
            value = c.node("Conv", inputs, dilations=[step], pads=[step * (width - 1), 0],
                           kernel_shape=[width])  # fmt: skip
        return c.node("Reshape", [value, c.init(np.array([0, -1], np.int64), "shape")])

    return block


def nbits(c: Chain, x: str, k: int, n: int, dtype: int, quant: dict[str, int]) -> str:
    """MatMulNBits ``x [1, 1, K] -> [1, 1, N]`` over random blocks."""
    bits, block_size = quant["bits"], quant.get("block_size", 32)
    blocks = (k + block_size - 1) // block_size
    packed = c.init(c.rng.integers(0, 256, (n, blocks, block_size * bits // 8), np.uint8))
    scales = c.init((0.01 * c.rng.random(n * blocks)).astype(NP[dtype]), "s")
    return c.node(
        "MatMulNBits",
        [x, packed, scales],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block_size,
        accuracy_level=quant.get("accuracy_level", 0),
    )


def mlp(variant: str, hidden: int, inner: int, dtype: int, **quant: int) -> Block:
    """x [1, 1, H] -> [1, 1, F] -> [1, 1, H] (no activation between: the cost is the two
    projections)."""

    def linear(c: Chain, x: str, k: int, n: int) -> str:
        if variant == "mmnb":
            return nbits(c, x, k, n, dtype, quant)
        if variant == "gemm_t":  # weight stored [N, K]
            flat = c.node("Reshape", [x, c.init(np.array([1, k], np.int64), "shape")])
            y = c.node("Gemm", [flat, c.randn((n, k), NP[dtype], k**-0.5)], transB=1)
            return c.node("Reshape", [y, c.init(np.array([1, 1, n], np.int64), "shape")])
        if variant.startswith("splitk"):  # K in G chunks: a batched MatMul, then their sum
            # "splitkG" splits both projections in G, "splitkAxB" the first in A, the second in B
            counts = [int(g) for g in variant[len("splitk") :].split("x")]
            groups = counts[0] if k == hidden or len(counts) == 1 else counts[1]
            parts = c.node("Reshape", [x, c.init(np.array([groups, 1, k // groups], np.int64))])
            w = c.randn((groups, k // groups, n), NP[dtype], k**-0.5)
            partial = c.node("MatMul", [parts, w])  # [G, 1, N]
            return c.node("ReduceSum", [partial, c.init(np.array([0], np.int64))], keepdims=1)
        if variant == "matmul2d":
            flat = c.node("Reshape", [x, c.init(np.array([1, k], np.int64), "shape")])
            y = c.node("MatMul", [flat, c.randn((k, n), NP[dtype], k**-0.5)])
            return c.node("Reshape", [y, c.init(np.array([1, 1, n], np.int64), "shape")])
        return c.node("MatMul", [x, c.randn((k, n), NP[dtype], k**-0.5)])

    def block(c: Chain, x: str, i: int) -> str:
        return linear(c, linear(c, x, hidden, inner), inner, hidden)

    return block


def head(hidden: int, vocab: int, dtype: int, **quant: int) -> Block:
    """The LM head as the decoder has it: MatMul(table [V, H], x^T) -> [1, V, 1] for a
    float table, MatMulNBits for a quantized one; the first H logits go on as the next
    block's input (a Slice)."""

    def block(c: Chain, x: str, i: int) -> str:
        if quant:
            logits = nbits(c, x, hidden, vocab, dtype, quant)
        else:
            xt = c.node("Transpose", [x], perm=[0, 2, 1])
            logits = c.node("MatMul", [c.randn((vocab, hidden), NP[dtype], hidden**-0.5), xt])
        flat = c.node("Reshape", [logits, c.init(np.array([1, 1, vocab], np.int64))])
        starts, ends = c.init(np.array([0], np.int64)), c.init(np.array([hidden], np.int64))
        return c.node("Slice", [flat, starts, ends, c.init(np.array([2], np.int64))])

    return block


# ------------------------------------------------------------------------------------ main


def cases(tiny: bool) -> dict[str, tuple[Block, np.ndarray, int]]:
    hidden, inner = (64, 256) if tiny else (1536, 12288)
    lengths = [(64, 16), (256, 32)] if tiny else [(512, 256), (4096, 256), (4096, 512)]
    rng = np.random.default_rng(0)
    out: dict[str, tuple[Block, np.ndarray, int]] = {}
    for name, dtype in (("fp16", F16), ("fp32", F32)):
        x = rng.standard_normal((1, 1, hidden)).astype(NP[dtype])
        out[f"elementwise/Add/{name}"] = (elementwise(dtype), x, dtype)
        out[f"rmsnorm/{name}"] = (rmsnorm(dtype, hidden), x, dtype)
    for length, dim in lengths:
        q = rng.standard_normal((1, 1, 8, dim)).astype(np.float32)
        splits = (2, 4, 8) if length <= 512 else (4, 8, 16, 32)
        variants = ["einsum", "gemm", "gemm_pv", "matmul_t", "gemm_headpv"]
        variants += [f"gemm_splitpv{g}" for g in splits] + [f"gemm_bcastpv{g}" for g in splits]
        variants += [f"gemm_chunkpv{g}" for g in (2, 4, 7)]
        for variant in variants:
            out[f"attention/{variant}@{length},{dim}"] = (
                attention(variant, 8, length, dim),
                q,
                F32,
            )
    for length in (64, 256) if tiny else (192, 4096):
        x = rng.standard_normal((1, length)).astype(np.float32)
        for variant in ("ones", "cumsum", "conv16", "conv64", "conv256"):
            out[f"positions/{variant}@{length}"] = (positions(variant), x, F32)
    for name, dtype in (("fp16", F16), ("fp32", F32)):
        x = rng.standard_normal((1, 1, hidden)).astype(NP[dtype])
        for block_size, level in ((32, 0), (32, 4), (64, 0), (128, 0), (128, 4)):
            if name == "fp32" and block_size != 32:
                continue
            label = f"mlp/mmnb4/b{block_size}/acc{level}/{name}"
            block = mlp("mmnb", hidden, inner, dtype, bits=4, block_size=block_size,
                        accuracy_level=level)  # fmt: skip
            out[label] = (block, x, dtype)
        out[f"mlp/matmul/{name}"] = (mlp("matmul", hidden, inner, dtype), x, dtype)
        for variant in ("matmul2d", "gemm_t", "splitk4", "splitk8", "splitk16"):
            out[f"mlp/{variant}/{name}"] = (mlp(variant, hidden, inner, dtype), x, dtype)
        if name == "fp16":  # each projection's own best split: up (K = H), down (K = F)
            for pair in ("2x4", "4x8", "4x16", "4x32", "8x4", "2x16"):
                label = f"pair/splitk{pair}/{hidden}x{inner}/{name}"
                out[label] = (mlp(f"splitk{pair}", hidden, inner, dtype), x, dtype)
            for pair in ("1x4", "2x2", "4x4", "4x8", "8x8", "2x8"):
                width = 128 if tiny else 2048
                label = f"pair/splitk{pair}/{hidden}x{width}/{name}"
                out[label] = (mlp(f"splitk{pair}", hidden, width, dtype), x, dtype)
        if name == "fp16" or tiny:  # fp32: its chain of 3 heads passes protobuf's 2 GiB
            out[f"head/{name}"] = (head(hidden, 4096 if tiny else 131072, dtype), x, dtype)
    # E2B's quantized projections (K -> N -> K pairs) and LM head at both accuracy levels.
    x = rng.standard_normal((1, 1, hidden)).astype(np.float16)
    widths = (32, 128) if tiny else (256, 2048, 2560, 6144)
    for level in (0, 4):
        quant = dict(bits=4, block_size=32, accuracy_level=level)
        for width in widths:
            block = mlp("mmnb", hidden, width, F16, **quant)
            out[f"proj/mmnb4/{hidden}x{width}/acc{level}"] = (block, x, F16)
        vocab = 4096 if tiny else 262144
        out[f"head/mmnb4/{vocab}/acc{level}"] = (head(hidden, vocab, F16, **quant), x, F16)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy widths (lavapipe, tests)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument(
        "--capture",
        type=int,
        choices=(0, 1),
        default=1,
        help="0: plain runs, each kernel dispatched by the host (what capture saves)",
    )
    args = parser.parse_args()
    import onnxruntime as ort

    report: dict[str, Any] = {
        "benchmark": "webgpu_ops",
        "onnxruntime": ort.__version__,
        "repeats": args.repeats,
        "replays": args.replays,
        "capture": bool(args.capture),
        "runtime": webgpu_ort.runtime(),
        "tiny": args.tiny,
        "cases": {},
    }
    for name, (block, x, dtype) in cases(args.tiny).items():
        if args.only and args.only not in name:
            continue
        repeats = args.repeats
        if name.startswith(("mlp/", "head/", "pair/")):
            repeats = min(repeats, 3 if name.startswith("head/") else 5)
        report["cases"][name] = run_case(
            name, measure, block, x, dtype, repeats, args.replays, bool(args.capture)
        )
    print(json.dumps(report, indent=1))


def run_case(name: str, measure_case: Callable[..., dict], *args: Any) -> dict[str, Any]:
    """``measure_case(*args)`` (its error's first line if it fails), with its seconds; logged."""
    started = time.perf_counter()
    try:
        result = measure_case(*args)
    except Exception as exc:
        result = {"error": str(exc).splitlines()[0][:300]}
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(name, result, file=sys.stderr, flush=True)
    return result


if __name__ == "__main__":
    main()
