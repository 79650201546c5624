"""A quick load check of a package's decoder: open it in onnxruntime and run one prefill.

Independent of the engine's runner (no IOBinding, no KV bookkeeping), so it also vouches for
the package when the runner itself is what changed; the self-test and Verify use it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError, PackageError, RuntimeUnavailableError


@dataclass(frozen=True)
class LoadCheck:
    """A package's decoder opened in onnxruntime and run once on a short prompt."""

    filename: str
    providers: tuple[str, ...]
    inputs: int
    outputs: int
    logits_shape: tuple[int, ...]
    seconds: float

    @property
    def summary(self) -> str:
        return (
            f"{self.filename} loads in onnxruntime ({', '.join(self.providers)}): "
            f"{self.inputs} inputs, {self.outputs} outputs, logits {list(self.logits_shape)}, "
            f"{self.seconds:.2f} s"
        )


def check_package_loads(package: Path, prompt: tuple[int, ...] = (2, 5, 17, 42)) -> LoadCheck:
    """Open the package's decoder with the CPU EP and run one prefill step.

    The past KV inputs are empty (GroupQueryAttention takes that whether or not the
    buffers are shared), or, for a package whose attention writes into static buffers
    (``Package.static_kv``: WebGPU's, CUDA's with 512-wide layers), zero buffers of
    ``search.max_length`` slots, as onnxruntime-genai allocates them (an empty one fails
    their ScatterElements).

    Raises:
        PackageError: The folder is not a package, or the model does not load or run.
    """
    import numpy as np
    import onnxruntime as ort

    started = time.perf_counter()
    config_path = package / "genai_config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        filename = str(config["model"]["decoder"]["filename"])
        slots = _static_slots(package)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackageError(
            f"{package} is not a package: cannot read {config_path.name} ({exc})"
        ) from None
    bf16 = _bfloat16_edges(package / filename)
    if bf16:  # the package may be sound: it is this check's EP that cannot run it
        raise RuntimeUnavailableError(
            f"{filename} takes or gives bfloat16 ({bf16}): the CPU EP, which this check runs "
            "on, has no bf16 kernels. Check a bf16 package on CUDA (python -m engine verify "
            "PACKAGE --model CHECKPOINT --ep cuda), or export fp16 or fp32 to check it here"
        )
    try:
        session = ort.InferenceSession(str(package / filename), providers=["CPUExecutionProvider"])
        feeds: dict[str, Any] = {}
        for info in session.get_inputs():
            int_type = np.int32 if "int32" in info.type else np.int64
            if info.name == "input_ids":
                feeds[info.name] = np.array([prompt], dtype=int_type)
            elif info.name == "attention_mask":
                feeds[info.name] = np.ones((1, len(prompt)), dtype=int_type)
            elif info.name.startswith("past"):
                dtype = np.float16 if "float16" in info.type else np.float32
                feeds[info.name] = np.zeros((1, info.shape[1], slots, info.shape[3]), dtype=dtype)
            else:
                raise PackageError(
                    f"{filename} has an input the load check does not know: {info.name}"
                )
        names = [o.name for o in session.get_outputs()]
        logits = session.run(["logits"] if "logits" in names else names[:1], feeds)[0]
    except EngineError:
        raise
    except Exception as exc:  # onnxruntime raises its own exception types
        raise PackageError(
            f"{package / filename} does not load or run in onnxruntime: {exc}"
        ) from exc
    if not np.isfinite(logits.astype(np.float32)).all():
        raise PackageError(f"{filename} runs but produces non-finite logits")
    return LoadCheck(
        filename,
        tuple(session.get_providers()),
        len(session.get_inputs()),
        len(names),
        tuple(int(d) for d in logits.shape),
        time.perf_counter() - started,
    )


def _bfloat16_edges(model_path: Path) -> str:
    """The first bfloat16 input or output of a model (read without its weights), or ""."""
    import onnx

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:  # unreadable: the session below says why, in its own words
        return ""
    edges = [*graph.input, *graph.output]
    bf16 = onnx.TensorProto.BFLOAT16
    return next((e.name for e in edges if e.type.tensor_type.elem_type == bf16), "")


def _static_slots(package: Path) -> int:
    """The KV slots a static-buffer package's past inputs hold (0 for any other), from
    the package as :func:`engine.runtime.package.open_package` reads it."""
    from engine.runtime.package import open_package

    opened = open_package(package)
    return opened.max_length if opened.static_kv else 0
