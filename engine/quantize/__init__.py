"""Block-wise weight quantization for MatMulNBits and GatherBlockQuantized.

``quantize(weight, bits=4, block_size=32)`` turns a float ``[rows, cols]`` array into packed
codes, scales and zero points along ``cols``; ``method="rtn"`` matches ONNX Runtime's
quantizer byte for byte, ``method="search"`` picks each block's range to lower the
reconstruction error.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

from engine.errors import OptionsError
from engine.quantize.blocks import (
    BLOCK_SIZES,
    QuantizedBlocks,
    check_quantizable,
    check_shareable,
    dequantize,
    scale_dtype_of,
)

__all__ = [
    "BLOCK_SIZES",
    "METHODS",
    "QuantizedBlocks",
    "check_quantizable",
    "check_shareable",
    "dequantize",
    "quantize",
]

Method = Literal["rtn", "search"]
METHODS: tuple[Method, ...] = ("rtn", "search")


def quantize(
    weight: np.ndarray,
    *,
    bits: int,
    block_size: int,
    symmetric: bool = False,
    scale_dtype: object = np.float32,
    method: str = "rtn",
    name: str = "weight",
) -> QuantizedBlocks:
    """Block-quantize a 2-D float weight along its last axis.

    Args:
        weight: float32, float16 or bfloat16 array ``[rows, cols]``; for a linear layer the
            PyTorch layout ``[out_features, in_features]``, for an embedding ``[vocab, hidden]``.
        bits: 4 or 8.
        block_size: Values per block: 16, 32, 64, 128 or 256; ``cols`` is padded with
            zeros to whole blocks.
        symmetric: Fix the zero point at 8 (4-bit) or 128 (8-bit).
        scale_dtype: float32, float16 or bfloat16: the dtype of the scales (the activation
            dtype of the op that reads them).
        method: ``"rtn"`` (round to nearest, identical to ONNX Runtime's
            ``MatMulNBitsQuantizer``) or ``"search"`` (per-block range search, lower error).
        name: The weight's name, for error messages.

    Returns:
        The packed :class:`QuantizedBlocks` (qweight over the padded columns).

    Raises:
        OptionsError: For unsupported bits, block sizes, shapes, dtypes or methods.
        WeightsError: For weights with infinities or NaNs, or too large for the scale dtype.
    """
    weight = np.asarray(weight)
    if weight.ndim != 2:
        raise OptionsError(f"{name}: only 2-D weights can be quantized, got shape {weight.shape}")
    if weight.dtype.kind != "f" and weight.dtype != np.dtype(ml_dtypes.bfloat16):
        raise OptionsError(f"{name}: only float weights can be quantized, got {weight.dtype}")
    check_quantizable(name, weight.shape, bits, block_size)
    dtype = scale_dtype_of(scale_dtype)
    if method not in METHODS:
        raise OptionsError(
            f"unknown quantization method {method!r}; use one of {', '.join(METHODS)}"
        )
    rows, cols = weight.shape
    if cols % block_size:
        # Pad K with zeros to whole blocks, as ONNX Runtime's MatMulNBitsQuantizer does: the
        # zeros move no block's range (a range always holds 0).
        padded = np.zeros((rows, -(-cols // block_size) * block_size), dtype=weight.dtype)
        padded[:, :cols] = weight
        blocks = _quantize(padded, bits, block_size, symmetric, dtype, method, name)
        return _clear_padding(blocks, cols, bits)
    return _quantize(weight, bits, block_size, symmetric, dtype, method, name)


def _quantize(
    weight: np.ndarray,
    bits: int,
    block_size: int,
    symmetric: bool,
    scale_dtype: np.dtype,
    method: str,
    name: str,
) -> QuantizedBlocks:
    if method == "search":
        from engine.quantize.search import quantize_search

        return quantize_search(
            weight,
            bits=bits,
            block_size=block_size,
            symmetric=symmetric,
            scale_dtype=scale_dtype,
            name=name,
        )
    from engine.quantize.rtn import quantize_rtn

    return quantize_rtn(
        weight,
        bits=bits,
        block_size=block_size,
        symmetric=symmetric,
        scale_dtype=scale_dtype,
        name=name,
    )


def _clear_padding(blocks: QuantizedBlocks, cols: int, bits: int) -> QuantizedBlocks:
    """Code 0 for the padding, as ONNX Runtime's quantizer leaves it (kernels never read it)."""
    qweight = blocks.qweight
    first = cols * bits // 8
    if bits == 4 and cols % 2:
        qweight[:, first] &= 0x0F  # an odd width ends in the low nibble of a byte
        first += 1
    qweight[:, first:] = 0
    return blocks
