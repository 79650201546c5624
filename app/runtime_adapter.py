"""Running packages: a load check of our own, and the engine's verify / bench when present.

``engine.runtime.verify`` and ``engine.runtime.bench`` are being written in parallel with
the app. This adapter imports them lazily, calls them with the arguments their
signature accepts, and reads their results leniently; when they are missing, the app
says "not available" instead of failing. Everything here is plain Python (no Qt) and runs
in worker threads.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EngineError, PackageError, RuntimeUnavailableError
from engine.progress import CancelToken, Progress


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
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackageError(
            f"{package} is not a package: cannot read {config_path.name} ({exc})"
        ) from None
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
                feeds[info.name] = np.zeros((1, info.shape[1], 0, info.shape[3]), dtype=dtype)
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


@dataclass(frozen=True)
class Availability:
    """Whether an engine runtime feature is importable, with the message to show if not."""

    available: bool
    message: str


def _module(name: str) -> Any:
    # Plain import statements (not importlib) so PyInstaller sees the dependency.
    if name == "bench":
        from engine.runtime import bench

        return bench
    from engine.runtime import verify

    return verify


def _entry(feature: str) -> Callable[..., Any]:
    """``engine.runtime.bench.bench`` or ``engine.runtime.verify.verify``, imported lazily."""
    try:
        function = getattr(_module(feature), feature)
    except (ImportError, AttributeError) as exc:
        raise RuntimeUnavailableError(
            f"{feature} is not available in this build: engine.runtime.{feature} is missing "
            f"({exc}). Use `python -m engine {feature}` from a full install."
        ) from None
    return function


def availability(feature: str) -> Availability:
    """Whether ``"bench"`` or ``"verify"`` can run here."""
    try:
        _entry(feature)
    except RuntimeUnavailableError as exc:
        return Availability(False, str(exc))
    return Availability(True, f"engine.runtime.{feature} is available")


def as_dict(result: Any) -> dict[str, Any]:
    """A result object as a JSON-friendly dict (``to_json()``, a dataclass, or a mapping)."""
    if hasattr(result, "to_json"):
        result = result.to_json()
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = dataclasses.asdict(result)
    if not isinstance(result, dict):
        raise EngineError(f"the engine returned {type(result).__name__}, not a result record")
    return json.loads(json.dumps(result, default=str))


@dataclass(frozen=True)
class BenchSettings:
    """What the benchmark tab asks for."""

    runtime: str = "ort"
    prompt_len: int = 64
    new_tokens: int = 64
    capture: bool = False


@dataclass(frozen=True)
class BenchRecord:
    """One benchmark run, as the history keeps it."""

    package: str
    runtime: str
    capture: bool
    prefill_tps: float | None
    decode_tps: float | None
    prompt_len: int
    new_tokens: int
    timestamp: float = field(default_factory=time.time)
    raw: dict[str, Any] = field(default_factory=dict)


def run_bench(
    package: Path, settings: BenchSettings, progress: Progress, cancel: CancelToken
) -> BenchRecord:
    """Run ``engine.runtime.bench.bench`` on a package; RuntimeUnavailableError if absent."""
    result = _entry("bench")(
        package,
        runtime=settings.runtime,
        prompt_length=settings.prompt_len,
        new_tokens=settings.new_tokens,
        graph_capture=settings.capture,
        progress=progress,
        cancel=cancel,
    )
    raw = as_dict(result)
    return BenchRecord(
        str(package),
        settings.runtime,
        settings.capture,
        _number(raw.get("prefill_tokens_per_second")),
        _number(raw.get("decode_tokens_per_second")),
        settings.prompt_len,
        settings.new_tokens,
        raw=raw,
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def run_verify(
    package: Path, model_dir: Path | None, progress: Progress, cancel: CancelToken
) -> dict[str, Any]:
    """The app's load check, then ``engine.runtime.verify.verify`` against the source
    checkpoint when there is one (a preset has none) and the engine has it."""
    progress(0.05, "loading the package in onnxruntime")
    loads = check_package_loads(package)
    report: dict[str, Any] = {"load_check": loads.summary}
    cancel.raise_if_cancelled()
    found = availability("verify")
    if not found.available:
        report["verify"] = f"not available: {found.message}"
    elif model_dir is None:
        report["verify"] = "skipped: the package was built from a preset, not a checkpoint"
    else:
        progress(0.1, "comparing with transformers")
        result = as_dict(_entry("verify")(package, model_dir, progress=progress, cancel=cancel))
        report["verify"] = result
        report["verdict"] = (
            f"{result.get('verdict')}: top-1 agreement {result.get('top1_agreement', 0):.0%}, "
            f"max |Δlogit| {result.get('max_abs_diff', 0):.2e}, "
            f"min cosine {result.get('min_cosine', 0):.6f}"
            + "".join(f"; {r}" for r in result.get("reasons", []))
        )
    progress(1.0, "done")
    return report
