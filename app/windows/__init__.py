"""Top-level windows (layout and wiring only)."""
