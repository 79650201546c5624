"""Checks that run before an export does any work, and what the user must be told up front.

An export is refused, with the numbers, when its destination must not or cannot be written
(:func:`engine.package.check_destination`), when the plan needs more disk space than the
destination has or more memory at once than the machine has, when a ``keep_float``
pattern names no weight, and when a tensor is larger than a buffer limit the user chose
(unless they force it). What is merely worth knowing (a clamped length, a package over the
EP's default buffer limit, leftovers of killed exports removed) comes back as notes.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from engine.errors import OptionsError, PackageError, option
from engine.package import check_destination, existing_ancestor, remove_stale
from engine.plan import ExportPlan, WeightPlan
from engine.units import format_bytes

_FLOAT32_BYTES = 4
_ROPE_TEMPORARIES = 3
"""A RoPE cache is computed from float32 angles with its cos and sin beside them."""


@dataclass(frozen=True)
class Preflight:
    """The checked destination and what to tell the user before the export starts."""

    output: Path
    notes: tuple[str, ...]


def preflight(
    export_plan: ExportPlan,
    output: str | os.PathLike[str],
    *,
    overwrite: bool,
    model_dir: str | os.PathLike[str] | None = None,
) -> Preflight:
    """Everything an export checks before reading a weight; removes stale leftovers.

    Raises:
        EngineError: A reason not to start, with what to change.
    """
    out = check_destination(output, overwrite, protect=[model_dir])
    check_keep_float(export_plan)
    check_buffer_limit(export_plan)
    check_resources(export_plan, out)
    notes = plan_notes(export_plan)
    notes += remove_stale(out)
    return Preflight(out, tuple(notes))


def plan_notes(export_plan: ExportPlan) -> list[str]:
    """What the user should know about a plan they may still export (option markup kept)."""
    notes = []
    options, spec = export_plan.options, export_plan.spec
    if export_plan.caps.untested:
        notes.append(export_plan.caps.untested_note())
    if options.max_length is not None and options.max_length > export_plan.context_length:
        notes.append(
            f"{option('max_length', f'{options.max_length:,}')} is longer than the model's "
            f"max_position_embeddings; the package supports {export_plan.context_length:,} "
            f"tokens ({spec.name} was trained for no more)"
        )
    over = over_buffer_limit(export_plan)
    if over:
        largest = max(over, key=_largest_buffer)
        notes.append(
            f"WARNING: {len(over)} tensor(s) are larger than the buffer limit of "
            f"{format_bytes(options.max_buffer_size or 0)} (the largest, {largest.name}, is "
            f"{format_bytes(_largest_buffer(largest))}): this package will not load on "
            f"{export_plan.caps.display_name} where the device grants only that limit. Quantize "
            f"({option('weight_bits', 4)}, {option('embedding_bits', 4)}) or raise "
            f"{option('max_buffer_size')} if your devices grant more"
        )
    return notes


def over_buffer_limit(export_plan: ExportPlan) -> list[WeightPlan]:
    """Weights with a stored buffer over the plan's ``max_buffer_size``, even after splits."""
    return [
        wp
        for session in export_plan.sessions
        for wp in session.weights
        if not wp.shares
        and (
            "max_buffer_size" in wp.pieces_exceed
            or ("max_buffer_size" in wp.exceeds and not wp.is_split)
        )
    ]


def _largest_buffer(wp: WeightPlan) -> int:
    return max(p.largest_buffer for p in wp.pieces)


def check_buffer_limit(export_plan: ExportPlan) -> None:
    """Refuse a package over a buffer limit the user chose, unless they force it."""
    options = export_plan.options
    if options.force or options.max_buffer_size == export_plan.caps.max_buffer_size:
        return
    over = over_buffer_limit(export_plan)
    if not over:
        return
    largest = max(over, key=_largest_buffer)
    raise OptionsError(
        f"{len(over)} tensor(s) are larger than the buffer limit you chose "
        f"({option('max_buffer_size', format_bytes(options.max_buffer_size or 0))}); the "
        f"largest, {largest.name}, is {format_bytes(_largest_buffer(largest))} and cannot be "
        f"split under it ({largest.note or 'not splittable'}). A device with that limit could "
        f"not load the package. Raise the limit, quantize ({option('weight_bits', 4)}, "
        f"{option('embedding_bits', 4)}), or pass {option('force')} to write it anyway"
    )


def check_keep_float(export_plan: ExportPlan) -> None:
    """Refuse a ``keep_float`` or ``keep_int8`` pattern that names no weight (a typo would
    change nothing)."""
    weights = [wp for session in export_plan.sessions for wp in session.weights]
    names = [wp.name for wp in weights]
    # keep_int8 acts on weights that are quantized and hold their own bytes (not a tied
    # head that reads the table's, not a norm).
    quantized = [wp.name for wp in weights if wp.quantized and not wp.shares]
    options = export_plan.options
    flags = [(option("keep_float", p), p, names, "weight") for p in options.keep_float]
    flags += [(option("keep_int8", p), p, quantized, "quantized weight") for p in options.keep_int8]
    for flag, pattern, pool, what in flags:
        if not any(fnmatchcase(name, pattern) for name in pool):
            examples = [n for n in pool if n.endswith("proj.weight")][:2] or pool[:2]
            raise OptionsError(
                f"{flag} matches no {what} of this model; names look "
                f"like {', '.join(examples)} ('*' matches any characters, dots included)"
            )


def check_resources(export_plan: ExportPlan, output: Path) -> None:
    """Refuse a plan larger than the free disk space or the memory one tensor needs."""
    need = export_plan.nbytes
    disk = existing_ancestor(output.parent)
    try:
        free = shutil.disk_usage(disk).free
    except OSError:
        free = None
    if free is not None and need > free:
        raise PackageError(
            f"the package would take {format_bytes(need)} ({need:,} B) but '{disk}' has only "
            f"{format_bytes(free)} free; free some space, choose a folder on another disk, or "
            f"make the package smaller ({option('weight_bits', 4)}, "
            f"{option('embedding_bits', 4)}, a shorter {option('max_length')})"
        )
    memory = available_memory()
    name, at_once = largest_in_memory(export_plan)
    if memory is not None and at_once > memory:
        raise PackageError(
            f"writing {name} needs at least {format_bytes(at_once)} of memory at once, and "
            f"only {format_bytes(memory)} is available to this process; "
            + (
                f"choose a shorter {option('max_length')}"
                if name.startswith("rope.")
                else f"quantize it or lower {option('max_buffer_size')} so it is split"
            )
        )


def largest_in_memory(export_plan: ExportPlan) -> tuple[str, int]:
    """The tensor (piece) the writer holds in memory whole, and a lower bound of its bytes."""
    best = ("nothing", 0)
    for session in export_plan.sessions:
        for wp in session.weights:
            if wp.shares:
                continue
            for piece in wp.pieces:
                size = piece.nbytes
                if wp.weight.role == "rope_cache":
                    rows, cols = piece.tensors[0].shape
                    size = rows * cols * _FLOAT32_BYTES * _ROPE_TEMPORARIES
                if size > best[1]:
                    best = (wp.name, size)
    return best


def available_memory() -> int | None:
    """Memory this process can still get (RAM and swap, within its address-space limit),
    or None if unknown."""
    machine = _machine_memory()
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return machine
    if limit in (resource.RLIM_INFINITY, -1):
        return machine
    return limit if machine is None else min(machine, limit)


def _machine_memory() -> int | None:
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = int(value.split()[0]) * 1024
        return fields["MemAvailable"] + fields.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
