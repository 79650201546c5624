"""Can a window open here? Checked before Qt is asked, so the answer is ours, in one line.

Two things stop the studio on a Linux box before any window: no display at all (a server,
a container, an SSH session), and Qt's X11 plugin missing system libraries (a fresh Debian
lacks ``libxcb-cursor0`` and ``libxcb-icccm4``; Qt then prints a page about plugins and
aborts). The first is detected from the environment; the second by asking the dynamic
linker which libraries of Qt's X11 platform library it cannot find. Neither imports Qt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

HEADLESS_PLATFORMS = ("offscreen", "minimal", "vnc", "eglfs", "linuxfb", "vkkhrdisplay")
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
_CANNOT_OPEN = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file")


def display_problem(env: Mapping[str, str] | None = None, platform: str = sys.platform) -> str:
    """Why no window can be shown here ("" when one can, or Qt is told not to need one)."""
    env = os.environ if env is None else env
    qpa = env.get("QT_QPA_PLATFORM", "")
    if platform != "linux" or qpa.startswith(HEADLESS_PLATFORMS):
        return ""
    if qpa.startswith("wayland"):
        return (
            "" if env.get("WAYLAND_DISPLAY") else "no Wayland display ($WAYLAND_DISPLAY is unset)"
        )
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return ""
    return "no display ($DISPLAY and $WAYLAND_DISPLAY are unset)"


def uses_xcb(env: Mapping[str, str] | None = None, platform: str = sys.platform) -> bool:
    """Whether Qt will use its X11 (xcb) plugin here."""
    env = os.environ if env is None else env
    qpa = env.get("QT_QPA_PLATFORM", "")
    if platform != "linux" or not env.get("DISPLAY"):
        return False
    return qpa in ("", "xcb") or (qpa.startswith("wayland") and not env.get("WAYLAND_DISPLAY"))


def xcb_library() -> Path | None:
    """Qt's X11 platform library inside the installed PySide6 (None when not found)."""
    import importlib.util

    spec = importlib.util.find_spec("PySide6")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent / "Qt"
    for candidate in (
        *sorted(root.glob("lib/libQt6XcbQpa.so*")),
        root / "plugins/platforms/libqxcb.so",
    ):
        if candidate.is_file():
            return candidate
    return None


def missing_libraries(library: Path) -> list[str]:
    """Shared libraries ``library`` needs that the dynamic linker cannot find (sonames)."""
    ldd = shutil.which("ldd")
    if ldd is not None:
        result = subprocess.run([ldd, str(library)], capture_output=True, text=True, timeout=30)
        return sorted(set(_NOT_FOUND.findall(result.stdout)))
    import ctypes

    try:  # without ldd: loading reports the first missing library
        ctypes.CDLL(str(library))
    except OSError as exc:
        return _CANNOT_OPEN.findall(str(exc))
    return []


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package that ships a library: ``libxcb-cursor.so.0`` ->
    ``libxcb-cursor0``, ``libxkbcommon-x11.so.0`` -> ``libxkbcommon-x11-0`` (Debian's
    naming rule: the soname's version appended, after a hyphen when the name ends in a digit)."""
    name, _, version = soname.partition(".so")
    version = version.lstrip(".").split(".")[0]
    separator = "-" if name[-1:].isdigit() and version else ""
    return f"{name}{separator}{version}".lower()


def install_line(sonames: list[str]) -> str:
    """The command that installs these libraries (apt where there is apt)."""
    packages = " ".join(debian_package(s) for s in sonames)
    if shutil.which("apt-get"):
        return f"sudo apt-get install -y {packages}"
    return f"install your distribution's packages for {', '.join(sonames)} (Debian: {packages})"


def xcb_problem(env: Mapping[str, str] | None = None) -> str:
    """Why Qt's X11 plugin would fail to load here, with the install line ("" if it loads)."""
    if not uses_xcb(env):
        return ""
    library = xcb_library()
    missing = missing_libraries(library) if library is not None else []
    if not missing:
        return ""
    return (
        f"Qt's X11 support needs {', '.join(missing)}, which this system lacks; "
        f"install {'it' if len(missing) == 1 else 'them'} with: {install_line(missing)}"
    )
