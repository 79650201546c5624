"""Checks of the Qt binding that the app cannot work around.

PySide6 6.12.0 on CPython 3.11 returns ``None`` from every void method, and ``True`` from
``Signal.emit``, without taking a reference. Each call lowers the singleton's reference
count by one, and the interpreter aborts ("none_dealloc: deallocating None") at exit or
mid-session. CPython 3.12+ makes those singletons immortal, and PySide6 6.11 is not
affected. The problem is detected by measurement, so a fixed release passes.
"""

from __future__ import annotations

import gc
import sys

FIX = (
    "install PySide6-Essentials 6.11 (pip install 'PySide6-Essentials<6.12') "
    "or run on Python 3.12 or newer"
)


def binding_problem() -> str | None:
    """A message when the installed PySide6 corrupts reference counts here, else None."""
    from PySide6 import __version__ as version
    from PySide6.QtCore import QObject, Signal

    class Probe(QObject):
        ping = Signal()

    probe = Probe()
    calls = 16
    # The collector could free unrelated objects holding None mid-measurement.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = sys.getrefcount(None), sys.getrefcount(True)
        for _ in range(calls):
            probe.setObjectName("probe")
            probe.ping.emit()
        after = sys.getrefcount(None), sys.getrefcount(True)
        _give_back(None, before[0] - after[0])
        _give_back(True, before[1] - after[1])
    finally:
        if was_enabled:
            gc.enable()
    # A broken binding loses one reference per call; allow for unrelated noise.
    if before[0] - after[0] < calls // 2 and before[1] - after[1] < calls // 2:
        return None
    python = ".".join(map(str, sys.version_info[:3]))
    return (
        f"PySide6 {version} on Python {python} corrupts reference counts (None/True) and "
        f"crashes the app; {FIX}"
    )


def _give_back(singleton: object, count: int) -> None:
    """Restore references the probe itself lost, so probing never causes the crash."""
    import ctypes

    for _ in range(max(count, 0)):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(singleton))
