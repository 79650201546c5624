"""What one INT4 projection costs on the CUDA EP under CUDA graphs: MatMulNBits at E2B's
decode shapes (M = 1) in the forms a decoder could use, side by side in one run.

MatMulNBits' M = 1 kernel was ~45% of an E2B INT4 decode step on an H100
(``results/cuda_profile-2026-12-06c-*-step-4096.json``), at 0.5-1.2 TB/s where the card
reads ~3: it gives one warp per output column (``ceil(N / 8)`` blocks of 8 warps), so a
1,536-wide output runs 192 blocks over 132 SMs, each warp walking all of K. The cases:

* ``pair/<form>/HxF``: H -> F -> H projections (E2B: H = 1,536; F = 2,048, 6,144, 12,288),
  fp16 activations, as MatMulNBits with block 128 without zero points (what ``--symmetric
  --block-size 128`` packages hold), with zero points, at blocks 32 and 64; ``splitkG``:
  K cut in G parts run as one MatMulNBits of M = G rows over a [G * N, K / G] weight (the
  same bytes), whose block diagonal is the product (a Mul by the identity and a
  ReduceSum): G times the warps, each walking K / G; ``fp16``: a plain fp16 MatMul over
  W [K, N]; ``fp16t``: FusedMatMul(x, W, transB=1) over the checkpoint's W [N, K];
  ``fp16g``: Gemm(transB=1) over x as [1, K]. On an H100 the three fp16 forms cost the same
  (22.6 us at F = 6,144, about 1.7 TB/s: ``results/cuda_ops-2026-12-07-h100-fp16-transb-
  forms.json``), and an fp16 E2B package with FusedMatMul linears decoded no faster
  (``results/cuda_profile-2026-12-07-*``), so the packages keep MatMul.
* ``head/<form>``: the tied LM head (262,144 x 1,536) with and without zero points.
* ``attention/<model>/<form>/<length>`` (``--only attention``): one decode step of the
  explicit fp32 attention of the 512-wide full layers, E2B's (one KV head, 8 query heads)
  and E4B's (two, 4 each), over 1,032 and 4,096 slots, TF32 off as the packages run it:
  ``transb``, FusedMatMul(q, K as stored, transB=1), then P @ V in fp32 (the packages);
  ``pv16``: P rounded to fp16 times V as a half cache stores it (``pv16x``: one MatMul
  per KV head).
  The slow GEMM of an E4B decode step is its P @ V, not the scores: in the package
  profile (``results/cuda_profile-2026-12-07b-h100-e4b-scores-transb-before-after.json``)
  cuBLAS' ``gemmSN_NN`` ran [1, 2, 4, 4096] @ [1, 2, 4096, 512] on 16 blocks (grid [8, 1,
  2], 512 output columns), 104 us each, 7 a token, 11% of the step; the scores took 8.9 us
  (``gemmSN_TN``, grid [512, 1, 2]). E2B's P @ V (one batch of 8 rows) gets cutlass'
  split-K SIMT GEMM on 128 blocks, 8.3 us. K transposed in memory (``kt``) or in the GEMM
  (``transb``) cost the same here (H100, TF32 at its default, on:
  ``results/cuda_ops-2026-12-07-h100-attention-kt-vs-transb-tf32-default.json``, 39.4 us
  for E4B's whole step at 4,096, where TF32 hides the P @ V kernel the packages get). The
  ``pv16`` forms are not run on a GPU yet.

Each case is a chain of R copies of a block (weights distinct per copy, so nothing stays
in cache), bound to device buffers and replayed as a CUDA graph; a block's cost is
``(t(R) - t(1)) / (R - 1)``.

    python3 benchmarks/device/cuda_ops.py [--only pair] [--repeats 5]

Needs onnxruntime-gpu (e.g. ``PYTHONPATH=/tmp/site_cuda``, as cuda_profile.py sets up);
prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from onnx import TensorProto, helper
from webgpu_ops import Block, Chain, _model, run_case

F16 = TensorProto.FLOAT16
HIDDEN, VOCAB = 1536, 262144


def nbits(c: Chain, x: str, k: int, n: int, block_size: int, zero_points: bool) -> str:
    """MatMulNBits ``x [..., K] -> [..., N]``, 4-bit random blocks."""
    blocks = (k + block_size - 1) // block_size
    packed = c.init(c.rng.integers(0, 256, (n, blocks, block_size // 2), np.uint8))
    scales = c.init((0.01 * c.rng.random(n * blocks)).astype(np.float16), "s")
    inputs = [x, packed, scales]
    if zero_points:
        inputs.append(c.init(c.rng.integers(0, 256, n * ((blocks + 1) // 2), np.uint8), "z"))
    return c.node(
        "MatMulNBits", inputs, domain="com.microsoft", K=k, N=n, bits=4, block_size=block_size
    )


def linear(c: Chain, x: str, k: int, n: int, form: str) -> str:
    if form.startswith("fp16"):  # the same draw of W [K, N] in each fp16 form
        w = (k**-0.5 * c.rng.standard_normal((k, n))).astype(np.float16)
        if form == "fp16":
            return c.node("MatMul", [x, c.init(w)])
        if form == "fp16t":  # the checkpoint's [N, K] layout, FusedMatMul transB
            weight = c.init(np.ascontiguousarray(w.T))
            return c.node("FusedMatMul", [x, weight], domain="com.microsoft", transB=1)
        assert form == "fp16g"  # Gemm transB over [1, K] rows
        rows = c.node("Reshape", [x, c.init(np.array([-1, k], np.int64))])
        out = c.node("Gemm", [rows, c.init(np.ascontiguousarray(w.T))], transB=1)
        return c.node("Reshape", [out, c.init(np.array([1, 1, n], np.int64))])
    if form.startswith("splitk"):  # [1, 1, K] -> [G, K / G] rows -> [G, G * N] -> diagonal
        groups = int(form[len("splitk") :])
        rows = c.node("Reshape", [x, c.init(np.array([groups, k // groups], np.int64))])
        every = nbits(c, rows, k // groups, groups * n, 128, False)  # [G, G * N]
        cube = c.node("Reshape", [every, c.init(np.array([groups, groups, n], np.int64))])
        eye = np.eye(groups, dtype=np.float16)[:, :, None]
        diagonal = c.node("Mul", [cube, c.init(eye, "eye")])
        summed = c.node("ReduceSum", [diagonal, c.init(np.array([0, 1], np.int64))], keepdims=0)
        return c.node("Reshape", [summed, c.init(np.array([1, 1, n], np.int64))])
    block_size = int(form.split("-")[0][1:])  # "b128", "b128-zp"
    return nbits(c, x, k, n, block_size, form.endswith("-zp"))


def pair(form: str, inner: int) -> Block:
    def block(c: Chain, x: str, i: int) -> str:
        return linear(c, linear(c, x, HIDDEN, inner, form), inner, HIDDEN, form)

    return block


def head(form: str) -> Block:
    """The LM head, then its first H logits as the next block's input."""

    def block(c: Chain, x: str, i: int) -> str:
        logits = linear(c, x, HIDDEN, VOCAB, form)
        starts, ends = c.init(np.array([0], np.int64)), c.init(np.array([HIDDEN], np.int64))
        return c.node("Slice", [logits, starts, ends, c.init(np.array([2], np.int64))])

    return block


PAIR_FORMS = ("b128", "b128-zp", "b64", "b32", "splitk2", "splitk4", "fp16", "fp16t", "fp16g")


def cases() -> dict[str, Block]:
    out: dict[str, Block] = {}
    for inner in (2048, 6144, 12288):
        for form in PAIR_FORMS:
            out[f"pair/{form}/{HIDDEN}x{inner}"] = pair(form, inner)
    for form in ("b128", "b128-zp", "b32"):
        out[f"head/{form}"] = head(form)
    return out


ATTENTION = {"e2b": (1, 8), "e4b": (2, 4)}
"""Explicit full-layer attention at decode: KV heads, query heads per KV head (D = 512)."""


def attention(form: str, kv: int, group: int, length: int) -> Block:
    """One decode step of the CUDA packages' explicit fp32 attention over a ``length``-slot
    buffer: q [1, kv, G, D] -> scores -> softmax -> @ V [1, kv, T, D] -> [1, kv, G, D].
    ``kt``: K transposed in memory, MatMul (the packages before December 7c); ``transb``:
    FusedMatMul(q, K as stored, transB=1); ``pv16``: ``transb``, then P rounded to fp16
    times V stored in fp16 (``pv16x``, several KV heads: one MatMul per head)."""

    def block(c: Chain, x: str, i: int) -> str:
        keys = (c.rng.standard_normal((1, kv, length, 512)) / 512**0.5).astype(np.float32)
        value_dtype = np.float16 if form.startswith("pv16") else np.float32
        values = c.randn((1, kv, length, 512), value_dtype)
        if form == "kt":
            scores = c.node("MatMul", [x, c.init(np.ascontiguousarray(keys.transpose(0, 1, 3, 2)))])
        else:
            scores = c.node("FusedMatMul", [x, c.init(keys)], domain="com.microsoft", transB=1)
        probs = c.node("Softmax", [scores], axis=-1)
        if not form.startswith("pv16"):
            return c.node("MatMul", [probs, values])
        half = c.node("Cast", [probs], to=F16)
        if form == "pv16":
            out = c.node("MatMul", [half, values])
        else:
            sizes = c.init(np.array([1] * kv, np.int64))
            ps = [f"{half}_p{h}" for h in range(kv)]
            vs = [f"{values}_v{h}" for h in range(kv)]
            c.nodes.append(helper.make_node("Split", [half, sizes], ps, axis=1))
            c.nodes.append(helper.make_node("Split", [values, sizes], vs, axis=1))
            parts = [c.node("MatMul", [p, v]) for p, v in zip(ps, vs, strict=True)]
            out = c.node("Concat", parts, axis=1)
        return c.node("Cast", [out], to=TensorProto.FLOAT)

    return block


def _replay_seconds(model: bytes, x: np.ndarray, replays: int, tf32: bool = True) -> float:
    """Seconds per replay of ``model``'s CUDA graph, input and output on the device
    (``tf32``: off as the packages set it, for fp32 GEMMs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    cuda = {"enable_cuda_graph": "1", "use_tf32": "1" if tf32 else "0"}
    providers = [("CUDAExecutionProvider", cuda)]
    session = ort.InferenceSession(model, options, providers=providers)
    x_dev = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    y_dev = ort.OrtValue.ortvalue_from_numpy(np.zeros_like(x), "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", x_dev)
    binding.bind_ortvalue_output("y", y_dev)
    for _ in range(3):  # the first runs capture
        session.run_with_iobinding(binding)
    y_dev.numpy()
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(replays):
            session.run_with_iobinding(binding)
        y_dev.numpy()  # waits for the stream
        runs.append((time.perf_counter() - started) / replays)
    return statistics.median(runs)


def measure(
    block: Block, repeats: int, replays: int, x: np.ndarray | None = None, tf32: bool = True
) -> dict[str, float]:
    """A block's cost from chains of 1 and ``repeats`` copies; ``x``: the chain's input
    (default E2B's hidden row in fp16; the attention cases' q in fp32)."""
    if x is None:
        x = np.random.default_rng(0).standard_normal((1, 1, HIDDEN)).astype(np.float16)
    dtype = F16 if x.dtype == np.float16 else TensorProto.FLOAT
    times = {}
    for r in (1, repeats):
        model = _model(block, r, list(x.shape), dtype, seed=r)
        times[r] = _replay_seconds(model, x, replays, tf32)
    return {
        "us_per_block": round(1e6 * (times[repeats] - times[1]) / (repeats - 1), 2),
        "us_chain_1": round(1e6 * times[1], 2),
        f"us_chain_{repeats}": round(1e6 * times[repeats], 2),
    }


def check_splitk() -> float:
    """Largest |difference| between ``splitk4`` and one MatMulNBits over the same weight,
    on the CPU EP (the identity the split relies on)."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    k, n, groups = 512, 256, 4
    packed = rng.integers(0, 256, (n, k // 128, 64), np.uint8)
    scales = (0.01 * rng.random(n * (k // 128))).astype(np.float16)
    # the split weight: rows g * N + j hold row j's K-slice g (blocks g * K/G/128 ...)
    per = k // groups // 128
    split_packed = np.concatenate([packed[:, g * per : (g + 1) * per] for g in range(groups)])
    split_scales = np.concatenate(
        [scales.reshape(n, -1)[:, g * per : (g + 1) * per].reshape(-1) for g in range(groups)]
    )
    x = rng.standard_normal((1, 1, k)).astype(np.float16)
    results = []
    for form, (w, s) in (("one", (packed, scales)), ("split", (split_packed, split_scales))):
        c = Chain(rng)
        weight, scale = c.init(w), c.init(s)
        attrs = {"bits": 4, "block_size": 128, "domain": "com.microsoft"}
        if form == "one":
            y = c.node("MatMulNBits", ["x", weight, scale], K=k, N=n, **attrs)
        else:
            rows = c.node("Reshape", ["x", c.init(np.array([groups, k // groups], np.int64))])
            split = {"K": k // groups, "N": groups * n}
            every = c.node("MatMulNBits", [rows, weight, scale], **split, **attrs)
            cube = c.node("Reshape", [every, c.init(np.array([groups, groups, n], np.int64))])
            diagonal = c.node("Mul", [cube, c.init(np.eye(groups, dtype=np.float16)[:, :, None])])
            axes = c.init(np.array([0, 1], np.int64))
            summed = c.node("ReduceSum", [diagonal, axes], keepdims=0)
            y = c.node("Reshape", [summed, c.init(np.array([1, 1, n], np.int64))])
        c.nodes.append(helper.make_node("Identity", [y], ["y"]))
        graph = helper.make_graph(
            c.nodes,
            "check",
            [helper.make_tensor_value_info("x", F16, [1, 1, k])],
            [helper.make_tensor_value_info("y", F16, [1, 1, n])],
            initializer=c.inits,
        )
        opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        results.append(session.run(None, {"x": x})[0].astype(np.float32))
    return float(np.abs(results[0] - results[1]).max() / np.abs(results[0]).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--check", action="store_true", help="only the CPU identity check")
    args = parser.parse_args()
    import onnxruntime as ort

    report: dict[str, Any] = {
        "benchmark": "cuda_ops",
        "onnxruntime": ort.__version__,
        "splitk4_relative_error_cpu": check_splitk(),
        "repeats": args.repeats,
        "replays": args.replays,
        "cases": {},
    }
    if not args.check and "attention" in args.only:  # attention/<model>/<form>/<length>
        for model, (kv, group) in ATTENTION.items():
            for length in (1032, 4096):
                for form in ("transb", "pv16", "pv16x")[: 3 if kv > 1 else 2]:
                    name = f"attention/{model}/{form}/{length}"
                    q = np.random.default_rng(0).standard_normal((1, kv, group, 512))
                    report["cases"][name] = run_case(
                        name,
                        measure,
                        attention(form, kv, group, length),
                        args.repeats,
                        args.replays,
                        q.astype(np.float32),
                        False,  # TF32 off, as the packages run
                    )
    elif not args.check:
        for name, block in cases().items():
            if args.only and args.only not in name:
                continue
            repeats = 3 if name.startswith("head/") else args.repeats
            report["cases"][name] = run_case(name, measure, block, repeats, args.replays)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
