"""The row-chunked driver that every quantization method runs in, and its fast layout moves.

numpy reduces and broadcasts slowly along a short last axis (a 32-value block costs more in
call overhead than in arithmetic), and casts float16 to float32 one value at a time. So each
chunk of rows is first transposed to *block-major* layout ``[block_size, blocks]``: every
per-block quantity is then a contiguous row vector and every step a long, SIMD-friendly
ufunc call. Codes come back as float32 in the same layout and are packed on the way out
of it. Chunks are small enough to stay in the CPU cache.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from engine.errors import WeightsError
from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.packing import pack, packed_width

__all__ = ["Kernel", "blocks_t", "half_to_float32", "pack_codes_t", "quantize_rows"]

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""A quantization method on one chunk: ``(x, lo, hi) -> (codes, scales, zero_points)``.

``x`` is float32 ``[block_size, m]`` (block-major, one column per block) and ``lo`` / ``hi``
its column minima and maxima. ``codes`` is float32 ``[block_size, m]`` holding integers in
``[0, 2**bits - 1]`` (the kernel may overwrite ``x`` with them); ``scales`` ``[m]`` in the
scale dtype; ``zero_points`` uint8 ``[m]``.
"""

# Elements per chunk: a float32 chunk and its few temporaries fit in a 2 MiB L2 cache, while
# the per-chunk Python overhead (a few dozen numpy calls) stays small against the work.
CHUNK_ELEMENTS = 1 << 16

_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
# float16 bits shifted into a float32's place read as the value times 2**-112.
_HALF_RESCALE = np.float32(2.0**112)
_HALF_KEEP = np.int32(0x8FFFE000 - (1 << 32))  # sign bit and the 15 value bits, after << 13
_FINITE_LIMIT = {_F16: 65504.0, _BF16: float(np.finfo(np.float32).max)}


def half_to_float32(bits: np.ndarray) -> np.ndarray:
    """Exact float16 -> float32 conversion of raw float16 bits, in four vectorized passes.

    numpy converts float16 one element at a time; this moves the bits into place and lets
    one float multiply rebias the exponent (which also handles subnormals exactly).
    Infinities and NaNs come out as finite values of magnitude >= 65536.

    Args:
        bits: uint16 (or int16) array of float16 bit patterns.

    Returns:
        float32 array of the same shape.
    """
    v = bits.view(np.int16).astype(np.int32)  # sign-extends: bit 31 is the sign
    v <<= 13
    v &= _HALF_KEEP
    f = v.view(np.float32)
    f *= _HALF_RESCALE
    return f


def blocks_t(x: np.ndarray, block_size: int) -> np.ndarray:
    """Rows ``[r, cols]`` of a weight -> float32 blocks ``[block_size, r * cols // block_size]``.

    Column ``i`` holds block ``i`` in row-major block order (block ``j`` of row ``k`` is
    column ``k * (cols // block_size) + j``).
    """
    m = x.size // block_size
    if x.dtype in (_F16, _BF16):
        raw = np.empty((block_size, m), dtype=np.uint16)
        np.copyto(raw, x.view(np.uint16).reshape(m, block_size).T)
        if x.dtype == _F16:
            return half_to_float32(raw)
        wide = raw.astype(np.uint32)
        wide <<= 16  # bfloat16 is the high half of a float32
        return wide.view(np.float32)
    out = np.empty((block_size, m), dtype=np.float32)
    np.copyto(out, x.reshape(m, block_size).T, casting="same_kind")
    return out


def pack_codes_t(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack block-major float codes ``[bs, m]`` to row-major bytes ``[m, bs * bits // 8]``.

    Pairs of codes are combined while still in float (exact: at most 65535), so only half as
    many values are cast and transposed back.
    """
    bs, m = codes.shape
    even, odd = codes[0::2], codes[1::2]
    pair = odd * np.float32(1 << bits)
    pair += even
    out = np.empty((m, bs // 2), dtype=np.uint8 if bits == 4 else np.dtype("<u2"))
    np.copyto(out, pair.T, casting="unsafe")
    return out.view(np.uint8)


def _check_finite(name: str, lo: np.ndarray, hi: np.ndarray, limit: float) -> None:
    # Written so that NaN fails too.
    if not (np.all(np.abs(lo) <= limit) and np.all(np.abs(hi) <= limit)):
        raise WeightsError(
            f"{name} contains infinities or NaNs; it cannot be quantized. "
            "Check the checkpoint, or keep this weight in float"
        )


def quantize_rows(
    weight: np.ndarray,
    bits: int,
    block_size: int,
    scale_dtype: np.dtype,
    kernel: Kernel,
    name: str = "weight",
) -> QuantizedBlocks:
    """Run ``kernel`` over ``weight`` in chunks of rows and pack what it returns.

    Args:
        weight: 2-D float array ``[rows, cols]``; ``block_size`` divides ``cols``.
        bits: 4 or 8.
        block_size: Values per block.
        scale_dtype: dtype of the scales the kernel returns.
        kernel: The quantization method (see :data:`Kernel`).
        name: The weight's name, for error messages.

    Returns:
        The packed :class:`QuantizedBlocks`.

    Raises:
        WeightsError: The weight holds infinities or NaNs.
    """
    rows, cols = weight.shape
    blocks = cols // block_size
    limit = _FINITE_LIMIT.get(weight.dtype, float(np.finfo(np.float32).max))
    qweight = np.empty((rows, cols * bits // 8), dtype=np.uint8)
    scales = np.empty((rows, blocks), dtype=scale_dtype)
    zero_points = np.empty((rows, packed_width(blocks, bits)), dtype=np.uint8)
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        x = blocks_t(np.ascontiguousarray(weight[start:stop]), block_size)
        lo = np.minimum.reduce(x, axis=0)
        hi = np.maximum.reduce(x, axis=0)
        _check_finite(name, lo, hi, limit)
        codes, s, z = kernel(x, lo, hi)
        qweight[start:stop] = pack_codes_t(codes, bits).reshape(stop - start, -1)
        scales[start:stop] = s.reshape(stop - start, blocks)
        zero_points[start:stop] = pack(z.reshape(stop - start, blocks), bits, pad=8)
    return QuantizedBlocks(qweight, scales, zero_points)
