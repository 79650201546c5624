"""Float dtypes by their short names, as numpy, ONNX IR and byte sizes see them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

_NUMPY = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "uint8": np.dtype(np.uint8),
}
_IR = {
    "fp32": ir.DataType.FLOAT,
    "fp16": ir.DataType.FLOAT16,
    "bf16": ir.DataType.BFLOAT16,
    "uint8": ir.DataType.UINT8,
}
_SAFETENSORS = {
    "F32": "fp32",
    "F16": "fp16",
    "BF16": "bf16",
    "U8": "uint8",
}


def numpy_dtype(name: str) -> np.dtype:
    return _NUMPY[name]


def ir_dtype(name: str) -> ir.DataType:
    return _IR[name]


def itemsize(name: str) -> int:
    return _NUMPY[name].itemsize


def from_safetensors(code: str) -> str | None:
    """Our short name of a safetensors dtype code, or None if we do not read it."""
    return _SAFETENSORS.get(code)
