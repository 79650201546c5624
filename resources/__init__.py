"""Runtime data shipped with Export Studio (presets, icons, schemas).

Everything is found through :func:`resource_path`, which works from a source checkout,
an installed wheel and a PyInstaller bundle (where this package is collected as data
next to the frozen modules).
"""

from __future__ import annotations

import sys
from pathlib import Path


def resource_root() -> Path:
    """The folder holding the resources, frozen or not."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle is not None:
        frozen = Path(bundle) / "resources"
        if frozen.is_dir():
            return frozen
    return Path(__file__).resolve().parent


def resource_path(*parts: str) -> Path:
    """Path of a resource file, e.g. ``resource_path("presets", "gemma4-tiny.json")``."""
    return resource_root().joinpath(*parts)
