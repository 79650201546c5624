"""Jobs on an existing package: what it can run on here, verify, and benchmark (no Qt).

Module-level functions ``job(request, progress, cancel)`` (Orange3-style): a
:class:`app.workers.Worker` runs them on a pool thread with ``functools.partial``, tests
call them directly. They return the engine's typed results (``BenchResult``,
``VerifyResult``) unchanged; the widgets read those.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from app.wording import phrase
from engine.caps import get_caps, list_eps
from engine.errors import CancelledError, EngineError
from engine.progress import CancelToken, Progress, sub_progress

if TYPE_CHECKING:
    from app.load_check import LoadCheck
    from engine.audit import SessionAudit
    from engine.inspect import PackageInfo
    from engine.runtime.bench import BenchConfig, BenchResult
    from engine.runtime.bench_record import CaptureMode
    from engine.runtime.generation import Agreement
    from engine.runtime.media import MediaPrompt
    from engine.runtime.package import Package
    from engine.runtime.verify import VerifyResult


@dataclass(frozen=True)
class PackageFacts:
    """What the Benchmark tab may offer for one package on this machine."""

    path: Path
    ep: str
    """The EP the package was built for."""
    share_buffer: bool
    runtimes: dict[str, str | None]
    """Runtime name -> why it cannot run here (None: it can)."""
    eps: dict[str, str | None]
    """EP name -> why onnxruntime here cannot run it (None: it can)."""
    media: tuple[str, ...] = ()
    """What its prompts may carry besides text: ``image`` (a vision session), ``audio``
    (a speech session)."""

    def media_problem(self, kind: str) -> str | None:
        """Why a prompt cannot carry ``kind`` (``image`` or ``audio``) here, or None."""
        if kind not in self.media:
            session = {"image": "vision", "audio": "speech"}[kind]
            tower = {"image": "images", "audio": "audio"}[kind]
            return (
                f"{self.path.name} has no {session} session: export the checkpoint with "
                f"{tower} among its {phrase('modalities')}"
            )
        return self.runtimes.get("genai")

    def capture_problem(self, ep: str | None) -> str | None:
        """Why graph capture cannot be benchmarked on ``ep`` (None = the package's), or None."""
        from engine.runtime.package import capture_problem

        caps = get_caps(ep or self.ep)
        return capture_problem(self.ep, self.share_buffer, caps.name) or self.eps.get(caps.name)


def package_facts_job(path: Path, progress: Progress, cancel: CancelToken) -> PackageFacts:
    """Open the package (genai_config and file checks) and list the EPs and runtimes here.

    Raises:
        PackageError: The folder is not a package, or names files it does not have.
    """
    from engine.runtime.package import open_package
    from engine.runtime.session import available_providers

    package = open_package(path)
    offered = available_providers()
    eps: dict[str, str | None] = {}
    for name in list_eps():
        caps = get_caps(name)
        if caps.ort_provider in offered:
            eps[name] = None
        else:
            hint = caps.install_hint
            eps[name] = f"this onnxruntime has no {caps.ort_provider}" + (
                f": {hint}" if hint else ""
            )
    runtimes: dict[str, str | None] = {"ort": None if offered else "onnxruntime is missing"}
    if package.multimodal:
        runtimes["ort"] = (
            "a multimodal package (vision, speech and embedding sessions) runs through "
            "onnxruntime-genai"
        )
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        runtimes["genai"] = "onnxruntime-genai is not installed (pip install onnxruntime-genai)"
    else:
        runtimes["genai"] = None
    return PackageFacts(
        package.path, package.ep, package.share_buffer, runtimes, eps, package.media
    )


@dataclass(frozen=True)
class BenchRequest:
    """What the Benchmark tab asks for."""

    package: Path
    runtime: Literal["ort", "genai"] = "ort"
    ep: str | None = None
    """None = the package's EP."""
    prompt_len: int = 64
    new_tokens: int = 64
    repeats: int = 3
    warmup: int = 1
    capture: CaptureMode = "off"
    images: tuple[Path, ...] = ()
    audios: tuple[Path, ...] = ()
    prompt: str | None = None
    """Text of a prompt with images or audio (None: the engine's default); without
    media the prompt is ``prompt_len`` seeded random tokens."""

    @property
    def captures(self) -> tuple[bool, ...]:
        """Graph capture of each run, in order (capture off first)."""
        return {"off": (False,), "on": (True,), "both": (False, True)}[self.capture]


@dataclass(frozen=True)
class BenchOutcome:
    """The runs that finished (capture off first), and what stopped the others."""

    request: BenchRequest
    results: tuple[BenchResult, ...] = ()
    agreement: Agreement | None = None
    """Capture on against capture off (greedy tokens and logits), when both ran."""
    problem: str | None = None
    """Why a run did not happen (the capture run failed, or was cancelled)."""
    cancelled: bool = False


BENCH_SETTINGS = ("prompt_len", "new_tokens", "repeats", "warmup", "graph_capture")
"""The Benchmark tab's settings a quick look may change."""


def slow_bench_note(request: BenchRequest) -> tuple[str, bool] | None:
    """What to say before a benchmark that a software adapter makes last minutes (the
    engine's ``slow_bench``, in the app's words) and whether it suggests quicker settings,
    or None. Cheap once the tab has its :class:`PackageFacts` (the plugin is registered by
    then)."""
    from app.wording import render
    from engine.runtime.bench import slow_bench
    from engine.runtime.package import open_package

    if request.images or request.audios:
        return None  # genai's processor makes the prompt: its length is not known here
    try:
        package = open_package(request.package)
    except EngineError:
        return None  # the run itself says what is wrong
    slow = slow_bench(
        package, _bench_config(request), request.capture, BENCH_SETTINGS, capture_check=False
    )
    return None if slow is None else (render(str(slow)), slow.quick is not None)


def bench_job(request: BenchRequest, progress: Progress, cancel: CancelToken) -> BenchOutcome:
    """Benchmark capture off and/or on; a later run that fails or is cancelled keeps the
    earlier run's results (the outcome says what happened). A request with images or
    audio runs them through genai's own processors (``engine.runtime.media``).

    Raises:
        EngineError: The first run failed (nothing to keep); CancelledError included.
    """
    from engine.runtime.bench import run_bench
    from engine.runtime.generation import compare
    from engine.runtime.media import MediaPrompt
    from engine.runtime.package import open_package

    package = open_package(request.package)
    media = None
    if request.images or request.audios:
        media = MediaPrompt.build(
            request.prompt, tuple(map(str, request.images)), tuple(map(str, request.audios))
        )
        media.check(package)
    config = _bench_config(request, media)
    captures = request.captures
    results: list[BenchResult] = []
    generations = []
    for i, capture in enumerate(captures):
        part = sub_progress(progress, i / len(captures), (i + 1) / len(captures))
        try:
            result, generation = run_bench(
                package,
                config,
                graph_capture=capture,
                keep_logits=request.capture == "both",
                progress=part,
                cancel=cancel,
                isolated=True,  # Cancel answered at once; genai holds the GIL as it computes
            )
        except CancelledError:
            if not results:
                raise
            return BenchOutcome(request, tuple(results), None, "cancelled", cancelled=True)
        except EngineError as exc:
            if not results:
                raise
            return BenchOutcome(request, tuple(results), None, _capture_failed(exc))
        results.append(result)
        generations.append(generation)
    agreement = compare(generations[0], generations[1]) if len(generations) == 2 else None
    return BenchOutcome(request, tuple(results), agreement)


def _bench_config(request: BenchRequest, media: MediaPrompt | None = None) -> BenchConfig:
    from engine.runtime.bench import BenchConfig

    return BenchConfig(
        runtime=request.runtime,
        media=media,
        ep=request.ep,
        prompt_length=request.prompt_len,
        new_tokens=request.new_tokens,
        repeats=request.repeats,
        warmup=request.warmup,
    )


def _capture_failed(exc: BaseException) -> str:
    from app.wording import error_text

    return f"the capture run failed: {error_text(exc)}"


@dataclass(frozen=True)
class VerifyReport:
    """The load check, and the comparison with transformers when there was a checkpoint."""

    load_check: LoadCheck
    result: VerifyResult | None = None
    skipped: str = ""
    """Why there is no comparison (a preset has no checkpoint)."""
    built_for: str = "cpu"
    """The EP the package was built for (both checks run it on the CPU, the reference)."""


def verify_job(
    package: Path, model_dir: Path | None, progress: Progress, cancel: CancelToken
) -> VerifyReport:
    """The app's load check, then ``engine.runtime.verify.verify`` against the source
    checkpoint when there is one (a preset has none)."""
    from app.load_check import check_package_loads
    from engine.runtime.package import open_package

    progress(0.05, "loading the package in onnxruntime")
    loads = check_package_loads(package)
    opened: Package | None
    try:
        opened = open_package(package)  # once, for the EP it names and for verify
    except EngineError:  # it loads, yet is not a package of ours: no EP of its own to name
        opened = None
    built_for = opened.ep if opened is not None else "cpu"
    cancel.raise_if_cancelled()
    if model_dir is None:
        progress(1.0, "done")
        skipped = "the package was built from a preset: no checkpoint"
        return VerifyReport(loads, skipped=skipped, built_for=built_for)
    from engine.runtime.verify import verify

    progress(0.1, "comparing with transformers")
    result = verify(
        opened or package, model_dir, progress=sub_progress(progress, 0.1, 1.0), cancel=cancel
    )
    return VerifyReport(loads, result, built_for=built_for)


def inspect_job(path: Path, progress: Progress, cancel: CancelToken) -> PackageInfo:
    """Every session's initializers (read without their data), files and configs.

    Raises:
        PackageError: Not a folder, no .onnx file, or an unreadable one.
    """
    from engine.inspect import inspect_package

    progress(0.0, f"reading {path.name}")
    return inspect_package(path)


def package_audit_job(
    path: Path, ep: str, progress: Progress, cancel: CancelToken
) -> tuple[list[SessionAudit], dict[str, str]]:
    """The engine's graph-capture audit of every session of a package for ``ep`` (graphs
    read without weight bytes; node placement not measured), and the sessions no capture
    mode captures, with why."""
    from engine.audit import audit_package, never_captured_sessions
    from engine.runtime.package import open_package

    progress(0.0, "auditing the graphs")
    audits = audit_package(path, get_caps(ep), measure=False)
    manifest = open_package(path).manifest
    return audits, never_captured_sessions(manifest, [a.session for a in audits])
