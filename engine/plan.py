"""The export planner: storage, quantization and buffer splits of every weight, before any
weight is read.

The plan is the single source of truth for sizes (its types live in
:mod:`engine.plan_model`). The preview charts it, the builder follows it, the weight
writer produces exactly its tensors, and a test checks a written package against it byte
for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import OptionsError, option
from engine.graph.attention import attention_path
from engine.logical import LogicalWeight
from engine.models import sessions_for
from engine.options import ExportOptions
from engine.plan_model import (
    ExportPlan,
    Part,
    Piece,
    PlannedTensor,
    SessionPlan,
    Storage,
    WeightPlan,
    quantized_shapes,
)
from engine.quantize import BLOCK_SIZES, check_quantizable, check_shareable
from engine.spec import ModelSpec
from engine.units import format_bytes

__all__ = [
    "ExportPlan",
    "Part",
    "Piece",
    "PlannedTensor",
    "SessionPlan",
    "Storage",
    "WeightPlan",
    "attention_path",
    "context_length",
    "plan",
    "quantized_shapes",
]


@dataclass(frozen=True)
class _Limits:
    buffer: int | None
    binding: int | None

    def exceeded(self, nbytes: int) -> tuple[str, ...]:
        out = []
        if self.buffer is not None and nbytes > self.buffer:
            out.append("max_buffer_size")
        if self.binding is not None and nbytes > self.binding:
            out.append("max_storage_binding_size")
        return tuple(out)


SPLIT_K_MIN_DEPTH = 1024
"""Shallower linears are not split along K: their MatMul walks little of K, and splitting
adds two kernels (~7 us each under capture on the H200)."""
SPLIT_K_MIN_SLICE = 64
"""Shortest slice of K a split-K partial product walks."""


def split_k_groups(most: int, k: int) -> int:
    """Slices of K for a float linear of depth ``k`` when the EP allows ``most``
    (:attr:`EpCapabilities.split_k`): halved until they divide ``k`` into slices of at
    least :data:`SPLIT_K_MIN_SLICE`; 1 (no split) below :data:`SPLIT_K_MIN_DEPTH`."""
    if k < SPLIT_K_MIN_DEPTH:
        return 1
    groups = most
    while groups > 1 and (k % groups or k // groups < SPLIT_K_MIN_SLICE):
        groups //= 2
    return max(groups, 1)


def _piece_tensors(
    base: str,
    storage: Storage,
    dtype: str,
    shape: tuple[int, int] | tuple[int, ...],
    bits: int | None,
    block_size: int | None,
    symmetric: bool,
    split_k: int = 1,
) -> tuple[PlannedTensor, ...]:
    if storage == "float":
        return (PlannedTensor(base, dtype, tuple(shape), "weight"),)
    if storage == "float_t":
        # [in, out], or the same bytes as [G, 1, in / G, out] for a split-K MatMul.
        out_features, k = shape[0], shape[1]
        groups = split_k_groups(split_k, k)
        layout = (k, out_features) if groups == 1 else (groups, 1, k // groups, out_features)
        return (PlannedTensor(base, dtype, layout, "weight"),)
    assert bits is not None and block_size is not None
    # Leading axes beyond the rows (the experts of a [E, N, K] tensor) stay as they are.
    lead = tuple(shape[:-2])
    shapes = quantized_shapes(shape[-2], shape[-1], bits, block_size, storage)
    tensors = [
        PlannedTensor(f"{base}.qweight", "uint8", lead + shapes["qweight"], "qweight"),
        PlannedTensor(f"{base}.scales", dtype, lead + shapes["scales"], "scales"),
    ]
    # GatherBlockQuantized always gets zero points: CPU and CUDA disagree on the default.
    if storage == "gbq" or not symmetric:
        tensors.append(
            PlannedTensor(
                f"{base}.zero_points", "uint8", lead + shapes["zero_points"], "zero_points"
            )
        )
    return tuple(tensors)


def _pieces_along(
    base: str,
    storage: Storage,
    dtype: str,
    shape: tuple[int, ...],
    axis: int,
    bounds: list[tuple[int, int]],
    bits: int | None,
    block_size: int | None,
    symmetric: bool,
    split_k: int = 1,
) -> tuple[Piece, ...]:
    pieces = []
    for i, (start, stop) in enumerate(bounds):
        piece_shape = list(shape)
        if piece_shape:  # a 0-d tensor (a clip bound) is one piece of itself
            piece_shape[axis] = stop - start
        if bits is not None and block_size is not None:  # a split may make a table odd
            check_quantizable(base, tuple(piece_shape), bits, block_size, storage)
        name = base if len(bounds) == 1 else f"{base}.part{i}"
        pieces.append(
            Piece(
                i,
                axis,
                start,
                stop,
                _piece_tensors(
                    name, storage, dtype, tuple(piece_shape), bits, block_size, symmetric, split_k
                ),
            )
        )
    return tuple(pieces)


def _even_bounds(size: int, count: int) -> list[tuple[int, int]]:
    step = size // count
    return [(i * step, (i + 1) * step) for i in range(count)]


INT8_BLOCK = 128
"""Block size of a weight :attr:`~engine.options.ExportOptions.keep_int8` moves to 8 bits:
its scales then take a quarter of block 32's bytes, so the move costs 3.2 instead of 4.1
bits per weight (fp32 scales), and 8-bit codes lose almost nothing to the larger block (on
the trained reference, INT4 weights with INT8 tables measure a mean KLD of 0.00131 at
block 32 and at 128: benchmarks/results/trained_reference-2026-12-02-h200-500-steps-int8-
tables-b128.json)."""


def int8_block(block: int | None, cols: int) -> int | None:
    """The block size of a weight of ``cols`` columns moved from ``block`` to 8 bits: the
    largest of ``block`` up to :data:`INT8_BLOCK` that divides ``cols`` (no padding, and a
    tied head can still read it), else ``block``."""
    if block is None:
        return None
    fitting = [b for b in BLOCK_SIZES if block <= b <= INT8_BLOCK and cols % b == 0]
    return max(fitting, default=block)


def _plan_weight(
    w: LogicalWeight, options: ExportOptions, limits: _Limits, dtype: str, split_k: int = 1
) -> WeightPlan:
    """Storage and splits of one weight that does not share another's bytes; a float
    linear's K in up to ``split_k`` slices (see :func:`split_k_groups`)."""
    role = w.role
    bits: int | None = None
    block: int | None = None
    kept_float = ""
    if role in ("linear", "lm_head"):
        if options.weight_bits is not None and (role == "linear" or options.quantize_lm_head):
            storage: Storage = "matmulnbits"
            bits, block = options.weight_bits, options.block_size
        else:
            storage = "float" if role == "lm_head" else "float_t"
    elif role in ("embedding", "ple_table"):
        if options.embedding_bits is not None:
            storage = "gbq"
            bits, block = options.embedding_bits, options.embedding_block_size
        else:
            storage = "float"
    elif role == "router":
        storage = "float_t"
    elif role == "experts":
        # [E, N, K] expert weights are gathered by the router's indices; quantized, they
        # are GatherBlockQuantized blocks along K (the bytes MatMulNBits would hold).
        if options.weight_bits is not None and options.caps.supports("GatherBlockQuantized"):
            storage = "gbq"
            bits, block = options.weight_bits, options.block_size
        else:
            storage = "float"
            if options.weight_bits is not None:
                kept_float = (
                    f"kept float: {options.caps.display_name} has no GatherBlockQuantized "
                    "to read quantized experts"
                )
    else:
        storage = "float"
    if bits is not None and options.keeps_float(w.name):
        storage, bits, block = ("float_t" if role == "linear" else "float"), None, None
    elif bits is not None and options.keeps_int8(w.name):
        bits, block = 8, int8_block(block, w.shape[-1])
    if bits is not None and block is not None:
        check_quantizable(w.name, w.shape, bits, block, storage)

    def make(axis: int, bounds: list[tuple[int, int]]) -> tuple[Piece, ...]:
        groups = split_k if role == "linear" else 1
        return _pieces_along(
            w.name, storage, dtype, w.shape, axis, bounds, bits, block, options.symmetric, groups
        )

    whole = make(0, [(0, w.shape[0] if w.shape else 1)])
    exceeds = limits.exceeded(whole[0].largest_buffer)

    def result(pieces: tuple[Piece, ...], axis: int | None = None, note: str = "") -> WeightPlan:
        still = limits.exceeded(max(p.largest_buffer for p in pieces)) if axis is not None else ()
        return WeightPlan(
            w,
            storage,
            dtype,
            pieces,
            bits=bits,
            block_size=block,
            symmetric=options.symmetric if bits else False,
            split_axis=axis,
            exceeds=exceeds,
            pieces_exceed=still,
            note=note,
        )

    if "max_buffer_size" not in exceeds or limits.buffer is None:
        return result(whole, note=kept_float)
    limit = limits.buffer
    if role == "ple_table":
        # Whole layers' [V, D] tables, as many to a piece as fit: each piece is one gather
        # per step, so fewer pieces are fewer kernels (E2B's INT4 table on WebGPU: 9
        # pieces of 4 layers where one per layer made 35). One layer is the least a piece
        # holds, whatever the limit.
        dim = _ple_dim(w)
        layers = w.shape[1] // dim
        # 4-bit pieces keep an even number of blocks per row where the EP needs it.
        odd_blocks = block is not None and (dim // block) % 2 == 1
        unit = 2 if odd_blocks and options.caps.even_gbq_blocks(bits) else 1
        per_piece = 1
        for n in range(2, layers + 1):  # a piece's largest buffer grows with its layers
            if limits.exceeded(make(1, [(0, n * dim)])[0].largest_buffer):
                break
            if n % unit == 0 and (layers % n) % unit == 0:
                per_piece = n
        bounds = [
            (start * dim, min(start + per_piece, layers) * dim)
            for start in range(0, layers, per_piece)
        ]
        what = "per-layer tables" if per_piece == 1 else f"tables of up to {per_piece} layers"
        return result(make(1, bounds), 1, f"fused table split into {len(bounds)} {what}")
    if role == "embedding":
        # Split along the hidden axis: each piece is gathered and the rows concatenated,
        # which needs no index arithmetic and stays graph-capture safe. Pieces keep
        # whole quantization blocks (an even number of 4-bit ones where the EP needs it).
        unit = (block or 1) * (2 if options.caps.even_gbq_blocks(bits) else 1)
        count = _split_count(w.shape[1], whole[0].largest_buffer, limit, unit=unit)
        if count is None:
            return result(whole, note="no even split of the hidden axis fits the limit")
        return result(
            make(1, _even_bounds(w.shape[1], count)),
            1,
            f"split along the hidden axis into {count} tables",
        )
    if role == "experts":
        # Split every expert along its output rows (axis 1): each piece is gathered by the
        # same indices and the rows concatenated; quantization blocks run along K, intact.
        count = _split_count(w.shape[1], whole[0].largest_buffer, limit, unit=1)
        if count is None:
            return result(whole, note="no even split of the experts' rows fits the limit")
        return result(
            make(1, _even_bounds(w.shape[1], count)),
            1,
            f"split along every expert's rows into {count} pieces",
        )
    if role == "lm_head":
        count = _split_count(w.shape[0], whole[0].largest_buffer, limit, unit=1)
        if count is None:
            return result(whole, note="no even split of the vocabulary fits the limit")
        return result(
            make(0, _even_bounds(w.shape[0], count)),
            0,
            f"split along the vocabulary into {count} pieces",
        )
    return result(whole, note=f"{role} weights are not split; raise the buffer limit or quantize")


def _ple_dim(w: LogicalWeight) -> int:
    # The fused table's width is L * D; the plan is only ever asked with a spec at hand,
    # and the family encodes D as the embedding scale's square.
    assert w.scale is not None
    return round(w.scale**2)


def _split_count(size: int, nbytes: int, limit: int, unit: int) -> int | None:
    """Smallest count of equal pieces along an axis of ``size`` whose bytes fit ``limit``,
    with every piece a multiple of ``unit`` elements."""
    start = max(2, math.ceil(nbytes / limit))
    for count in range(start, size // unit + 1):
        if size % count == 0 and (size // count) % unit == 0 and nbytes // count <= limit:
            return count
    return None


def _tied(name: str, owner: WeightPlan, options: ExportOptions) -> WeightPlan:
    """A tied weight (the LM head) reuses its owner's (the token embedding's) initializers."""
    head = LogicalWeight(name, owner.weight.shape, "lm_head", source=owner.weight.source)
    if owner.storage == "gbq":
        check_shareable(owner.name, owner.weight.shape, owner.block_size)
        storage: Storage = "matmulnbits"
        note = "tied: MatMulNBits over the quantized embedding's bytes"
    else:
        storage = "float"
        note = "tied: MatMul over the embedding table"
        if options.weight_bits is not None and options.quantize_lm_head:
            note += (
                " (kept float to store the table once; "
                f"quantize it with {option('embedding_bits')})"
            )
    if owner.is_split:
        note += f", summed over its {len(owner.pieces)} hidden-axis pieces"
    return WeightPlan(
        head,
        storage,
        owner.dtype,
        owner.pieces,
        bits=owner.bits,
        block_size=owner.block_size,
        symmetric=owner.symmetric,
        split_axis=owner.split_axis,
        shares=owner.name,
        note=note,
    )


def context_length(spec: ModelSpec, options: ExportOptions) -> int:
    """The longest sequence the package supports (sizes RoPE caches and KV buffers)."""
    if options.max_length is not None:
        return min(options.max_length, spec.max_position_embeddings)
    return spec.max_position_embeddings


def plan(spec: ModelSpec, options: ExportOptions) -> ExportPlan:
    """Plan every initializer of the package for ``spec`` under ``options``.

    Pure and fast: no weights are touched. Raises :class:`OptionsError` for options
    the model cannot take (a block size that does not fit a dimension, ...).
    """
    options = options.resolve()
    caps = options.caps
    dtype = options.dtype or caps.default_dtype
    limits = _Limits(options.max_buffer_size, caps.max_storage_binding_size)
    length = context_length(spec, options)

    sessions = []
    warnings: dict[str, list[str]] = {}  # message -> the sessions it is about
    for session in sessions_for(spec, options, length):
        # The decoder runs once per token: its float linears are latency-bound.
        split_k = caps.split_k.get(dtype, 1) if session.name == "decoder" else 1
        planned = {
            w.name: _plan_weight(w, options, limits, w.dtype or dtype, split_k)
            for w in session.weights()
        }
        for wp in planned.values():
            _check_gbq_blocks(wp, options)
        for name, owner in session.ties.items():
            planned[name] = _tied(name, planned[owner], options)
        weights = tuple(planned.values())
        for message in _limit_warnings(weights, limits) + _float_expert_warnings(weights, options):
            warnings.setdefault(message, []).append(session.name)
        sessions.append(SessionPlan(session.name, session.filename, weights, session))
    # A tensor two sessions hold (the token table of the embedding session and the
    # decoder's tied head) is said once.
    said = tuple(
        message if len(names) == 1 else f"{message} (in the {' and '.join(names)} sessions)"
        for message, names in warnings.items()
    )
    return ExportPlan(
        spec, options, caps, length, tuple(sessions), attention_path(spec, options), said
    )


def _float_expert_warnings(weights: tuple[WeightPlan, ...], options: ExportOptions) -> list[str]:
    """Quantization was asked for, but the EP cannot read quantized experts."""
    kept = [w for w in weights if w.weight.role == "experts" and w.storage == "float"]
    if options.weight_bits is None or not kept:
        return []
    return [
        f"{len(kept)} expert tensors ({sum(w.nbytes for w in kept):,} B) stay {kept[0].dtype}: "
        f"{options.caps.display_name} has no GatherBlockQuantized to read quantized experts"
    ]


def _check_gbq_blocks(wp: WeightPlan, options: ExportOptions) -> None:
    """Refuse 4-bit GatherBlockQuantized rows with an odd block count on EPs that cannot
    read them (their zero points end in a padding nibble)."""
    caps = options.caps
    if not caps.even_gbq_blocks(wp.bits) or wp.storage != "gbq" or wp.block_size is None:
        return
    for piece in wp.pieces:
        width = piece.tensors[0].shape[-1] * 2  # 4-bit codes: two per byte
        if -(-width // wp.block_size) % 2:  # a partial last block counts
            fitting = [b for b in BLOCK_SIZES if -(-width // b) % 2 == 0]
            eight_bits = (
                option("weight_bits", "8")
                if wp.weight.role == "experts"
                else option("embedding_bits", "8")
            )
            raise OptionsError(
                f"{wp.name}: {caps.display_name}'s GatherBlockQuantized cannot read 4-bit rows "
                f"of {-(-width // wp.block_size)} blocks (an odd count); choose a "
                f"{option('block_size')} that gives an even count "
                f"({', '.join(map(str, fitting)) or 'none fits'}) or {eight_bits}"
            )


def _limit_warnings(weights: tuple[WeightPlan, ...], limits: _Limits) -> list[str]:
    """What the user should know about weights over the EP's buffer limits, and what to
    do about it."""
    binding_advice = (
        f"adapters that grant larger storage bindings run it, others need a lower "
        f"{option('max_buffer_size')}"
    )
    warnings = []
    for wp in weights:
        if wp.shares:
            continue
        if "max_buffer_size" in wp.exceeds and not wp.is_split:
            warnings.append(
                f"{wp.name} ({format_bytes(wp.unsplit_nbytes)}) exceeds the buffer limit "
                f"({format_bytes(limits.buffer or 0)}): {wp.note}"
            )
        if wp.pieces_exceed:
            largest = format_bytes(max(p.largest_buffer for p in wp.pieces))
            if "max_buffer_size" in wp.pieces_exceed:
                what = f"the buffer limit ({format_bytes(limits.buffer or 0)})"
                advice = f"raise {option('max_buffer_size')} or keep the tensor in fewer bits"
            else:
                what = (
                    f"the spec-default storage binding size ({format_bytes(limits.binding or 0)})"
                )
                advice = binding_advice
            warnings.append(
                f"{wp.name}: split into {len(wp.pieces)} pieces of up to {largest}, still over "
                f"{what}; {advice}"
            )
        elif "max_storage_binding_size" in wp.exceeds and not wp.is_split:
            warnings.append(
                f"{wp.name} ({format_bytes(wp.unsplit_nbytes)}) exceeds the spec-default "
                f"storage binding size ({format_bytes(limits.binding or 0)}); {binding_advice}"
            )
    return warnings
