"""Export Studio's desktop app: a PySide6 face over the engine.

The only package that imports Qt. Windows lay out and wire; state lives in
:class:`app.state.StudioState`; long work runs in :mod:`app.workers`. Importing ``app``
itself is free: Qt, pyqtgraph and the engine are imported where they are used.
"""

from __future__ import annotations

APP_NAME = "Export Studio"
ORG_NAME = "ExportStudio"
