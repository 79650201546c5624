"""Start-up warm-up: load the export path in the background, then freeze the heap.

The window shows before the engine is imported. Once it is up, a worker imports the
export pipeline (onnx, onnxscript: a quarter second) so the first click on Export does not
pay for it, and then :func:`gc.freeze` moves everything loaded so far out of the
garbage collector's reach. Without that, full collections over the imported modules'
objects took ~100 ms, and a collection holds the GIL: the UI thread stalls with it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from PySide6.QtCore import QObject

from app.workers import Worker, start_worker
from engine.progress import CancelToken, Progress


def warm_up_job(progress: Progress, cancel: CancelToken) -> None:
    """Import what an export and a preview need (no torch, no transformers)."""
    import engine.pipeline
    import engine.plan  # noqa: F401


def freeze_heap() -> int:
    """Exclude every object alive now from future collections; returns how many."""
    gc.freeze()
    return gc.get_freeze_count()


def start_warm_up(owner: QObject, on_done: Callable[[], None] | None = None) -> Worker:
    """Run the warm-up in a worker, freeze the heap when it is done, then call ``on_done``."""

    def finished() -> None:
        freeze_heap()
        if on_done is not None:
            on_done()

    return start_worker(warm_up_job, owner=owner, name="warm-up", on_finished=finished)
