"""Helpers for quantized-package tests and benchmarks/quantized_accuracy.py: teacher-forced
runs, metrics against the float package, reconstruction errors of exported weights, and the
dequantized transformers model a package must compute exactly."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from engine.options import ExportOptions
from engine.pipeline import ExportResult, export
from engine.plan import WeightPlan
from engine.quantize import QuantizedBlocks, dequantize

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
STEPS = 64  # prompt 12 + 64 = 76 positions: past every sliding window, within the 256 max
BLOCK = 16
CALM_QK = 0.25
"""Factor on the q_norm / k_norm weights that turns a raw fixture into its calm variant."""


# --------------------------------------------------------------------------- helpers


def calm_model(model: Any, factor: float = CALM_QK) -> Any:
    """A copy of a transformers Gemma 4 model with its q/k norm weights scaled by ``factor``."""
    import torch

    calm = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in calm.named_parameters():
            if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                param.mul_(factor)
    return calm


def forced_logits(package: Path, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Next-token logits [len(tokens) + 1, V] of a package fed ``prompt`` then ``tokens`` one at a
    time through its KV cache (teacher forcing), float32. A package whose attention writes
    into static buffers (``past_present_share_buffer``) gets them, as onnxruntime-genai
    gives them."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(package / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    index_dtype = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
    search = json.loads((package / "genai_config.json").read_text()).get("search", {})
    length = search["max_length"] if search.get("past_present_share_buffer") else 0
    past = {
        name: np.zeros(
            (1, info.shape[1], length, info.shape[3]),
            dtype=np.float16 if "float16" in info.type else np.float32,
        )
        for name, info in inputs.items()
        if name.startswith("past_key_values")
    }
    names = [o.name for o in session.get_outputs()]
    ids = np.array([prompt], dtype=index_dtype)
    total = len(prompt)
    rows = []
    for step in range(len(tokens) + 1):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), index_dtype), **past}
        outputs = dict(zip(names, session.run(None, feeds), strict=True))
        rows.append(outputs["logits"][0, -1].astype(np.float32))
        past = {
            name.replace("present", "past_key_values"): value
            for name, value in outputs.items()
            if name.startswith("present")
        }
        if step < len(tokens):
            ids = np.array([[tokens[step]]], dtype=index_dtype)
            total += 1
    return np.stack(rows)


def greedy_tokens(package: Path, prompt: list[int], steps: int) -> list[int]:
    from tests._support.ort_loop import ort_greedy

    tokens, _ = ort_greedy(package, prompt, steps)
    return tokens


def hf_forced_logits(model: Any, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """transformers' next-token logits for the same positions as :func:`forced_logits`."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt + tokens]))
    return out.logits[0, len(prompt) - 1 :].float().numpy()


def hf_stepwise_logits(model: Any, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """:func:`hf_forced_logits` the way :func:`forced_logits` runs: the prompt, then one
    token at a time through transformers' cache. They differ for longrope, whose keys keep
    the frequencies of the step that made them (short ones up to the original length)."""
    import torch

    rows = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        rows.append(out.logits[0, -1].float().numpy())
        for token in tokens:
            out = model(input_ids=torch.tensor([[token]]), cache=out.cache, use_cache=True)
            rows.append(out.logits[0, -1].float().numpy())
    return np.stack(rows)


@dataclass(frozen=True)
class Metrics:
    """A package's next-token logits against the float package's."""

    top1: float
    cos_mean: float
    cos_min: float
    max_abs: float
    mse: float

    def __str__(self) -> str:
        return (
            f"top1 {self.top1:.3f} cos mean {self.cos_mean:.6f} min {self.cos_min:.6f} "
            f"max abs {self.max_abs:.4f} mse {self.mse:.3e}"
        )


def compare(logits: np.ndarray, reference: np.ndarray) -> Metrics:
    a = logits.astype(np.float64)
    b = reference.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return Metrics(
        top1=float((a.argmax(-1) == b.argmax(-1)).mean()),
        cos_mean=float(cos.mean()),
        cos_min=float(cos.min()),
        max_abs=float(np.abs(a - b).max()),
        mse=float(((a - b) ** 2).mean()),
    )


def exported_weights(
    result: ExportResult, session: str = "decoder"
) -> Iterator[tuple[WeightPlan, np.ndarray]]:
    """Every quantized weight a package's ``session`` stores, dequantized back to float32 in
    its checkpoint layout ([rows, cols], or [E, N, K] experts), read from the written
    initializers."""
    planned = result.plan.session(session)
    model = onnx.load(str(result.output / planned.filename))
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for wp in planned.weights:
        if not wp.quantized or wp.shares:
            continue
        assert wp.bits is not None and wp.block_size is not None
        restored = []
        for piece in wp.pieces:  # split tables: each piece is quantized on its own
            shape = list(wp.weight.shape)
            shape[piece.axis] = piece.stop - piece.start
            *lead, cols = shape  # [E, N, K] experts: rows are E * N
            rows = int(np.prod(lead))
            blocks = -(-cols // wp.block_size)  # MatMulNBits pads K to whole blocks
            parts = {t.part: arrays[t.name] for t in piece.tensors}
            zero_points = parts.get("zero_points")
            if zero_points is None:  # symmetric MatMulNBits: the op's implicit 8 / 128
                fill = 0x88 if wp.bits == 4 else 128
                zero_points = np.full((rows, -(-blocks * wp.bits // 8)), fill, np.uint8)
            packed = QuantizedBlocks(
                parts["qweight"].reshape(rows, -1),
                parts["scales"].reshape(rows, blocks),
                zero_points.reshape(rows, -1),
            )
            flat = dequantize(packed, bits=wp.bits, block_size=wp.block_size, cols=cols)
            restored.append(flat.reshape(shape))
        yield wp, np.concatenate(restored, axis=wp.split_axis or 0)


def stored_bytes(result: ExportResult) -> dict[str, int]:
    """Bytes of every initializer the package stores (inline or external), by name."""
    model = onnx.load(str(result.output / "model.onnx"))
    return {t.name: numpy_helper.to_array(t).nbytes for t in model.graph.initializer}


def checkpoint_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(model_dir / "model.safetensors"))


def reconstruction_errors(result: ExportResult, model_dir: Path) -> dict[str, tuple[float, int]]:
    """Per quantized weight: (sum of squared errors, element count) against the checkpoint."""
    original = checkpoint_tensors(model_dir)
    out = {}
    for wp, restored in exported_weights(result):
        source = original[wp.weight.source].astype(np.float32)
        diff = (restored - source).astype(np.float64)
        out[wp.name] = (float((diff * diff).sum()), diff.size)
    return out


def total_mse(errors: dict[str, tuple[float, int]]) -> float:
    return sum(e for e, _ in errors.values()) / sum(n for _, n in errors.values())


def dequantized_model(model: Any, result: ExportResult, session: str = "decoder") -> Any:
    """A copy of the transformers model running the dequantized weights of the package's
    ``session``."""
    import torch

    restored_model = copy.deepcopy(model)
    params = dict(restored_model.named_parameters())
    with torch.no_grad():
        for wp, restored in exported_weights(result, session):
            # A fused weight (Q/K/V, gate/up) is its parts' rows, one after the other.
            offset = 0
            for part in wp.weight.parts or (wp.weight,):
                rows = part.part_rows(len(wp.weight.shape)) if wp.weight.parts else len(restored)
                if part.source is not None:
                    block = restored[offset : offset + rows]
                    if part.row_order is not None:  # back in the checkpoint's row order
                        stored = np.empty_like(block)
                        stored[part.row_order.source_rows(0, rows)] = block
                        block = stored
                    params[part.source].copy_(torch.from_numpy(np.ascontiguousarray(block)))
                offset += rows
    return restored_model


def quant_options(
    weight_bits: int | None = None,
    embedding_bits: int | None = None,
    *,
    symmetric: bool = False,
    method: str = "rtn",
    accuracy_level: int | None = 0,
    **extra: Any,
) -> ExportOptions:
    return ExportOptions(
        ep="cpu",
        dtype="fp32",
        weight_bits=weight_bits,
        embedding_bits=embedding_bits,
        block_size=BLOCK,
        symmetric=symmetric,
        quant_method=method,  # type: ignore[arg-type]
        accuracy_level=accuracy_level,
        **extra,
    )


class Packages:
    """Exports and teacher-forced runs, each done once per module."""

    def __init__(self, tiny_models: Any, root: Path) -> None:
        self.tiny_models = tiny_models
        self.root = root
        self._models: dict[str, tuple[Path, Any]] = {}
        self._exports: dict[tuple[str, ExportOptions], ExportResult] = {}
        self._logits: dict[tuple[str, ExportOptions], np.ndarray] = {}
        self._tokens: dict[str, list[int]] = {}

    def model(self, key: str) -> tuple[Path, Any]:
        """``"all_features"`` / ``"untied"``: the raw fixtures; ``"calm/<name>"``: calm ones."""
        if key not in self._models:
            if key.startswith("calm/"):
                _, raw = self.tiny_models.get(key.removeprefix("calm/"))
                path = self.root / "models" / key.replace("/", "_")
                calm = calm_model(raw)
                calm.save_pretrained(path)
                self._models[key] = (path, calm)
            else:
                self._models[key] = self.tiny_models.get(key)
        return self._models[key]

    def export(self, key: str, options: ExportOptions) -> ExportResult:
        if (key, options) not in self._exports:
            model_dir, _ = self.model(key)
            out = self.root / f"pkg{len(self._exports)}"
            self._exports[key, options] = export(out, model_dir=model_dir, options=options)
        return self._exports[key, options]

    def float_package(self, key: str) -> ExportResult:
        return self.export(key, ExportOptions(ep="cpu", dtype="fp32"))

    def tokens(self, key: str) -> list[int]:
        """The float package's greedy tokens: the teacher-forced sequence for every package."""
        if key not in self._tokens:
            self._tokens[key] = greedy_tokens(self.float_package(key).output, PROMPT, STEPS)
        return self._tokens[key]

    def logits(self, key: str, options: ExportOptions) -> np.ndarray:
        if (key, options) not in self._logits:
            result = self.export(key, options)
            self._logits[key, options] = forced_logits(result.output, PROMPT, self.tokens(key))
        return self._logits[key, options]

    def reference(self, key: str) -> np.ndarray:
        return self.logits(key, ExportOptions(ep="cpu", dtype="fp32"))

    def metrics(self, key: str, options: ExportOptions) -> Metrics:
        return compare(self.logits(key, options), self.reference(key))


MIXED_BY_NAME: dict[str, Any] = dict(
    dtype="fp32",
    weight_bits=4,
    embedding_bits=4,
    block_size=16,
    accuracy_level=0,
    keep_int8=("layers.0.*", "embed_tokens.weight"),
)
"""INT4 weights, layer 0 and the token table in INT8 (``keep_int8``)."""

WIDE_QWEN2: dict[str, Any] = dict(
    hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192
)
"""A Qwen2 checkpoint whose widths take INT8 blocks of 128 (hidden) and 64 (MLP, 192)."""
