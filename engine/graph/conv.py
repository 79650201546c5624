"""Convolution and channel-norm leaves for encoder towers (the Gemma 4 audio tower's
subsampling convolutions and its depthwise causal Conv1d).

Conv weights keep the checkpoint's layout ([out, in / groups, *kernel]) and stay float
under weight quantization (role ``conv``): MatMulNBits cannot hold them, and they are a
small share of a tower's bytes.
"""

from __future__ import annotations

import onnx_ir as ir

from engine.graph.context import BuildContext
from engine.graph.modules import Module, Param


class Conv(Module):
    """ONNX ``Conv`` without bias over [B, C, *spatial] (the layout torch's ConvNd uses).

    ``pads`` are ONNX's (every begin, then every end), so a causal Conv1d that pads
    ``k - 1`` frames on the left is ``pads=(k - 1, 0)``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: tuple[int, ...],
        *,
        strides: tuple[int, ...] | None = None,
        pads: tuple[int, ...] | None = None,
        groups: int = 1,
    ) -> None:
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{groups} groups do not divide {in_channels} -> {out_channels}")
        self.weight = Param((out_channels, in_channels // groups, *kernel), "conv")
        self._attributes: dict[str, object] = {
            "kernel_shape": list(kernel),
            "strides": list(strides or (1,) * len(kernel)),
            "pads": list(pads or (0,) * (2 * len(kernel))),
            "group": groups,
        }

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        return ctx.op.Conv(x, ctx.param(self.weight.name), **self._attributes)


class LayerNorm(Module):
    """LayerNorm over the last axis with a scale and no bias (torch's
    ``nn.LayerNorm(..., bias=False)``)."""

    def __init__(self, width: int, eps: float) -> None:
        self.eps = eps
        self.weight = Param((width,), "norm")

    def __call__(self, ctx: BuildContext, x: ir.Value) -> ir.Value:
        return ctx.op.LayerNormalization(
            x, ctx.param(self.weight.name), axis=-1, epsilon=self.eps, stash_type=1
        )
