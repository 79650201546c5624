"""ONNX Runtime as the reference for the quantizer: its own quantizer, and one-op graphs.

Used by the tests and the throughput benchmark; nothing here runs during an export.
onnx and onnxruntime are imported inside the functions so that importing the package
stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from engine.quantize.blocks import QuantizedBlocks
from engine.quantize.packing import packed_width

if TYPE_CHECKING:
    import onnx

__all__ = [
    "IR_VERSION",
    "gather_block_quantized_model",
    "matmul_nbits_model",
    "ort_quantize",
    "run_model",
]

IR_VERSION = 10
"""IR version the one-op models are saved with (onnx 1.23 writes a newer one by default)."""

_ONNX_TYPE = {"float32": 1, "float16": 10, "bfloat16": 16}  # onnx.TensorProto codes


def _matmul_model(b: np.ndarray) -> onnx.ModelProto:
    from onnx import helper, numpy_helper

    k, n = b.shape
    elem = _ONNX_TYPE[b.dtype.name]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "B"], ["y"], name="matmul")],
        "one_matmul",
        [helper.make_tensor_value_info("x", elem, [1, k])],
        [helper.make_tensor_value_info("y", elem, [1, n])],
        [numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = IR_VERSION
    return model


def ort_quantize(
    weight: np.ndarray, *, bits: int, block_size: int, symmetric: bool
) -> QuantizedBlocks:
    """Quantize ``weight`` ``[N, K]`` with ONNX Runtime's ``MatMulNBitsQuantizer``.

    Builds a one-MatMul model whose B is ``weight.T`` (``[K, N]``, in ``weight``'s dtype),
    runs the default (MLAS round-to-nearest) algorithm in QOperator format and reads back
    the MatMulNBits initializers, reshaped to the :class:`QuantizedBlocks` layout.

    Args:
        weight: float32 or float16 ``[N, K]``.
        bits: 4 or 8.
        block_size: Values per block along K.
        symmetric: Symmetric quantization. ONNX Runtime then stores no zero points; the
            returned ones are the implicit 8 / 128.

    Returns:
        The quantizer's bytes: qweight ``[N, blocks * bs * bits // 8]`` (K padded with zeros to
        whole blocks, as the quantizer does), scales ``[N, blocks]`` in ``weight``'s dtype,
        zero points; ``blocks = ceil(K / bs)``.
    """
    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    n, k = weight.shape
    model = _matmul_model(np.ascontiguousarray(weight.T))
    quantizer = MatMulNBitsQuantizer(
        model, bits=bits, block_size=block_size, is_symmetric=symmetric
    )
    quantizer.process()
    inits = {t.name: t for t in quantizer.model.model.graph.initializer}
    blocks = -(-k // block_size)
    qweight = numpy_helper.to_array(inits[f"B_Q{bits}"]).reshape(n, blocks * block_size * bits // 8)
    scales = numpy_helper.to_array(inits["B_scales"]).reshape(n, blocks)
    if symmetric:
        zp = np.full((n, packed_width(blocks, bits)), 0x88 if bits == 4 else 0x80, np.uint8)
    else:
        zp = numpy_helper.to_array(inits["B_zero_points"]).reshape(n, -1)
    return QuantizedBlocks(qweight, scales, zp)


def _finish(graph: Any) -> onnx.ModelProto:
    from onnx import checker, helper

    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = IR_VERSION
    checker.check_model(model)
    return model


def matmul_nbits_model(
    blocks: QuantizedBlocks, *, k: int, n: int, bits: int, block_size: int, batch: int
) -> onnx.ModelProto:
    """A model ``y = MatMulNBits(x, B)`` with input ``x`` ``[batch, K]``.

    Args:
        blocks: The quantized weight ``[N, K]``, K padded to whole blocks.
        k: In features (the op's K, before padding).
        n: Out features.
        bits: 4 or 8.
        block_size: Values per block.
        batch: Rows of ``x``.

    Returns:
        The model (IR 10, opset 21, com.microsoft 1), zero points always given.
    """
    from onnx import helper, numpy_helper

    elem = _ONNX_TYPE[blocks.scales.dtype.name]
    b = blocks.qweight.reshape(n, -(-k // block_size), block_size * bits // 8)
    node = helper.make_node(
        "MatMulNBits",
        ["x", "B", "scales", "zero_points"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block_size,
        accuracy_level=0,
    )
    graph = helper.make_graph(
        [node],
        "matmul_nbits",
        [helper.make_tensor_value_info("x", elem, [batch, k])],
        [helper.make_tensor_value_info("y", elem, [batch, n])],
        [
            numpy_helper.from_array(b, "B"),
            numpy_helper.from_array(blocks.scales, "scales"),
            numpy_helper.from_array(blocks.zero_points, "zero_points"),
        ],
    )
    return _finish(graph)


def gather_block_quantized_model(
    blocks: QuantizedBlocks, *, bits: int, block_size: int, num_ids: int
) -> onnx.ModelProto:
    """A model ``y = GatherBlockQuantized(table, ids)`` over a quantized ``[V, D]`` table.

    Args:
        blocks: The quantized table; its qweight as GatherBlockQuantized takes it (for a
            width that is not whole blocks, :meth:`QuantizedBlocks.gather_data`).
        bits: 4 or 8.
        block_size: Values per block.
        num_ids: Length of the int64 ``ids`` input.

    Returns:
        The model (IR 10, opset 21, com.microsoft 1) with gather_axis 0, quantize_axis 1 and
        zero points always given.
    """
    from onnx import helper, numpy_helper

    elem = _ONNX_TYPE[blocks.scales.dtype.name]
    cols = blocks.qweight.shape[1] * 8 // bits
    node = helper.make_node(
        "GatherBlockQuantized",
        ["data", "ids", "scales", "zero_points"],
        ["y"],
        domain="com.microsoft",
        gather_axis=0,
        quantize_axis=1,
        block_size=block_size,
        bits=bits,
    )
    graph = helper.make_graph(
        [node],
        "gather_block_quantized",
        [helper.make_tensor_value_info("ids", 7, [num_ids])],
        [helper.make_tensor_value_info("y", elem, [num_ids, cols])],
        [
            numpy_helper.from_array(blocks.qweight, "data"),
            numpy_helper.from_array(blocks.scales, "scales"),
            numpy_helper.from_array(blocks.zero_points, "zero_points"),
        ],
    )
    return _finish(graph)


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Run a one-output model on the CPU execution provider and return its output."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])
