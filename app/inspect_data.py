"""What the package inspector draws, from an :class:`engine.inspect.PackageInfo` (no Qt).

The same chart types as the preview (bytes per session, the largest tensors against the
EP's limits), fed by what a package folder actually holds instead of what a plan promises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.preview_data import SessionSize, TensorBar
from engine.caps import get_caps

if TYPE_CHECKING:
    from engine.inspect import PackageInfo

TOP_TENSORS = 12


@dataclass(frozen=True)
class Limits:
    """The buffer limits a package's tensors are held against, and where they come from."""

    buffer: int | None
    binding: int | None
    source: str


def limits_for(info: PackageInfo) -> Limits:
    """The package's own limit (our manifest's options) or its EP's defaults."""
    ep = info.ep
    if ep is None:
        return Limits(None, None, "no EP named in the package: no limit applies")
    caps = get_caps(ep)
    options = (info.manifest or {}).get("options") or {}
    custom = options.get("max_buffer_size")
    if isinstance(custom, int) and custom != caps.max_buffer_size:
        return Limits(custom, caps.max_storage_binding_size, "the limit it was exported with")
    return Limits(
        caps.max_buffer_size, caps.max_storage_binding_size, f"{caps.display_name}'s default"
    )


def session_sizes(info: PackageInfo) -> tuple[SessionSize, ...]:
    """Bytes per session, by dtype (a foreign package has no roles, every one has dtypes)."""
    return tuple(SessionSize(s.name, s.filename, s.nbytes, s.by_dtype()) for s in info.sessions)


def tensor_bars(info: PackageInfo, limits: Limits) -> tuple[TensorBar, ...]:
    """The largest tensors: a split tensor as one bar (largest piece, and unsplit size),
    the rest one bar per initializer."""
    bars = []
    for session in info.sessions:
        grouped = set()
        for group in session.splits():
            grouped |= {t.name for t in group.tensors}
            bars.append(
                _bar(
                    group.base,
                    group.unsplit_largest,
                    group.largest,
                    group.pieces,
                    limits,
                    session.name,
                )
            )
        bars += [
            _bar(t.name, t.nbytes, t.nbytes, 1, limits, session.name)
            for t in session.initializers
            if t.name not in grouped
        ]
    bars.sort(key=lambda b: b.unsplit, reverse=True)
    return tuple(bars[:TOP_TENSORS])


def _bar(
    name: str, unsplit: int, largest: int, pieces: int, limits: Limits, session: str
) -> TensorBar:
    over = limits.buffer is not None and largest > limits.buffer
    binding = limits.binding is not None and largest > limits.binding
    return TensorBar(name, "", unsplit, largest, pieces, over, binding, session)
