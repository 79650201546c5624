"""Float dtypes by their short names, as numpy, ONNX IR and byte sizes see them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir

_NUMPY = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "uint8": np.dtype(np.uint8),
}
# ONNX TensorProto data types; onnx_ir (which imports sympy) is loaded only when asked.
_ONNX_TYPES = {"fp32": 1, "fp16": 10, "bf16": 16, "uint8": 2}
_SAFETENSORS = {
    "F32": "fp32",
    "F16": "fp16",
    "BF16": "bf16",
    "U8": "uint8",
}


def numpy_dtype(name: str) -> np.dtype:
    return _NUMPY[name]


def ir_dtype(name: str) -> ir.DataType:
    import onnx_ir as ir

    return ir.DataType(_ONNX_TYPES[name])


def itemsize(name: str) -> int:
    return _NUMPY[name].itemsize


def from_safetensors(code: str) -> str | None:
    """Our short name of a safetensors dtype code, or None if we do not read it."""
    return _SAFETENSORS.get(code)
