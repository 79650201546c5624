"""Packing of 4- and 8-bit codes into bytes, in the order ONNX Runtime's block-quantized ops read.

For 4 bits, element ``2j`` of a row is the low nibble of byte ``j`` and element ``2j + 1`` the
high nibble. 8-bit codes are their own bytes. Rows are packed independently: the last axis is
the packed one.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack", "packed_width", "unpack"]


def packed_width(count: int, bits: int) -> int:
    """Bytes that ``count`` codes of ``bits`` bits take when packed.

    Args:
        count: Number of codes along the packed axis.
        bits: 4 or 8.

    Returns:
        ``ceil(count * bits / 8)``.
    """
    return (count * bits + 7) // 8


def pack(codes: np.ndarray, bits: int, *, pad: int = 0) -> np.ndarray:
    """Pack codes along the last axis.

    Args:
        codes: uint8 array ``[..., n]`` of values below ``2**bits``.
        bits: 4 or 8.
        pad: The nibble that fills the high half of the last byte when ``n`` is odd and
            ``bits`` is 4 (ONNX Runtime fills zero-point padding with 8).

    Returns:
        uint8 array ``[..., packed_width(n, bits)]``.
    """
    codes = np.asarray(codes, dtype=np.uint8)
    if bits == 8:
        return np.ascontiguousarray(codes)
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if codes.shape[-1] % 2:
        filler = np.full((*codes.shape[:-1], 1), pad, dtype=np.uint8)
        codes = np.concatenate([codes, filler], axis=-1)
    codes = np.ascontiguousarray(codes)
    # Two codes read as one little-endian uint16 hold the low code in bits 0-3 and the high
    # code in bits 8-11; OR-ing in a copy shifted right by 4 moves the high code to bits 4-7.
    pairs = codes.view("<u2")
    packed = pairs | (pairs >> 4)
    return packed.astype(np.uint8)


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unpack codes along the last axis (inverse of :func:`pack`).

    Args:
        packed: uint8 array ``[..., packed_width(count, bits)]``.
        bits: 4 or 8.
        count: Number of codes to return per row (drops the padding nibble of odd counts).

    Returns:
        uint8 array ``[..., count]``.
    """
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed[..., :count]
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    out = np.empty((*packed.shape, 2), dtype=np.uint8)
    np.bitwise_and(packed, 0x0F, out=out[..., 0])
    np.right_shift(packed, 4, out=out[..., 1])
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)[..., :count]
