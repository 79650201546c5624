"""Tensors that live on the EP's device at fixed addresses and are rewritten in place.

Graph capture replays recorded work on the buffers it saw while capturing, without
looking at the run's feeds again, so inputs must be written into the *same* device
buffers before each replay. ``IOBinding.bind_cpu_input`` uploads into a fresh buffer each
time (right only when the allocator happens to reuse the old one), and the WebGPU Python
package cannot create device OrtValues from numpy. Where that is refused, a tiny
``Identity`` session on the same EP writes host arrays into the pinned device buffers:
its outputs are bound to them, so every run overwrites them in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from engine.errors import RuntimeUnavailableError, option

_ONNX_TYPES = {
    np.dtype(np.float32): 1,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.float16): 10,
}
BF16 = np.dtype(ml_dtypes.bfloat16)
"""numpy's bfloat16 (ml_dtypes): onnxruntime's Python binding takes no such array, so these
go through their raw 16 bits (:func:`host_value`, :func:`device_value`)."""
BF16_TYPE = 16  # ONNX TensorProto.BFLOAT16


class StaticTensors:
    """Named device tensors of fixed shape and dtype, written from host arrays.

    Args:
        specs: name -> (shape, numpy dtype).
        device: IOBinding device name ("cpu", "cuda", "webgpu", ...).
        provider: The onnxruntime provider that owns the device.
    """

    def __init__(
        self,
        specs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        device: str,
        provider: str,
    ) -> None:
        self.specs = {name: (tuple(shape), np.dtype(dt)) for name, (shape, dt) in specs.items()}
        self.device = device
        self.provider = provider
        self.values: dict[str, Any] = {}
        self._uploader: Any = None
        self._binding: Any = None

    def write(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copy host arrays into the device tensors (allocating them on first use)."""
        if not self.values:
            self._allocate(arrays)
            return
        if self._uploader is None:
            for name, array in arrays.items():
                self.values[name].update_inplace(_raw(self._checked(name, array)))
            return
        for name, array in arrays.items():
            self._binding.bind_cpu_input(name, self._checked(name, array))
        self._uploader.run_with_iobinding(self._binding)

    def _checked(self, name: str, array: np.ndarray) -> np.ndarray:
        shape, dtype = self.specs[name]
        if array.shape != shape or array.dtype != dtype:
            raise ValueError(
                f"{name}: expected {dtype}{list(shape)}, got {array.dtype}{list(array.shape)}"
            )
        return np.ascontiguousarray(array)

    def _allocate(self, arrays: Mapping[str, np.ndarray]) -> None:

        missing = set(self.specs) - set(arrays)
        if missing:
            raise ValueError(f"first write must set every tensor; missing {sorted(missing)}")
        made = {
            name: device_value(self._checked(name, arrays[name]).copy(), self.device)
            for name in self.specs
        }
        if all(value is not None for value in made.values()):
            self.values = made
            return
        self.values = {}  # this onnxruntime cannot allocate on the device: upload instead
        self._uploader = identity_session(self.specs, self.provider)
        self._binding = self._uploader.io_binding()
        for name in self.specs:
            self._binding.bind_cpu_input(name, self._checked(name, arrays[name]))
            self._binding.bind_output(name + "_out", self.device)
        self._uploader.run_with_iobinding(self._binding)
        self.values = dict(zip(self.specs, self._binding.get_outputs(), strict=True))
        for name, value in self.values.items():
            self._binding.bind_ortvalue_output(name + "_out", value)


def device_value(array: np.ndarray, device: str) -> Any:
    """``array`` as an OrtValue on ``device``, or None where this onnxruntime cannot make
    device buffers from numpy (onnxruntime-webgpu 1.27: an upload session does it then)."""
    import onnxruntime as ort

    try:
        if array.dtype != BF16:
            return ort.OrtValue.ortvalue_from_numpy(array, device, 0)
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), BF16_TYPE, device, 0)
        value.update_inplace(_raw(array))
        return value
    except (RuntimeError, ValueError, TypeError):
        return None


def host_value(array: np.ndarray) -> Any:
    """``array`` as a host OrtValue, bfloat16 included."""
    import onnxruntime as ort

    if array.dtype == BF16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(_raw(array), BF16_TYPE)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _raw(array: np.ndarray) -> np.ndarray:
    """What onnxruntime's Python binding copies: bfloat16 as its bits (uint16)."""
    return array.view(np.uint16) if array.dtype == BF16 else array


def identity_session(specs: Mapping[str, tuple[tuple[int, ...], np.dtype]], provider: str) -> Any:
    """An onnxruntime session copying each input ``x`` to output ``x_out`` on ``provider``."""
    import onnxruntime as ort

    try:
        import onnx  # noqa: F401  (identity_model builds with it)
    except ImportError as exc:
        raise RuntimeUnavailableError(
            "the onnx package is needed to keep inputs on this EP's device; pip install onnx"
        ) from exc
    for name, (_, dtype) in specs.items():
        if dtype not in _ONNX_TYPES:
            raise RuntimeUnavailableError(
                f"{name}: {dtype} tensors cannot be uploaded by this runner; "
                f"use {option('runtime', 'genai')} for this package"
            )
    model = identity_model(
        {name: (shape, _ONNX_TYPES[dtype]) for name, (shape, dtype) in specs.items()}
    )
    providers = (
        [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    )
    return ort.InferenceSession(model.SerializeToString(), providers=providers)


def identity_model(specs: Mapping[str, tuple[Sequence[int | str], int]]) -> Any:
    """An ONNX model copying each input ``x`` to output ``x_out``: name -> (shape, ONNX
    element type); a dimension may be symbolic (a string)."""
    from onnx import helper

    inputs, outputs, nodes = [], [], []
    for name, (shape, elem) in specs.items():
        inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        outputs.append(helper.make_tensor_value_info(name + "_out", elem, list(shape)))
        nodes.append(helper.make_node("Identity", [name], [name + "_out"]))
    graph = helper.make_graph(nodes, "identity", inputs, outputs)
    # IR 10 / opset 21: onnxruntime-webgpu 1.27 refuses newer IR versions.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
