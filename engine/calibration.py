"""Calibration for GPTQ (``quant_method="gptq"``): each linear's input statistics from the
float model running real text.

The checkpoint is first exported as a float CPU package (fp32, text decoder) into a temp
folder; its graph gets the input of every MatMul over a checkpoint linear as an extra
output; token sequences of the calibration text (the user's file, or a built-in sample:
documentation strings of the Python standard library, which every machine has) run
through it one prefill each, and ``H = sum x x^T`` is accumulated per input. Linears that
read the same input (q/k/v, gate/up) share one :class:`~engine.quantize.gptq.Feedback`.
"""

from __future__ import annotations

import ast
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import OptionsError, option
from engine.progress import CancelToken, Progress, no_progress
from engine.quantize.gptq import Feedback

SEQUENCE_LENGTH = 256
"""Tokens per calibration prefill."""
MAX_TOKENS = 16_384
"""Calibration tokens used at most (the first ones of the text)."""
MAX_STATISTICS_BYTES = 4 * 1024**3
"""Largest sum of ``[K, K]`` float64 statistics kept in memory at once."""
SAMPLE_MODULES = (
    "argparse",
    "textwrap",
    "difflib",
    "pathlib",
    "collections/__init__",
    "functools",
    "inspect",
    "dataclasses",
    "json/__init__",
    "logging/__init__",
)
"""Standard-library modules whose documentation strings make the built-in sample."""


def sample_text() -> str:
    """The built-in calibration text: docstrings of :data:`SAMPLE_MODULES` (English prose
    about code, present on every Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in SAMPLE_MODULES:
        try:
            tree = ast.parse((root / f"{name}.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    if not parts:
        raise OptionsError(
            f"no built-in calibration text in {root} (no standard library source here); "
            f"give your own with {option('calibration')}"
        )
    return "\n\n".join(parts)


def calibration_tokens(model_dir: Path, text_file: str | None, vocab_size: int) -> np.ndarray:
    """The calibration text's token ids (at most :data:`MAX_TOKENS`), by the checkpoint's
    own tokenizer."""
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise OptionsError(
            f"{option('quant_method', 'gptq')} tokenizes its calibration text with the "
            f"checkpoint's tokenizer.json, which {model_dir} lacks; use "
            f"{option('quant_method', 'rtn')} or add the tokenizer"
        )
    if text_file is not None:
        try:
            text = Path(text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise OptionsError(
                f"cannot read the calibration text {text_file}: {exc}; give a UTF-8 text file"
            ) from exc
    else:
        text = sample_text()
    from tokenizers import Tokenizer

    ids = np.asarray(Tokenizer.from_file(str(tokenizer_file)).encode(text).ids, dtype=np.int64)
    ids = ids[(ids >= 0) & (ids < vocab_size)][:MAX_TOKENS]
    if len(ids) < SEQUENCE_LENGTH:
        raise OptionsError(
            f"the calibration text has {len(ids)} tokens; GPTQ needs at least "
            f"{SEQUENCE_LENGTH} (a few pages of text)"
        )
    return ids


def linear_feedback(
    model_dir: str | Path,
    text_file: str | None = None,
    *,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> dict[str, Feedback]:
    """Weight name (``layers.0.self_attn.q_proj.weight``) -> its input's GPTQ feedback."""
    import onnx

    from engine.options import ExportOptions
    from engine.pipeline import export

    cancel = cancel or CancelToken()
    folder = Path(model_dir)
    with tempfile.TemporaryDirectory(prefix="es-calibrate-") as tmp:
        work = Path(tmp)
        progress(0.0, "calibration: the float model")
        options = ExportOptions(ep="cpu", dtype="fp32", attention="standard", modalities=("text",))
        result = export(work / "float", model_dir=folder, options=options, cancel=cancel)
        ids = calibration_tokens(folder, text_file, result.plan.spec.vocab_size)
        model_file = work / "float" / result.plan.decoder.filename
        proto = onnx.load(str(model_file), load_external_data=False)
        inputs = _linear_inputs(proto)
        sizes = {name: _width(proto, name) for name in set(inputs.values())}
        need = sum(8 * k * k for k in sizes.values() if k)
        if need > MAX_STATISTICS_BYTES:
            raise OptionsError(
                f"GPTQ's statistics for this model take {need / 2**30:.1f} GiB at once, "
                f"more than the {MAX_STATISTICS_BYTES / 2**30:.0f} GiB calibration keeps; use "
                f"{option('quant_method', 'rtn')} for now"
            )
        for name in sizes:
            proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
        probe = work / "float" / "calibrate.onnx"
        onnx.save(proto, str(probe))
        sums = _accumulate(probe, ids, sorted(sizes), progress, cancel)
    progress(0.9, "calibration: feedback per input")
    feedback = {name: Feedback.from_hessian(h) for name, h in sums.items()}
    return {weight: feedback[value] for weight, value in inputs.items() if value in feedback}


def _linear_inputs(proto: Any) -> dict[str, str]:
    """Checkpoint weight -> the activation its MatMul multiplies (``x @ W^T`` as MatMul
    with the stored ``[in, out]`` weight second)."""
    weights = {t.name for t in proto.graph.initializer}
    return {
        node.input[1]: node.input[0]
        for node in proto.graph.node
        if node.op_type == "MatMul"
        and node.input[1] in weights
        and node.input[1].endswith(".weight")
    }


def _width(proto: Any, activation: str) -> int:
    """K of the weights that read ``activation`` (their first dim as stored)."""
    dims = {t.name: tuple(t.dims) for t in proto.graph.initializer if len(t.dims) == 2}
    for node in proto.graph.node:
        if node.op_type == "MatMul" and node.input[0] == activation and node.input[1] in dims:
            return int(dims[node.input[1]][0])
    return 0


def _accumulate(
    model: Path, ids: np.ndarray, names: list[str], progress: Progress, cancel: CancelToken
) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    sums: dict[str, np.ndarray] = {}
    count = max(1, len(ids) // SEQUENCE_LENGTH)
    for index in range(count):
        cancel.raise_if_cancelled()
        seq = ids[index * SEQUENCE_LENGTH : (index + 1) * SEQUENCE_LENGTH]
        feeds: dict[str, np.ndarray] = {
            "input_ids": seq[None],
            "attention_mask": np.ones((1, len(seq)), np.int64),
        }
        for name, info in inputs.items():
            if name.startswith("past_key_values"):
                feeds[name] = np.zeros((1, info.shape[1], 0, info.shape[3]), np.float32)
        values = session.run(names, feeds)
        for name, value in zip(names, values, strict=True):
            x = np.asarray(value, dtype=np.float64).reshape(-1, value.shape[-1])
            if name in sums:
                sums[name] += x.T @ x
            else:
                sums[name] = x.T @ x
        progress(0.1 + 0.8 * (index + 1) / count, f"calibration: {index + 1}/{count} sequences")
    return sums


def describe(feedback: Mapping[str, Feedback]) -> str:
    """A note for the export summary."""
    inputs = len({id(f) for f in feedback.values()})
    return f"GPTQ: {len(feedback)} linears calibrated over {inputs} inputs"
