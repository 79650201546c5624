"""Axial (2-D) rotary embedding for vision encoders, with angles built without Sin / Cos.

onnxruntime-webgpu 1.27 registers Sin and Cos only up to opset 21 (measured: at opset 22+
they fall back to the CPU), and our graphs are opset 23. Positions here are non-negative
integers below a known bound, so cos / sin of ``p * f`` come from angle addition over
the base-16 digits of p: ``e^{i p f} = prod_k e^{i d_k 16^k f}``, each factor looked up in
a small constant table computed in float64 ([digits, 16, frequencies] per function, 8 KB
for Gemma 4's vision tower). Measured against the exact values over positions 0..10239:
<= 2.1e-7 (transformers' own float32 ``p * f`` rounding moves its angles by up to 3e-5 at
position 840).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from engine.graph.context import BuildContext

F32 = ir.DataType.FLOAT
I32 = ir.DataType.INT32
BASE = 16


def axial_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """Inverse frequencies of one axis (head_dim / 4 of them), float32 as transformers'
    ``Gemma4VisionRotaryEmbedding.compute_axial_rope_parameters`` makes them."""
    spatial = head_dim // 2
    exponents = np.arange(0, spatial, 2, dtype=np.float32) / np.float32(spatial)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def digit_count(max_position: int) -> int:
    """Base-16 digits needed for positions 0 .. max_position - 1."""
    count = 1
    while BASE**count < max_position:
        count += 1
    return count


def cos_sin(
    ctx: BuildContext, positions: ir.Value, inv_freq: np.ndarray, max_position: int
) -> tuple[ir.Value, ir.Value]:
    """cos and sin of ``positions * inv_freq`` for int32 positions [B, N, 2] in
    [0, max_position), in the activation dtype, shaped [B, N, 1, 2, 1, F] for
    :func:`rotate`."""
    op = ctx.op
    digits = digit_count(max_position)
    freq = inv_freq.astype(np.float64)
    steps = np.arange(BASE, dtype=np.float64)[:, None]
    angles = np.stack([steps * BASE**k * freq for k in range(digits)])  # [K, 16, F]
    tag = f"{len(freq)}x{digits}"
    cos_table = ctx.const(
        np.cos(angles).reshape(-1, len(freq)).astype(np.float32), name=f"axial_cos_{tag}"
    )
    sin_table = ctx.const(
        np.sin(angles).reshape(-1, len(freq)).astype(np.float32), name=f"axial_sin_{tag}"
    )
    cos = sin = None
    rest = positions
    base = ctx.const(np.array(BASE, dtype=np.int32), name="axial_base_i32")
    for k in range(digits):
        higher = op.Div(rest, base)
        digit = op.Sub(rest, op.Mul(higher, base))
        rows = digit if k == 0 else op.Add(digit, ctx.const(np.array(k * BASE, dtype=np.int32)))
        c, s = op.Gather(cos_table, rows, axis=0), op.Gather(sin_table, rows, axis=0)
        if cos is None or sin is None:
            cos, sin = c, s
        else:
            cos, sin = (
                op.Sub(op.Mul(cos, c), op.Mul(sin, s)),
                op.Add(op.Mul(sin, c), op.Mul(cos, s)),
            )
        rest = higher
    assert cos is not None and sin is not None
    if ctx.dtype != F32:
        cos, sin = op.Cast(cos, to=ctx.dtype), op.Cast(sin, to=ctx.dtype)
    # Broadcast over heads and over the two rotate_half halves.
    return op.Unsqueeze(cos, ctx.ints([2, 4])), op.Unsqueeze(sin, ctx.ints([2, 4]))


def rotate(ctx: BuildContext, x: ir.Value, cos: ir.Value, sin: ir.Value, head_dim: int) -> ir.Value:
    """Axial RoPE of x [B, N, heads, D]: the first half of each head turns with axis 0's
    angles, the second with axis 1's, each by ``rotate_half`` within its half
    (transformers' ``apply_multidimensional_rope``); ``cos`` / ``sin`` as returned
    from :func:`cos_sin`."""
    op = ctx.op
    quarter = head_dim // 4
    # [B, N, heads, axis, half, D/4]
    parts = op.Reshape(x, ctx.ints([0, 0, 0, 2, 2, quarter]))
    first, second = op.Split(parts, axis=4, num_outputs=2, _outputs=2)
    rotated = op.Concat(op.Neg(second), first, axis=4)
    out = op.Add(op.Mul(parts, cos), op.Mul(rotated, sin))
    return op.Reshape(out, ctx.ints([0, 0, 0, head_dim]))
