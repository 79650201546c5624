"""Byte sizes for people, and back."""

from __future__ import annotations

import pytest

from engine.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("n", "plain", "compact"),
    [
        (512, "512 B", "512 B"),
        (256 * 1024**2, "256.0 MiB", "256 MiB"),
        (1536 * 1024**2, "1.5 GiB", "1.5 GiB"),
        (4 * 1024**3 - 1, "4.0 GiB", "4 GiB"),
    ],
)
def test_compact_sizes_drop_only_a_zero_decimal(n: int, plain: str, compact: str):
    """A narrow control (the buffer limit's "EP default (256 MiB)") shows the compact form;
    both read back as sizes."""
    assert format_bytes(n) == plain
    assert format_bytes(n, compact=True) == compact
    assert parse_bytes(compact.replace(" ", "")) == pytest.approx(n, rel=0.05)
