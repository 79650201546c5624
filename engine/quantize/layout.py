"""The row-chunked driver every quantization method runs in, and its fast layout moves.

numpy reduces and broadcasts slowly along a short last axis (a 32-value block costs more in
call overhead than in arithmetic) and casts float16 to float32 one value at a time. So each
chunk of rows is moved to a *block-major* layout, where every per-block quantity is a long
contiguous vector and every step one SIMD-friendly ufunc call over the chunk. The move
transposes 8-byte groups (two float32 or four 16-bit values) rather than single values,
which is several times cheaper, so a :class:`Chunk` keeps those ``g`` neighbours together:

    chunk.x[r, g * i + h] = value g * r + h of block i        (shape [bs // g, g * m])

Codes come back as float32 in the same layout and are packed on the way out of it, four
codes per transposed item. Chunks are sized to stay in the CPU cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from engine.errors import WeightsError, option
from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.packing import pack, packed_width

__all__ = [
    "Chunk",
    "Kernel",
    "as_float32",
    "half_to_float32",
    "pack_codes",
    "quantize_rows",
    "to_chunk",
]

# Elements per chunk (2 MiB as float32): small enough for its temporaries to stay in the
# L2 / L3 caches, large enough that the per-chunk Python overhead (a few dozen numpy calls,
# holding the GIL) stays small against the work. Measured best of 2**16 .. 2**21.
CHUNK_ELEMENTS = 1 << 19

MAX_THREADS: int | None = None
"""Threads that quantize chunks at once; None: one per CPU this process may run on, at most
8 (the Python glue between numpy calls holds the GIL, so more threads gain little)."""

_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
# float16 bits shifted into a float32's place read as the value times 2**-112.
_HALF_RESCALE = np.float32(2.0**112)
_HALF_KEEP = np.int32(0x8FFFE000 - (1 << 32))  # sign bit and the 15 value bits, after << 13
_FINITE_LIMIT = {_F16: 65504.0}


@dataclass(frozen=True)
class Chunk:
    """The float32 blocks of a chunk of rows, in grouped block-major layout.

    Attributes:
        x: float32 ``[bs // group, group * m]``; ``x[r, group * i + h]`` is value
            ``group * r + h`` of block ``i`` (blocks in row-major order of the weight).
        group: Neighbouring values of a block kept together in a row of ``x`` (1, 2 or 4).
    """

    x: np.ndarray
    group: int

    @property
    def blocks(self) -> int:
        """Number of blocks ``m``."""
        return self.x.shape[1] // self.group

    def spread(self, per_block: np.ndarray) -> np.ndarray:
        """Repeat a per-block vector ``[m]`` onto the columns of ``x`` ``[group * m]``."""
        return np.repeat(per_block, self.group) if self.group > 1 else per_block

    def fold(self, per_column: np.ndarray, op: np.ufunc) -> np.ndarray:
        """Combine a per-column vector ``[group * m]`` into a per-block one with ``op``."""
        v = per_column
        while v.shape[0] > self.blocks:
            v = op(v[0::2], v[1::2])
        return v

    def first(self) -> np.ndarray:
        """The first value of each block ``[m]``."""
        return self.x[0, :: self.group]


Kernel = Callable[[Chunk, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""A quantization method on one chunk: ``(chunk, lo, hi) -> (codes, scales, zero_points)``.

``lo`` / ``hi`` are the block minima and maxima ``[m]``. ``codes`` is float32 shaped like
``chunk.x`` whose integer parts are the codes, in ``[0, 2**bits)`` (the kernel may
overwrite ``chunk.x`` with them); ``scales`` ``[m]`` in the scale dtype; ``zero_points``
uint8 ``[m]``.
"""


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


def as_float32(a: np.ndarray) -> np.ndarray:
    """``a`` as float32, converting float16 with :func:`half_to_float32` (exact, faster)."""
    if a.dtype == _F16:
        return half_to_float32(np.ascontiguousarray(a).view(np.uint16))
    return a.astype(np.float32)


def to_chunk(rows: np.ndarray, block_size: int) -> Chunk:
    """Move C-contiguous rows ``[r, cols]`` of a weight into a float32 :class:`Chunk`."""
    if rows.dtype not in (_F16, _BF16, np.dtype(np.float32)):
        rows = rows.astype(np.float32)
    group = 8 // rows.itemsize
    m = rows.size // block_size
    items = rows.view(np.uint64).reshape(m, block_size // group)
    moved = np.empty((block_size // group, m), dtype=np.uint64)
    np.copyto(moved, items.T)
    shape = (block_size // group, group * m)
    if rows.dtype == _F16:
        return Chunk(half_to_float32(moved.view(np.uint16)).reshape(shape), group)
    if rows.dtype == _BF16:
        wide = moved.view(np.uint16).astype(np.uint32)
        wide <<= 16  # a bfloat16 is the high half of a float32
        return Chunk(wide.view(np.float32).reshape(shape), group)
    return Chunk(moved.view(np.float32).reshape(shape), group)


def _squeeze_nibbles(items: np.ndarray) -> np.ndarray:
    """Little-endian uint16 / uint32 items holding one 4-bit code per byte -> uint8 / uint16
    items holding two per byte (the cast keeps the low half)."""
    v = items >> 4
    v |= items  # byte 0 = code 0 | code 1 << 4, byte 2 = code 2 | code 3 << 4
    if items.dtype.itemsize == 2:
        return v.astype(np.uint8)
    v &= 0x00FF00FF
    v |= v >> 8
    return v.astype("<u2")


def pack_codes(
    codes: np.ndarray, group: int, bits: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Pack a chunk's codes (laid out like :attr:`Chunk.x`) to row-major bytes.

    ``codes`` are float32 whose integer parts are the codes (values in ``[0, 2**bits)``);
    the cast to uint8 truncates them. Each row's ``group`` neighbouring codes of a block
    are then adjacent bytes: they are read as one integer (4-bit codes squeezed to two per
    byte), rows are merged until each integer holds four codes, and only then is the result
    transposed back, as few, wide items.

    Args:
        codes: float32 codes laid out like :attr:`Chunk.x`.
        group: The chunk's group.
        bits: 4 or 8.
        out: Optional C-contiguous uint8 array of ``m * bs * bits // 8`` bytes to write to.

    Returns:
        uint8 ``[m, bs * bits // 8]`` (a view of ``out`` when given).
    """
    m = codes.shape[1] // group
    items = codes.astype(np.uint8)
    if group > 1:
        items = items.view(f"<u{group}")
        if bits == 4:
            items = _squeeze_nibbles(items)
    width = bits * group  # bits of codes per item
    while width < 4 * bits:  # merge rows 2k and 2k + 1 (value order) into one wider item
        merged = items[1::2].astype(f"<u{max(1, width // 4)}")
        merged <<= width
        merged |= items[0::2]
        items, width = merged, width * 2
    dtype = items.dtype.newbyteorder("<")
    if out is None:
        out = np.empty(m * items.shape[0] * dtype.itemsize, dtype=np.uint8)
    target = out.view(dtype).reshape(m, items.shape[0])
    np.copyto(target, items.T)
    return target.view(np.uint8)


def _check_finite(name: str, lo: np.ndarray, hi: np.ndarray, limit: float) -> None:
    # Written so that NaN fails too.
    if not (np.all(np.abs(lo) <= limit) and np.all(np.abs(hi) <= limit)):
        raise WeightsError(
            f"{name} holds NaN or infinite values: the checkpoint is damaged. Re-download it "
            "or re-save it from a model that loads in transformers"
        )


def _check_scales(name: str, scales: np.ndarray) -> None:
    if not np.all(np.isfinite(scales)):
        raise WeightsError(
            f"{name} has values too large for {scales.dtype} scales; export with "
            f"{option('dtype', 'fp32')} (the scales take the activation dtype)"
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
        WeightsError: The weight holds infinities or NaNs, or a scale overflows its dtype.
    """
    rows, cols = weight.shape
    blocks = cols // block_size
    limit = _FINITE_LIMIT.get(weight.dtype, float(np.finfo(np.float32).max))
    qweight = np.empty((rows, cols * bits // 8), dtype=np.uint8)
    scales = np.empty((rows, blocks), dtype=scale_dtype)
    zero_points = np.empty((rows, packed_width(blocks, bits)), dtype=np.uint8)

    def run(start: int, stop: int) -> None:
        chunk = to_chunk(np.ascontiguousarray(weight[start:stop]), block_size)
        lo = chunk.fold(np.minimum.reduce(chunk.x, axis=0), np.minimum)
        hi = chunk.fold(np.maximum.reduce(chunk.x, axis=0), np.maximum)
        _check_finite(name, lo, hi, limit)
        codes, s, z = kernel(chunk, lo, hi)
        _check_scales(name, s)
        pack_codes(codes, chunk.group, bits, out=qweight[start:stop])
        scales[start:stop] = s.reshape(stop - start, blocks)
        zero_points[start:stop] = pack(z.reshape(stop - start, blocks), bits, pad=8)

    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    bounds = [(start, min(rows, start + step)) for start in range(0, rows, step)]
    workers = min(len(bounds), threads())
    if workers <= 1:
        for start, stop in bounds:
            run(start, stop)
    else:
        # numpy releases the GIL inside its loops, so chunks overlap well in threads; each
        # chunk writes only its own rows of the outputs.
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(run, start, stop) for start, stop in bounds]:
                future.result()
    return QuantizedBlocks(qweight, scales, zero_points)


def threads() -> int:
    """Worker threads :func:`quantize_rows` uses (see :data:`MAX_THREADS`)."""
    if MAX_THREADS is not None:
        return max(1, MAX_THREADS)
    if hasattr(os, "sched_getaffinity"):
        return min(8, len(os.sched_getaffinity(0)))
    return min(8, os.cpu_count() or 1)
