"""Block-quantized tensors: the result type, the option checks and dequantization.

A weight ``[rows, cols]`` is quantized along ``cols`` in blocks of ``block_size``; each block
has one scale and one zero point and its values become codes ``q`` with
``w ~ (q - zero_point) * scale``. The arrays are laid out as ONNX Runtime's
``MatMulNBits`` (B viewed as ``[N, K]``) and ``GatherBlockQuantized`` (``gather_axis=0``,
``quantize_axis=1``) read them; both ops take the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from engine.errors import OptionsError, option
from engine.quantize.packing import unpack

__all__ = [
    "BLOCK_SIZES",
    "QuantizedBlocks",
    "check_quantizable",
    "check_shareable",
    "dequantize",
    "scale_dtype_of",
]

BLOCK_SIZES = (16, 32, 64, 128, 256)
"""Block sizes the ONNX Runtime kernels accept (powers of two from 16 to 256)."""

_SCALE_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@dataclass(frozen=True)
class QuantizedBlocks:
    """A block-quantized 2-D weight, ready to become ONNX Runtime initializers.

    Attributes:
        qweight: uint8 ``[rows, blocks * block_size * bits // 8]``, codes packed along
            ``cols`` padded with zeros to whole blocks (``blocks = ceil(cols / block_size)``);
            for 4 bits element ``2j`` is the low nibble of byte ``j``. MatMulNBits' B for a
            weight ``[N, K]`` is ``qweight.reshape(N, blocks, block_size * bits // 8)``;
            GatherBlockQuantized takes :meth:`gather_data` (the padding cut off).
        scales: ``[rows, blocks]`` in the scale dtype.
        zero_points: uint8 ``[rows, ceil(blocks * bits / 8)]``, packed like
            ``qweight`` (an odd 4-bit count is padded with the nibble 8). Always present;
            symmetric quantization stores the implicit 8 (4-bit) or 128 (8-bit).
    """

    qweight: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of the three arrays together."""
        return int(self.qweight.nbytes + self.scales.nbytes + self.zero_points.nbytes)

    def gather_data(self, cols: int, bits: int) -> np.ndarray:
        """GatherBlockQuantized's data for a ``[rows, cols]`` table: qweight without the
        padding of the last block."""
        return self.qweight[:, : cols * bits // 8]


def check_quantizable(
    name: str,
    shape: tuple[int, ...],
    bits: int,
    block_size: int,
    storage: str = "matmulnbits",
) -> None:
    """Check that a weight can be block-quantized along its last axis.

    A last axis that is not a whole number of blocks is fine: MatMulNBits takes it padded
    with zeros to whole blocks (as ONNX Runtime's quantizer pads K), GatherBlockQuantized
    with a partial last block.

    Args:
        name: The weight's name, used in the message.
        shape: The weight's shape; blocks run along the last axis.
        bits: Bits per code.
        block_size: Values per block.
        storage: ``"matmulnbits"`` or ``"gbq"`` (GatherBlockQuantized).

    Raises:
        OptionsError: ``bits`` is not 4 or 8; ``block_size`` is not a power of two from 16 to
            256; a GatherBlockQuantized table has an odd number of columns with 4 bits.
    """
    if bits not in (4, 8):
        raise OptionsError(f"{name}: {bits}-bit quantization is not supported; use 4 or 8 bits")
    if block_size not in BLOCK_SIZES:
        raise OptionsError(
            f"{name}: block size {block_size} is not supported; use a power of two from 16 to "
            f"256 ({', '.join(map(str, BLOCK_SIZES))})"
        )
    if not shape:
        raise OptionsError(f"{name} is a scalar; only tensors with a last axis can be quantized")
    cols = shape[-1]
    if cols < 1:
        raise OptionsError(f"{name} has no columns; there is nothing to quantize")
    if storage == "gbq" and bits == 4 and cols % 2:
        raise OptionsError(
            f"{name} has an odd number of columns ({cols}); a 4-bit GatherBlockQuantized "
            f"table packs two codes per byte. Use {option('embedding_bits', 8)}, or "
            f"{option('keep_float', name)} to keep this table in float"
        )


def check_shareable(name: str, shape: tuple[int, ...], block_size: int | None) -> None:
    """Check that a quantized embedding table can double as a tied LM head's MatMulNBits
    weight: its bytes are shared, so its rows must be whole blocks (no padding).

    Raises:
        OptionsError: The table's width is not a multiple of ``block_size``.
    """
    cols = shape[-1]
    if block_size is None or cols % block_size == 0:
        return
    fitting = [b for b in BLOCK_SIZES if cols % b == 0]
    hint = (
        f"use {option('embedding_block_size')} {' or '.join(map(str, fitting))}"
        if fitting
        else f"keep it in float with {option('keep_float', name)}"
    )
    raise OptionsError(
        f"{name} is also the tied LM head, which reads its quantized bytes as MatMulNBits "
        f"blocks; block size {block_size} does not divide its {cols} columns: {hint}"
    )


def scale_dtype_of(scale_dtype: object) -> np.dtype:
    """The numpy dtype of a requested scale dtype, or OptionsError if it is not a float one."""
    dtype = np.dtype(scale_dtype)  # type: ignore[call-overload]
    if dtype not in _SCALE_DTYPES:
        raise OptionsError(f"scales must be float32, float16 or bfloat16, not {dtype}")
    return dtype


def dequantize(
    blocks: QuantizedBlocks, *, bits: int, block_size: int, cols: int | None = None
) -> np.ndarray:
    """Reconstruct the float weight of block-quantized data.

    Args:
        blocks: The quantized weight; its qweight may be padded to whole blocks
            (MatMulNBits) or end in a partial block (GatherBlockQuantized).
        bits: Bits per code it was quantized with.
        block_size: Values per block it was quantized with.
        cols: Columns to return; default: the columns qweight stores.

    Returns:
        float32 ``[rows, cols]``: ``(q - zero_point) * scale``, computed in float32.
    """
    rows, width = blocks.qweight.shape
    stored = width * 8 // bits
    nb = blocks.scales.shape[1]
    q = unpack(blocks.qweight, bits, stored)
    if stored < nb * block_size:
        q = np.pad(q, ((0, 0), (0, nb * block_size - stored)))
    q = q.reshape(rows, nb, block_size)
    zp = unpack(blocks.zero_points, bits, nb)
    diff = q.astype(np.float32) - zp[..., None].astype(np.float32)
    out = diff * blocks.scales.astype(np.float32)[..., None]
    return out.reshape(rows, nb * block_size)[:, : stored if cols is None else cols]
