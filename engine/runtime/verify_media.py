"""Verification of a multimodal package on a prompt with images and / or audio.

onnxruntime-genai's own processors turn the prompt and files into tensors once; the
package runs them through genai (vision / speech / embedding / decoder sessions) and
transformers' ``Gemma4ForConditionalGeneration`` runs the very same tensors, so the
comparison is of the models, not of two image pipelines. The package is teacher-forced
with transformers' greedy tokens (appended one by one), so every step's logits compare.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from engine.errors import EngineError, PackageError, RuntimeUnavailableError, option
from engine.progress import CancelToken, Progress, no_progress
from engine.runtime.limits import check_lengths
from engine.runtime.media import MediaPrompt, check_processed_length
from engine.runtime.package import Package, open_package
from engine.runtime.session import one_line
from engine.runtime.verify import (
    NO_TRANSFORMERS,
    Tolerance,
    VerifyResult,
    transformers_bars_off,
    verdict,
)


def verify_media(
    package: Package | str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    media: MediaPrompt,
    *,
    steps: int = 16,
    ep: str | None = "cpu",
    tolerance: Tolerance | None = None,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> VerifyResult:
    """Compare a multimodal package with transformers on one prompt with media.

    Raises:
        OptionsError: Steps, or the processed prompt, that do not fit the package; a file
            its processors cannot take.
        PackageError: The package has no session for the media, or is not multimodal.
        RuntimeUnavailableError: torch / transformers / onnxruntime-genai are missing.
    """
    from engine.runtime.genai_runner import GenaiRunner

    started = time.perf_counter()
    cancel = cancel or CancelToken()
    pkg = package if isinstance(package, Package) else open_package(package)
    if not pkg.multimodal:
        raise PackageError(
            f"{pkg.path.name} is a text-only package; verify it without images or audio"
        )
    check_lengths(pkg, 1, steps, new_option=option("steps"))  # the processed prompt: checked below
    media.check(pkg)
    progress(0.0, "processing the prompt with genai's processors")
    runner = GenaiRunner(pkg, ep=ep, graph_capture=False)
    inputs = media.process(runner._og, runner.model)
    tensors = {name: MediaPrompt.array(inputs[name]) for name in _names(inputs)}
    check_processed_length(pkg, media, tensors["input_ids"].size, steps, option("steps"))
    progress(0.1, "running transformers")
    ref_tokens, ref_logits = _reference(model_dir, tensors, steps, cancel)
    progress(0.6, "running the package")
    try:
        ours = _forced(runner, inputs, ref_tokens, cancel)
    except EngineError:
        raise
    except Exception as exc:  # genai raises RuntimeError for everything
        raise RuntimeUnavailableError(
            f"onnxruntime-genai failed running {pkg.path.name} on the prompt with "
            f"{media.describe()} ({media.files()}): {one_line(exc)}"
        ) from exc
    prompt = tensors["input_ids"].reshape(-1)
    return verdict(
        pkg, model_dir, runner, prompt, ref_tokens, ref_logits, ours, tolerance, progress, started
    )


def _names(inputs: Any) -> list[str]:
    names = ["input_ids"]
    for name in ("pixel_values", "pixel_position_ids", "audio_embeds", "audio_attention_mask"):
        try:
            inputs[name]
        except Exception:  # genai's NamedTensors raises for absent names
            continue
        names.append(name)
    return names


def _reference(
    model_dir: str | os.PathLike[str],
    tensors: dict[str, np.ndarray],
    steps: int,
    cancel: CancelToken,
) -> tuple[list[int], list[np.ndarray]]:
    """transformers' greedy tokens and float32 logits, fed genai's processed tensors."""
    try:
        import torch
        from transformers import Gemma4ForConditionalGeneration
    except ImportError as exc:
        raise RuntimeUnavailableError(NO_TRANSFORMERS) from exc
    try:
        with transformers_bars_off():
            model = Gemma4ForConditionalGeneration.from_pretrained(
                str(model_dir), dtype=torch.float32
            ).eval()
    except Exception as exc:  # transformers raises many types here
        raise RuntimeUnavailableError(
            f"transformers could not load '{model_dir}': {one_line(exc)}"
        ) from exc
    kwargs: dict[str, Any] = {
        "input_ids": torch.from_numpy(tensors["input_ids"].astype(np.int64)).reshape(1, -1)
    }
    if "pixel_values" in tensors:
        kwargs["pixel_values"] = torch.from_numpy(tensors["pixel_values"].astype(np.float32))
        kwargs["image_position_ids"] = torch.from_numpy(
            tensors["pixel_position_ids"].astype(np.int64)
        )
    if "audio_embeds" in tensors:
        kwargs["input_features"] = torch.from_numpy(tensors["audio_embeds"].astype(np.float32))
        kwargs["input_features_mask"] = torch.from_numpy(
            tensors["audio_attention_mask"].astype(bool)
        )
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    try:
        with torch.no_grad():
            out = model(**kwargs, use_cache=True)
            for _ in range(steps):
                cancel.raise_if_cancelled()
                row = out.logits[0, -1].float().numpy()
                logits.append(row)
                tokens.append(int(row.argmax()))
                next_ids = torch.tensor([[tokens[-1]]])
                out = model(input_ids=next_ids, cache=out.cache, use_cache=True)
    except EngineError:
        raise
    except Exception as exc:  # torch and transformers raise many types
        raise RuntimeUnavailableError(
            f"transformers failed running '{model_dir}' on genai's processed prompt: "
            f"{one_line(exc)}"
        ) from exc
    return tokens, logits


def _forced(runner: Any, inputs: Any, forced: list[int], cancel: CancelToken) -> list[np.ndarray]:
    """The package's logits per step, fed transformers' tokens after each step."""
    og = runner._og
    prompt = int(MediaPrompt.array(inputs["input_ids"]).shape[-1])
    params = og.GeneratorParams(runner.model)
    total = prompt + len(forced) + 1
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(runner.model, params)
    generator.set_inputs(inputs)
    rows = []
    for token in forced:
        cancel.raise_if_cancelled()
        rows.append(np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1))
        generator.append_tokens(np.array([token], dtype=np.int32))
    return rows
