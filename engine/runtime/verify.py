"""Verification: a package against transformers on the checkpoint it was exported from.

transformers runs the checkpoint greedily (float32, a full forward per step, so no cache
API is involved); the package is then teacher-forced with the same tokens, so the logits
of every step are comparable even after a near-tie flips one token. The verdict says
whether the package is faithful, with the numbers behind it. torch and transformers are
imported only inside this module's functions.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.caps import get_caps, list_eps
from engine.errors import OptionsError, PackageError, RuntimeUnavailableError, option
from engine.progress import CancelToken, Progress, no_progress, sub_progress
from engine.runtime.bench import bench_prompt
from engine.runtime.limits import check_lengths, check_seed
from engine.runtime.package import Package, open_package
from engine.runtime.quality import (
    DEFAULT_TOKENS,
    TextQuality,
    log_softmax,
    read_text,
    text_ids,
    text_quality,
)
from engine.runtime.session import one_line, require_provider
from engine.spec import ModelSpec


def check_package_tokenizer(pkg: Package) -> None:
    """The package's tokenizer files load as onnxruntime-genai needs them: a PASS vouches
    for a package genai can run text through, whatever token ids the comparison uses.

    Raises:
        PackageError: No tokenizer.json.
        SpecError: A tokenizer file that is damaged or does not fit the vocabulary.
    """
    from engine.tokenizer_files import check_tokenizer_files

    if not (pkg.path / "tokenizer.json").is_file():
        raise PackageError(
            f"{pkg.path} has no tokenizer.json, so onnxruntime-genai cannot run text through "
            "it: copy tokenizer.json and tokenizer_config.json from the checkpoint into the "
            "package, or export it from a checkpoint that has them"
        )
    check_tokenizer_files(pkg.path, pkg.vocab_size)


NO_TRANSFORMERS = (
    'verify needs torch and transformers: pip install "export-studio[studio]" (it pins '
    "torch 2.13.0 and transformers 5.24.0; a looser torch can pull a CUDA build of several GB)"
)


@dataclass(frozen=True)
class Tolerance:
    """What a faithful package of this kind must meet."""

    max_rel_diff: float | None
    """Max |package - reference| / max |reference| per step; None = not checked."""
    min_agreement: float
    """Fraction of steps whose top-1 must equal the reference's."""
    min_cosine: float
    """Least cosine similarity of a step's logits to the reference's."""


# A top-1 flip needs the reference margin to be at most twice the step's max difference,
# so for float packages the difference bound already limits flips to near ties.


FLOAT_TOLERANCES = {
    "fp32": Tolerance(max_rel_diff=1e-3, min_agreement=0.0, min_cosine=0.9999),
    "fp16": Tolerance(max_rel_diff=0.2, min_agreement=0.0, min_cosine=0.995),
    "bf16": Tolerance(max_rel_diff=0.3, min_agreement=0.0, min_cosine=0.99),
}
QUANTIZED_TOLERANCE = Tolerance(max_rel_diff=None, min_agreement=0.8, min_cosine=0.98)


def tolerance_for(package: Package) -> Tolerance:
    """The default tolerance for a package's dtype and quantization."""
    if package.quantized:
        return QUANTIZED_TOLERANCE
    if package.dtype is None:
        # Not one of ours (no manifest): dtype and quantization unknown, judge loosely.
        return QUANTIZED_TOLERANCE
    return FLOAT_TOLERANCES.get(package.dtype, FLOAT_TOLERANCES["fp16"])


@dataclass(frozen=True)
class StepCheck:
    """One generated position: package against reference."""

    step: int
    reference_token: int
    package_token: int
    """The package's top-1 when fed the reference's tokens."""
    max_abs_diff: float
    rel_diff: float
    cosine: float
    margin: float
    """Reference logit of its top-1 minus that of the package's top-1 (0 when equal)."""


@dataclass(frozen=True)
class VerifyResult:
    """The verdict and the numbers behind it."""

    package: str
    model: str
    ep: str
    provider: str
    dtype: str | None
    quantized: bool
    prompt: tuple[int, ...]
    reference_tokens: tuple[int, ...]
    steps: tuple[StepCheck, ...]
    tolerance: Tolerance
    passed: bool
    reasons: tuple[str, ...]
    """Why it failed (empty when it passed)."""
    seconds: float
    quality: TextQuality | None = None
    """The package against transformers on text (:mod:`engine.runtime.quality`); None
    when not measured."""
    package_ep: str = "cpu"
    """The EP the package was built for (``ep`` is the one it ran on)."""
    reference_flatness: float = 0.0
    """Mean entropy of the reference's next-token distributions over the steps, as a
    share of a uniform one's (:func:`flatness`)."""
    adapter: str | None = None
    """How a plugin EP ran (its version, a GPU or the software adapter); None for a
    built-in EP."""
    cpu_fallback: dict[str, int] = field(default_factory=dict)
    """Op types whose nodes ran on the CPU instead of the EP, with their counts (our
    runner's placement; empty on the CPU EP and through genai, which reports none)."""

    @property
    def notes(self) -> tuple[str, ...]:
        """What the numbers cannot say here: a failure on top-1 or cosine against nearly
        flat reference logits (a random-weight checkpoint) tells little about a package."""
        ranking = ("top-1", "logit cosine")
        judged_by_ranking = bool(self.reasons) and all(r.startswith(ranking) for r in self.reasons)
        # a package of other weights is far off even there (cosine near 0, not 0.6-0.85)
        near = self.min_cosine >= NEAR_COSINE
        if self.reference_flatness < FLAT_REFERENCE or not judged_by_ranking or not near:
            return ()
        return (
            f"the reference's next-token distributions are nearly flat (entropy "
            f"{self.reference_flatness:.0%} of a uniform one's: a random-weight checkpoint?), "
            "so near-ties decide top-1 and small differences move the cosine; verify against "
            "a trained checkpoint to judge the package",
        )

    @property
    def max_abs_diff(self) -> float:
        return max(s.max_abs_diff for s in self.steps)

    @property
    def max_rel_diff(self) -> float:
        return max(s.rel_diff for s in self.steps)

    @property
    def min_cosine(self) -> float:
        return min(s.cosine for s in self.steps)

    @property
    def agreement(self) -> float:
        return sum(s.package_token == s.reference_token for s in self.steps) / len(self.steps)

    @property
    def greedy_tokens_identical(self) -> bool:
        """Free-running greedy decoding would give the reference's tokens exactly."""
        return all(s.package_token == s.reference_token for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            verdict="PASS" if self.passed else "FAIL",
            max_abs_diff=self.max_abs_diff,
            max_rel_diff=self.max_rel_diff,
            min_cosine=self.min_cosine,
            top1_agreement=self.agreement,
            greedy_tokens_identical=self.greedy_tokens_identical,
            quality=None if self.quality is None else self.quality.to_json(),
            notes=list(self.notes),
        )
        return data


_SHAPE_KEYS = (
    ("model_type", "model type"),
    ("layers", "layers"),
    ("hidden_size", "hidden size"),
    ("attention_heads", "attention heads"),
    ("head_dim", "head sizes"),
    ("kv_heads", "KV heads"),
    ("intermediate_sizes", "MLP widths"),
    ("per_layer_embedding_dim", "per-layer embedding width"),
    ("experts", "experts"),
)
"""What the package's manifest (``export_studio.json``) records of the model's shape, and
how a message names it."""


def check_same_model(pkg: Package, spec: ModelSpec) -> None:
    """Refuse a checkpoint whose shape differs from the one the package was exported from
    (the manifest's ``model`` summary; a package without one is checked by its vocabulary
    only): comparing them would blame the package for the wrong model."""
    recorded = (pkg.manifest or {}).get("model")
    if not isinstance(recorded, Mapping):
        return
    # through JSON, as the manifest was written: tuples become lists
    actual = json.loads(json.dumps(spec.summary()))
    differences = [
        f"{label} {recorded[key]} in the package, {actual[key]} in the checkpoint"
        for key, label in _SHAPE_KEYS
        if key in recorded and recorded[key] != actual.get(key)
    ]
    if differences:
        raise PackageError(
            f"{pkg.path.name} was exported from a different model ({'; '.join(differences)}); "
            "verify the package against the checkpoint it was exported from"
        )


def verify(
    package: Package | str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    steps: int = 16,
    prompt: Sequence[int] | None = None,
    prompt_length: int = 12,
    seed: int = 0,
    ep: str | None = "cpu",
    tolerance: Tolerance | None = None,
    text: str | os.PathLike[str] | None = None,
    quality_tokens: int = DEFAULT_TOKENS,
    max_kld: float | None = None,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> VerifyResult:
    """Compare a package with transformers on its source checkpoint: logits per step on a
    prompt, then quality on text (:mod:`engine.runtime.quality`).

    Args:
        package: The package folder.
        model_dir: The Hugging Face checkpoint it was exported from.
        steps: Generated positions to compare (the prefill's is the first).
        prompt: Token ids; default a seeded random prompt of ``prompt_length``.
            Prompt and steps must fit the package; they are checked before anything
            runs (transformers runs a full forward per step).
        ep: EP to run the package on (default the CPU; None = the package's EP).
        tolerance: Override the default for the package's dtype and quantization.
        text: A UTF-8 text file to measure quality on (KL divergence, top-1 agreement,
            perplexity against transformers); None = the built-in sample.
        quality_tokens: Positions of the text to score; 0 = no quality measurement.
        max_kld: Fail when the mean KL divergence on the text is above this.

    Raises:
        OptionsError: Lengths that do not fit the package, or a multimodal package (see
            :func:`engine.runtime.verify_media.verify_media`).
        PackageError: The package does not belong to this checkpoint's architecture.
        RuntimeUnavailableError: torch / transformers or the EP are missing.
    """
    from engine.models import load_spec
    from engine.runtime.runner import Runner, RunnerOptions

    started = time.perf_counter()
    cancel = cancel or CancelToken()
    pkg = package if isinstance(package, Package) else open_package(package)
    if pkg.multimodal:
        raise OptionsError(
            f"{pkg.path.name} is a multimodal package, which runs through onnxruntime-genai; "
            f"verify it on a prompt with {option('image', 'PATH')} and / or "
            f"{option('audio', 'PATH')}"
        )
    runs = get_caps(ep or pkg.ep or "cpu")
    if pkg.dtype not in (None, *runs.float_dtypes):
        # bf16 runs on CUDA (and TensorRT-RTX), not on the CPU EP: said before transformers
        # runs, and in verify's own options (bench's advice, another runtime, is none)
        elsewhere = [e for e in list_eps() if pkg.dtype in get_caps(e).float_dtypes]
        raise OptionsError(
            f"{pkg.path.name} is a {pkg.dtype} package, which {runs.display_name} does not "
            f"run; verify it with {option('ep', elsewhere[0]) if elsewhere else 'another EP'} "
            "on a machine that has it, or verify an fp16 or fp32 export of the checkpoint"
        )
    length = len(prompt) if prompt is not None else prompt_length
    check_lengths(pkg, length, steps, new_option=option("steps"))
    check_seed(seed)
    require_provider(ep or pkg.ep)  # an EP missing here is known before transformers runs
    spec = load_spec(model_dir)
    if pkg.vocab_size != spec.vocab_size:
        raise PackageError(
            f"the package's vocabulary ({pkg.vocab_size}) differs from the checkpoint's "
            f"({spec.vocab_size}); verify the package against the model it was exported from"
        )
    check_same_model(pkg, spec)
    check_package_tokenizer(pkg)
    if quality_tokens < 0:
        raise OptionsError(
            f"{option('text_tokens', 'N')} must be 0 (no quality run) or more, got {quality_tokens}"
        )
    if max_kld is not None and not (max_kld >= 0 and quality_tokens > 0):
        raise OptionsError(
            f"{option('max_kld')} needs a non-negative bound and text to score (quality tokens "
            f"above 0), got {max_kld} over {quality_tokens} tokens"
        )
    scored: list[int] = []  # the text's ids and where it came from, when quality is measured
    source = ""
    if quality_tokens > 0:
        body, source = read_text(text)
        scored = text_ids(pkg, body, quality_tokens)
    ids = list(prompt) if prompt is not None else bench_prompt(spec.vocab_size, prompt_length, seed)
    share = 0.4 if scored else 0.6
    progress(0.0, "running transformers")
    model = load_reference(model_dir)
    switch = longrope_switch(spec)

    def past_switch(length: int) -> bool:
        """A run this long takes longrope's long factors part way (transformers' cache)."""
        return switch is not None and length > switch

    ref_tokens, ref_logits = reference_greedy(
        model_dir,
        ids,
        steps,
        sub_progress(progress, 0.0, share),
        cancel,
        model=model,
        cached=past_switch(len(ids) + steps),
    )
    progress(share, "running the package")
    runner = Runner(pkg, RunnerOptions(ep=ep, kv_mode="auto"))
    run = runner.generate(ids, steps, forced=ref_tokens, keep_logits=True, cancel=cancel)
    logits = run.logits
    quality = None
    if scored:
        quality = text_quality(
            runner,
            model,
            scored,
            source,
            sub_progress(progress, 2 * share, 1.0),
            cancel,
            cached=past_switch(len(scored)),
        )
    result = verdict(
        pkg, model_dir, runner, ids, ref_tokens, ref_logits, logits, tolerance, progress, started
    )
    reasons = list(result.reasons)
    if quality is not None and max_kld is not None and quality.mean_kld > max_kld:
        reasons.append(f"mean KL divergence on text {quality.mean_kld:.4g} > {max_kld:g}")
    return replace(result, quality=quality, passed=not reasons, reasons=tuple(reasons))


def verdict(
    pkg: Package,
    model_dir: str | os.PathLike[str],
    runner: Any,
    prompt: Sequence[int],
    ref_tokens: Sequence[int],
    ref_logits: Sequence[np.ndarray],
    logits: Sequence[np.ndarray],
    tolerance: Tolerance | None,
    progress: Progress,
    started: float,
) -> VerifyResult:
    """Every step's logits checked against the reference's, judged by the tolerance for the
    package's dtype and quantization (or the one given); ``runner`` names EP and provider."""
    checks = tuple(
        check_step(i, ref_tokens[i], ref, ours)
        for i, (ref, ours) in enumerate(zip(ref_logits, logits, strict=True))
    )
    tol = tolerance or tolerance_for(pkg)
    reasons = failures(checks, tol)
    progress(1.0, "done")
    return VerifyResult(
        package=str(pkg.path),
        model=str(Path(model_dir).absolute()),
        ep=runner.ep,
        provider=runner.provider,
        dtype=pkg.dtype,
        quantized=pkg.quantized,
        prompt=tuple(int(t) for t in prompt),
        reference_tokens=tuple(ref_tokens),
        steps=checks,
        tolerance=tol,
        passed=not reasons,
        reasons=tuple(reasons),
        seconds=time.perf_counter() - started,
        package_ep=pkg.ep,
        reference_flatness=flatness(ref_logits),
        adapter=getattr(getattr(runner, "handle", None), "adapter", None),
        cpu_fallback=_fallback(runner),
    )


def _fallback(runner: Any) -> dict[str, int]:
    placement = getattr(runner, "placement", None)
    return dict(placement.fallback_ops) if placement is not None else {}


def longrope_switch(spec: ModelSpec) -> int | None:
    """The sequence length past which the model's longrope takes its long factors (the
    shortest original length of its RoPEs), or None without longrope."""
    lengths = [
        rope.original_max_position_embeddings
        for rope in spec.rope.values()
        if rope.kind == "longrope" and rope.original_max_position_embeddings is not None
    ]
    return min(lengths) if lengths else None


@contextmanager
def transformers_bars_off() -> Iterator[None]:
    """transformers' own progress bars off (its "Loading weights" bar on stderr): the
    caller's progress says where the work is, and ``--quiet`` means quiet."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_reference(model_dir: str | os.PathLike[str]) -> Any:
    """The checkpoint in transformers, float32, in eval mode.

    Raises:
        RuntimeUnavailableError: torch / transformers missing, or the checkpoint does not load.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise RuntimeUnavailableError(NO_TRANSFORMERS) from exc
    try:
        with transformers_bars_off():
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    except Exception as exc:  # transformers raises many types here
        raise RuntimeUnavailableError(
            f"transformers could not load '{model_dir}': {one_line(exc)}; check the checkpoint "
            "and that the installed transformers knows its model type"
        ) from exc
    return model.eval()


def reference_greedy(
    model_dir: str | os.PathLike[str],
    prompt: Sequence[int],
    steps: int,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
    *,
    model: Any = None,
    cached: bool = False,
) -> tuple[list[int], list[np.ndarray]]:
    """transformers' greedy tokens and float32 last-position logits per step (``model``:
    the checkpoint already loaded by :func:`load_reference`). ``cached``: through
    transformers' cache, one token per step, as a package runs, instead of a full forward
    per step: what longrope needs once a run passes its original length (the cached keys
    keep the short factors they were rotated with; a full forward rotates all by the long)."""
    import torch

    model = model if model is not None else load_reference(model_dir)
    ids = list(prompt)
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    cache = None
    with torch.no_grad():
        for i in range(steps):
            if cancel is not None:
                cancel.raise_if_cancelled()
            try:
                if not cached:
                    out = model(input_ids=torch.tensor([ids], dtype=torch.long))
                else:
                    feed = ids if cache is None else ids[-1:]
                    step = torch.tensor([feed], dtype=torch.long)
                    out = model(input_ids=step, cache=cache, use_cache=True)
                    cache = out.cache
            except Exception as exc:  # torch and transformers raise many types
                raise RuntimeUnavailableError(
                    f"transformers failed running '{model_dir}' on a prompt of {len(ids)} "
                    f"tokens: {one_line(exc)}"
                ) from exc
            row = out.logits[0, -1].float().numpy()
            logits.append(row)
            tokens.append(int(row.argmax()))
            ids.append(tokens[-1])
            progress((i + 1) / steps, f"transformers step {i + 1}/{steps}")
    return tokens, logits


FLAT_REFERENCE = 0.9
"""Reference flatness (:func:`flatness`) from which top-1 and cosine failures get a note.
A trained model's next-token distributions sit far below it; a random-weight checkpoint's
(logits within a few units over the whole vocabulary) above 0.95."""


NEAR_COSINE = 0.5
"""Least cosine for that note: on the tiny random checkpoints INT4 / INT8 packages of the
same weights score 0.6-0.85 per step, packages of another seed's weights about 0."""


def flatness(logits: Sequence[np.ndarray]) -> float:
    """Mean entropy of ``softmax(row)`` over the rows, divided by ``log(vocab)``: 1 for
    uniform distributions, near 0 for confident ones."""
    if not logits or len(logits[0]) < 2:
        return 0.0
    log_p = log_softmax(np.stack(logits))  # [steps, vocab]
    terms = np.exp(log_p) * np.where(np.isfinite(log_p), log_p, 0.0)  # p = 0 adds nothing
    entropy = -np.sum(terms, axis=-1)
    return float(np.mean(entropy) / np.log(log_p.shape[-1]))


def check_step(step: int, ref_token: int, ref: np.ndarray, ours: np.ndarray) -> StepCheck:
    diff = float(np.max(np.abs(ref - ours)))
    scale = float(np.max(np.abs(ref))) or 1.0
    norm = float(np.linalg.norm(ref) * np.linalg.norm(ours)) or 1.0
    token = int(np.argmax(ours))
    return StepCheck(
        step=step,
        reference_token=ref_token,
        package_token=token,
        max_abs_diff=diff,
        rel_diff=diff / scale,
        cosine=float(np.dot(ref, ours)) / norm,
        margin=float(ref[ref_token] - ref[token]),
    )


def failures(checks: tuple[StepCheck, ...], tol: Tolerance) -> list[str]:
    reasons = []
    worst_rel = max(c.rel_diff for c in checks)
    if tol.max_rel_diff is not None and worst_rel > tol.max_rel_diff:
        reasons.append(f"relative logit difference {worst_rel:.3g} > {tol.max_rel_diff:g}")
    worst_cos = min(c.cosine for c in checks)
    if worst_cos < tol.min_cosine:
        reasons.append(f"logit cosine similarity {worst_cos:.4f} < {tol.min_cosine:g}")
    agreement = sum(c.package_token == c.reference_token for c in checks) / len(checks)
    if agreement < tol.min_agreement:
        reasons.append(f"top-1 agreement {agreement:.0%} < {tol.min_agreement:.0%}")
    return reasons
