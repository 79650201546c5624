"""Byte sizes for people: ``format_bytes(268435456) == '256.0 MiB'`` and back."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def format_bytes(n: int | float, compact: bool = False) -> str:
    """Binary units with one decimal: B, KiB, MiB, GiB, TiB; ``compact`` drops a ".0"
    (256 MiB, where a narrow control shows it)."""
    value = float(n)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            break
    text = f"{value:.1f}"
    return f"{text[:-2] if compact and text.endswith('.0') else text} {unit}"


def parse_bytes(text: str) -> int:
    """Parse '268435456', '256MiB', '256 MiB', '1.5GiB', '300MB' into bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read '{text}' as a size; write e.g. 268435456, 256MiB or 1GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def exact_size(n: int) -> str:
    """Bytes as :func:`parse_bytes` reads them back exactly: in the largest binary unit that
    divides them (``256MiB``), else the plain number."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n % scale == 0 and parse_bytes(f"{n // scale}{unit}") == n:
            return f"{n // scale}{unit}"
    return str(n)


def rounded_up_size(n: int, decimals: int = 2) -> str:
    """Bytes rounded up to ``decimals`` decimals of the largest binary unit they reach
    (``288481`` -> ``'281.72KiB'``), so that :func:`parse_bytes` reads back at least ``n``;
    exact multiples and sizes under 1 KiB as :func:`exact_size` writes them."""
    units = [(u, s) for u, s in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)) if n >= s]
    if not units or n % units[0][1] == 0:
        return exact_size(n)
    unit, scale = units[0]
    step = 10**decimals
    count = -(-n * step // scale)  # the ceiling, in steps of the last decimal
    while True:  # parse_bytes goes through a float: one step more where it reads short
        whole, part = divmod(count, step)
        text = f"{whole}.{part:0{decimals}d}".rstrip("0").rstrip(".") + unit
        if parse_bytes(text) >= n:
            return text
        count += 1
