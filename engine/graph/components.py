"""Graph components shared by model families: norms, linears, embeddings, the LM head.

Each component reads its weight's storage from the plan (float, MatMulNBits,
GatherBlockQuantized, split pieces) and the EP's flags from the context; none branches
on an EP's name.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.dtypes import ir_dtype
from engine.graph.context import BuildContext
from engine.plan_model import WeightPlan


def rms_norm(
    ctx: BuildContext,
    x: ir.Value,
    weight: str | None,
    width: int,
    eps: float | None = None,
    *,
    dtype: str | None = None,
    zeros: ir.Value | None = None,
) -> ir.Value:
    """RMSNorm over the last axis (``weight=None``: no scale, as Gemma 4's value norm);
    ``eps`` defaults to the text model's; ``dtype`` is the float dtype of ``x`` and the
    scale when it is not the package's (an fp32 attention core). ``zeros``: a zero tensor
    of ``x``'s shape (:func:`zero_rows`, which makes one only where the EP's Skip kernel is
    its faster norm): the norm is then ``Skip(x, zeros)``."""
    eps = ctx.spec.rms_norm_eps if eps is None else eps
    compute = ir_dtype(dtype) if dtype is not None else ctx.dtype
    scale = _norm_scale(ctx, weight, width, compute)
    if zeros is not None and dtype is None:
        return ctx.ms.SkipSimplifiedLayerNormalization(x, zeros, scale, epsilon=eps)
    if ctx.caps.rms_norm_op == "RMSNormalization":
        return ctx.op.RMSNormalization(x, scale, axis=-1, epsilon=eps, stash_type=1)
    if ctx.caps.rms_norm_op == "SimplifiedLayerNormalization":
        return ctx.op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=eps, stash_type=1)
    xf = ctx.op.Cast(x, to=ir.DataType.FLOAT) if compute != ir.DataType.FLOAT else x
    mean_sq = ctx.op.ReduceMean(ctx.op.Mul(xf, xf), ctx.ints([-1]), keepdims=1)
    inv = ctx.op.Pow(ctx.op.Add(mean_sq, np.float32(eps)), np.float32(-0.5))
    normed = ctx.op.Mul(xf, inv)
    if compute != ir.DataType.FLOAT:
        normed = ctx.op.Cast(normed, to=compute)
    return ctx.op.Mul(normed, scale)


def skip_rms_norm(
    ctx: BuildContext,
    x: ir.Value,
    skip: ir.Value,
    weight: str,
    width: int,
    eps: float | None = None,
) -> tuple[ir.Value, ir.Value]:
    """``(norm(x + skip), x + skip)``, fused where the EP has SkipSimplifiedLayerNormalization;
    ``eps`` defaults to the text model's."""
    eps = ctx.spec.rms_norm_eps if eps is None else eps
    if ctx.caps.supports("SkipSimplifiedLayerNormalization"):
        outputs = ctx.ms.SkipSimplifiedLayerNormalization(
            x, skip, _norm_scale(ctx, weight, width), epsilon=eps, _outputs=4
        )
        return outputs[0], outputs[3]
    total = ctx.op.Add(x, skip)
    return rms_norm(ctx, total, weight, width, eps=eps), total


def skip_norms(ctx: BuildContext) -> bool:
    """Whether norms take a zero skip here (``EpCapabilities.skip_kernel_norms``)."""
    return ctx.caps.skip_kernel_norms and ctx.caps.supports("SkipSimplifiedLayerNormalization")


def zero_rows(ctx: BuildContext, like: ir.Value) -> ir.Value | None:
    """Zeros of ``like``'s shape in the activation dtype, for :func:`rms_norm`'s ``zeros``
    (one per shape: the layers share it); None where the EP norms without a skip."""
    if not skip_norms(ctx):
        return None
    zero = ir.tensor(np.zeros(1, dtype=ctx.np_dtype))
    return ctx.op.ConstantOfShape(ctx.op.Shape(like), value=zero)


def _norm_scale(
    ctx: BuildContext, weight: str | None, width: int, dtype: ir.DataType | None = None
) -> ir.Value:
    if weight is None:
        dtype = dtype or ctx.dtype
        ones = np.ones(width, dtype=dtype.numpy())
        return ctx.const(ones, name=f"ones_{width}_{dtype.name.lower()}")
    return ctx.param(weight)


def linear(ctx: BuildContext, x: ir.Value, weight: str) -> ir.Value:
    """``x @ W.T`` for a checkpoint weight W [out, in], float or MatMulNBits."""
    wp = ctx.weight(weight)
    assert len(wp.pieces) == 1, f"{weight}: split linears are not supported here"
    return _matmul_piece(ctx, x, wp, 0)


def _matmul_piece(ctx: BuildContext, x: ir.Value, wp: WeightPlan, index: int) -> ir.Value:
    piece = wp.pieces[index]
    parts = ctx.parts(wp, piece)
    if wp.storage == "float_t":
        weight = parts["weight"]
        if wp.k_slices > 1:  # planned as [G, 1, K / G, N]
            groups, _, depth, _ = piece.tensors[0].shape
            return _split_k_matmul(ctx, x, weight, groups, depth)
        return ctx.op.MatMul(x, weight)
    assert wp.storage == "matmulnbits" and wp.bits is not None and wp.block_size is not None
    rows, cols = _piece_shape(wp, index)
    qweight = parts["qweight"]
    if qweight.shape is not None and len(qweight.shape) == 2:
        # Bytes shared with a GatherBlockQuantized table: view them as MatMulNBits blocks.
        qweight = ctx.op.Reshape(
            qweight, ctx.ints([rows, cols // wp.block_size, wp.block_size * wp.bits // 8])
        )
    inputs = [x, qweight, parts["scales"]]
    # A symmetric table shared with GatherBlockQuantized keeps its zero points (all the
    # implicit 2**(bits-1)) for the gather; MatMulNBits takes that value by default and runs
    # its kernel without zero points (onnxruntime CUDA: E2B's LM head 128 -> 115 us).
    if "zero_points" in parts and not wp.symmetric:
        inputs.append(parts["zero_points"])
    return ctx.ms.MatMulNBits(
        *inputs,
        K=cols,
        N=rows,
        bits=wp.bits,
        block_size=wp.block_size,
        accuracy_level=ctx.options.accuracy_level or 0,
    )


def _split_k_matmul(
    ctx: BuildContext, x: ir.Value, weight: ir.Value, groups: int, depth: int
) -> ir.Value:
    """``x [B, S, K] @ W`` for W stored [G, 1, K / G, N] (:func:`engine.plan.split_k_groups`):
    x as [G, B, S, K / G], one batched MatMul, the G partial products summed."""
    op = ctx.op
    slices = op.Transpose(op.Reshape(x, ctx.ints([0, 0, groups, depth])), perm=[2, 0, 1, 3])
    return op.ReduceSum(op.MatMul(slices, weight), ctx.ints([0]), keepdims=0)  # [B, S, N]


def _piece_shape(wp: WeightPlan, index: int) -> tuple[int, int]:
    piece = wp.pieces[index]
    shape = list(wp.weight.shape)
    shape[piece.axis] = piece.stop - piece.start
    return shape[0], shape[1]


def gather_rows(ctx: BuildContext, wp: WeightPlan, ids: ir.Value, index: int) -> ir.Value:
    """Rows ``ids`` of one piece of an embedding table, dequantized, unscaled."""
    parts = ctx.parts(wp, wp.pieces[index])
    if wp.storage == "float":
        return ctx.op.Gather(parts["weight"], ids, axis=0)
    assert wp.storage == "gbq"
    return ctx.ms.GatherBlockQuantized(
        parts["qweight"],
        ids,
        parts["scales"],
        parts["zero_points"],
        gather_axis=0,
        quantize_axis=1,
        block_size=wp.block_size,
        bits=wp.bits,
    )


def scale_rows(ctx: BuildContext, rows: ir.Value, wp: WeightPlan) -> ir.Value:
    """Multiply looked-up rows by the table's constant scale (rounded to the activation
    dtype first, as transformers does)."""
    if wp.weight.scale is None:
        return rows
    return ctx.op.Mul(rows, ctx.scalar(wp.weight.scale))


def embedding(ctx: BuildContext, ids: ir.Value, weight: str) -> ir.Value:
    """Scaled embedding lookup; pieces split along the hidden axis are concatenated."""
    wp = ctx.weight(weight)
    rows = [gather_rows(ctx, wp, ids, i) for i in range(len(wp.pieces))]
    out = rows[0] if len(rows) == 1 else ctx.op.Concat(*rows, axis=-1)
    return scale_rows(ctx, out, wp)


def lm_head(ctx: BuildContext, x: ir.Value) -> ir.Value:
    """Logits [B, S, V] from hidden states [B, S, H], for every storage the plan allows."""
    wp = ctx.weight("lm_head.weight")
    owner = ctx.weight(wp.shares) if wp.shares else wp
    count = len(wp.pieces)
    if wp.storage == "matmulnbits":
        view = _as_matmul(owner, wp)
        if count == 1:
            return _matmul_piece(ctx, x, view, 0)
        if wp.split_axis == 1:
            chunks = ctx.op.Split(x, axis=-1, num_outputs=count, _outputs=count)
            partial = [_matmul_piece(ctx, chunks[i], view, i) for i in range(count)]
            return _sum(ctx, partial)
        return ctx.op.Concat(*[_matmul_piece(ctx, x, view, i) for i in range(count)], axis=-1)
    # Float table [V, H]: W @ x^T keeps the table in its embedding layout (a tied head
    # stores it once) and needs no Shape, so it stays graph-capture safe.
    xt = ctx.op.Transpose(x, perm=[0, 2, 1])
    tables = [ctx.parts(owner, p)["weight"] for p in owner.pieces]
    if count == 1:
        logits_t = ctx.op.MatMul(tables[0], xt)
    elif wp.split_axis == 1:
        chunks = ctx.op.Split(xt, axis=1, num_outputs=count, _outputs=count)
        logits_t = _sum(ctx, [ctx.op.MatMul(tables[i], chunks[i]) for i in range(count)])
    else:
        logits_t = ctx.op.Concat(*[ctx.op.MatMul(t, xt) for t in tables], axis=1)
    return ctx.op.Transpose(logits_t, perm=[0, 2, 1])


def _as_matmul(owner: WeightPlan, head: WeightPlan) -> WeightPlan:
    """The head's plan with the owner's pieces, so initializers resolve to the owner's."""
    from dataclasses import replace

    return replace(owner, storage=head.storage)


def _sum(ctx: BuildContext, values: list[ir.Value]) -> ir.Value:
    total = values[0]
    for value in values[1:]:
        total = ctx.op.Add(total, value)
    return total


def split_even(ctx: BuildContext, x: ir.Value, count: int, width: int) -> list[ir.Value]:
    """``x`` [..., count * width] split into ``count`` parts of ``width`` along the last axis,
    as a tree of Splits with at most the EP's ``max_split_outputs`` outputs each (each
    output is a shader binding on WebGPU: 35 per-layer inputs are one Split into 5 and
    five into 7)."""
    limit = ctx.caps.max_split_outputs or count
    if count == 1:
        return [x]
    if count <= limit:
        return list(ctx.op.Split(x, axis=-1, num_outputs=count, _outputs=count))
    groups = min(limit, -(-count // limit))
    sizes = [count // groups + (1 if i < count % groups else 0) for i in range(groups)]
    parts = ctx.op.Split(x, ctx.ints([n * width for n in sizes]), axis=-1, _outputs=groups)
    return [
        out for part, n in zip(parts, sizes, strict=True) for out in split_even(ctx, part, n, width)
    ]


def gelu_tanh(ctx: BuildContext, x: ir.Value) -> ir.Value:
    """GELU with the tanh approximation (``gelu_pytorch_tanh``)."""
    return ctx.op.Gelu(x, approximate="tanh")


ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "gelu_tanh", "silu", "swish", "relu")
"""Hugging Face ``hidden_act`` names :func:`activation` lowers (transformers' ACT2FN)."""


def activation(ctx: BuildContext, x: ir.Value, name: str) -> ir.Value:
    """The MLP activation a config names: exact or tanh GELU, SiLU (``x * sigmoid(x)``),
    ReLU. A family's config reader refuses other names first."""
    if name == "gelu":
        return ctx.op.Gelu(x)
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return gelu_tanh(ctx, x)
    if name in ("silu", "swish"):
        return ctx.op.Mul(x, ctx.op.Sigmoid(x))
    if name == "relu":
        return ctx.op.Relu(x)
    raise ValueError(f"activation '{name}' has no lowering (known: {', '.join(ACTIVATIONS)})")


def scaled(ctx: BuildContext, scores: ir.Value, scale: float, dtype: ir.DataType) -> ir.Value:
    """Attention scores times the layer's scale, as a ``dtype`` constant; no node where the
    scale is 1 (Gemma 4's)."""
    if scale == 1.0:
        return scores
    return ctx.op.Mul(scores, ctx.const(np.array(scale, dtype=dtype.numpy())))


def softcap(ctx: BuildContext, x: ir.Value, cap: float) -> ir.Value:
    """``cap * tanh(x / cap)``."""
    return ctx.op.Mul(ctx.op.Tanh(ctx.op.Div(x, ctx.scalar(cap))), ctx.scalar(cap))
