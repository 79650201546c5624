"""Saves a model with its initializers in one external data file, streamed chunk by chunk.

``onnx_ir.save`` materializes each initializer whole before writing it, so the largest
tensor bounds the export's memory (E2B's fused per-layer table: 9.4 GB in fp32). Here every
initializer gets its offset first (the same dense layout ``onnx_ir.save`` writes), then each
piece of a planned weight is written from one pass over its source rows
(:meth:`PieceTensor.chunks`): the float data, or the codes, scales and zero points of a
quantized piece, each chunk at its place in its tensor. Memory stays at a few chunks per
worker whatever the model's size. The model proto is then saved with external references.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import onnx_ir as ir

from engine.weights.factory import PieceTensor, as_bytes

SIZE_THRESHOLD_BYTES = 256
"""Initializers up to this size stay inside the proto (``onnx_ir.save``'s default)."""

Written = Callable[[ir.TensorProtocol, int], None]
"""Called with a tensor and the bytes of it just written (from worker threads, one call at a
time); may raise (a cancel) to stop the save."""


@dataclass(frozen=True)
class _Slot:
    """Where one initializer's bytes go in the data file."""

    value: ir.Value
    tensor: ir.TensorProtocol
    offset: int
    length: int


def save(
    model: ir.Model,
    path: str | os.PathLike[str],
    data_name: str,
    *,
    on_written: Written | None = None,
    max_workers: int = 1,
    last: Collection[str] = (),
) -> None:
    """Save ``model`` to ``path`` with every initializer over
    :data:`SIZE_THRESHOLD_BYTES` in ``data_name`` beside it, streamed; the pieces of the
    planned weights ``last`` names are produced after every other tensor (their place in
    the data file is the same).

    The model is left as it was. The data file is always created (empty when nothing is
    external), like ``onnx_ir.save`` does.
    """
    path = Path(path)
    data_path = path.parent / data_name
    slots = _layout(model)
    with open(data_path, "wb") as f:
        f.truncate(sum(s.length for s in slots))
    _Writer(data_path, on_written).run(_jobs(slots, last), max_workers)
    originals = [(s.value, s.tensor) for s in slots]
    try:
        for slot in slots:
            slot.value.const_value = ir.ExternalTensor(
                data_name,
                slot.offset,
                slot.length,
                slot.tensor.dtype,
                shape=slot.tensor.shape,  # type: ignore[arg-type]
                name=slot.tensor.name or slot.value.name or "",
                base_dir=path.parent,
            )
        ir.save(model, path)
    finally:
        for value, tensor in originals:
            value.const_value = tensor


def _layout(model: ir.Model) -> list[_Slot]:
    """Dense offsets in initializer order, as ``onnx_ir.save`` lays them out."""
    slots = []
    offset = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None or tensor.nbytes <= SIZE_THRESHOLD_BYTES:
                continue
            slots.append(_Slot(value, tensor, offset, tensor.nbytes))
            offset += tensor.nbytes
    return slots


def _jobs(slots: list[_Slot], last: Collection[str] = ()) -> list[list[_Slot]]:
    """Slots written together: the parts of one planned piece, or one other tensor; those
    of the weights ``last`` names at the end."""
    jobs: dict[object, list[_Slot]] = {}
    for slot in slots:
        key = slot.tensor.group if isinstance(slot.tensor, PieceTensor) else id(slot)
        jobs.setdefault(key, []).append(slot)

    def deferred(job: list[_Slot]) -> bool:
        tensor = job[0].tensor
        return isinstance(tensor, PieceTensor) and tensor.weight.name in last

    return sorted(jobs.values(), key=deferred)


class _Stopped(Exception):
    """Another job failed: this one gives up between chunks."""


class _Writer:
    """Runs the write jobs, serially or on a thread pool; the first failure stops all."""

    def __init__(self, data_path: Path, on_written: Written | None) -> None:
        self.data_path = data_path
        self.on_written = on_written
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self, jobs: list[list[_Slot]], max_workers: int) -> None:
        if max_workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                self.write(job)
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
            futures = [pool.submit(self.write_or_stop, job) for job in jobs]
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            if self.error is not None:
                for future in futures:
                    future.cancel()
        if self.error is not None:
            raise self.error

    def write_or_stop(self, job: list[_Slot]) -> None:
        try:
            self.write(job)
        except _Stopped:
            pass
        except BaseException as exc:
            with self.lock:
                if self.error is None:
                    self.error = exc
            self.stop.set()
            raise

    def written(self, tensor: ir.TensorProtocol, nbytes: int) -> None:
        if self.stop.is_set():
            raise _Stopped
        if self.on_written is not None:
            with self.lock:
                self.on_written(tensor, nbytes)

    def write(self, job: list[_Slot]) -> None:
        if self.stop.is_set():
            return
        with open(self.data_path, "r+b") as f:
            first = job[0].tensor
            if not isinstance(first, PieceTensor):
                f.seek(job[0].offset)
                _write_whole(f, first)
                self.written(first, job[0].length)
                return
            filled = {id(slot): 0 for slot in job}
            for chunk in first.chunks():
                for slot in job:
                    tensor = slot.tensor
                    assert isinstance(tensor, PieceTensor)
                    data = as_bytes(chunk[tensor.planned.part])
                    f.seek(slot.offset + filled[id(slot)])
                    f.write(data)
                    filled[id(slot)] += len(data)
                    self.written(tensor, len(data))
        wrong = [
            f"{s.tensor.name}: {filled[id(s)]} of {s.length} bytes"
            for s in job
            if filled[id(s)] != s.length
        ]
        if wrong:
            raise AssertionError("streamed tensors do not match the plan: " + "; ".join(wrong))


def _write_whole(f: BinaryIO, tensor: ir.TensorProtocol) -> None:
    if hasattr(tensor, "tofile"):
        tensor.tofile(f)
    else:
        f.write(tensor.tobytes())
