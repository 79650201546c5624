"""Benchmarks of a package as typed records: load time, TTFT, prefill and decode tok/s.

A benchmark loads the package once, runs ``warmup`` untimed generations (graph capture
records during these), then ``repeats`` timed greedy generations of ``new_tokens`` tokens
after a seeded random prompt of ``prompt_length`` tokens. Decode tok/s is reported as
the median over repeats with its min and max; the tokens of the timed runs must agree.

``isolated=True`` runs each setting in a child process (:mod:`engine.child`), as the CLI
and the studio do: Ctrl-C and Cancel are answered at once however long a prompt pass or a
load is (genai computes holding the GIL), the peak RSS is the run's own, and the device
memory goes back when the run ends.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engine.caps import get_caps
from engine.errors import option
from engine.progress import CancelToken, Progress, no_progress, sub_progress
from engine.runtime.bench_record import (
    BenchConfig,
    BenchResult,
    CaptureComparison,
    CaptureMode,
    Outcome,
    RuntimeName,
)
from engine.runtime.generation import Agreement, Generation, compare
from engine.runtime.limits import (
    DEFAULT_NEW_TOKENS,
    DEFAULT_PROMPT_LENGTH,
    check_lengths,
    fit_lengths,
    sequence_limit,
)
from engine.runtime.package import Package, open_package
from engine.runtime.plugins import drop_adapter_notices, dropping_adapter_notices, ort_plugin
from engine.runtime.session import fallback_note
from engine.units import format_bytes

__all__ = [
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_PROMPT_LENGTH",
    "BenchConfig",
    "BenchResult",
    "BenchSession",
    "CaptureComparison",
    "Outcome",
    "RuntimeName",
    "bench",
    "bench_prompt",
    "check_fits",
    "compare_capture",
    "fit_lengths",
    "interleave",
    "run_bench",
    "sequence_limit",
    "validate_capture",
]


def check_fits(package: Package, config: BenchConfig) -> None:
    """Refuse a benchmark longer than the package supports, or media its processors
    cannot take, before loading anything."""
    if config.media is None:
        fit_lengths(package, config.prompt_length, config.new_tokens)
        return
    # genai's processor makes the prompt (its length is checked once it is processed)
    check_lengths(package, 1, config.new_tokens, least_new=2)
    config.media.check(package)


SOFTWARE_QUANTIZED_BYTES_PER_CORE_SECOND = 0.26e9
"""Bytes of quantized weights (MatMulNBits) Mesa's software Vulkan (lavapipe) reads per
second and CPU core in a decode step. These four constants are fit to two E2B INT4 WebGPU
packages on a 2-core machine (December 7, ``python -m engine bench PACKAGE --prompt-len 16
--new-tokens 8 --repeats 1 --warmup 0 --graph-capture off``, and the fp16-table one at 64 +
4 with a warm-up): with INT4 tables (1.12 GB of INT4 weights and 0.20 GB of float ones read
a token, 2.9 GB stored) it loaded in 9.2 s, gave its first token in 31.8 s and decoded
0.31 tok/s, 66 s in all; with fp16 tables (1.09 GB INT4, its tied head's 0.81 GB fp16
table, 6.8 GB stored) 17.3 s, 29.3 s and 0.10 tok/s, 117.5 s in all. The estimate is
within 7% of each whole command (less ~5 s of start-up); the first one, a single rate for
every byte of every prompt and new token, said 76 s and 7 minutes where lavapipe took
112 s and 155 s. The split is rougher than the totals: the INT4-table package's step is
estimated at 4.1 s (3.25 s measured) and its prompt at 21 s (~29 s), errors that cancel
at 16 + 8; no choice of these constants fits both packages' prompts (the INT4-table one
prefilled slower with fewer float bytes)."""
SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND = 0.052e9
"""The same for float weights (float MatMul, a tied fp16 head: 262,144 x 1,536 for E2B),
five times slower a byte on lavapipe."""
SOFTWARE_PREFILL_STEPS = (7.0, 0.11)
"""A prompt of P tokens costs ``a + b * P`` decode steps of the quantized weights (and one
of the float ones): onnxruntime's M > 1 path of MatMulNBits is that much slower on
lavapipe (the fp16-table package's first token: 29.3 s after 16 tokens, cold; 37.8 s after
64, warm). Float weights cost one step whatever the prompt's length, as the fp16 head did
here; a package of float weights only (fp16, fp32) is not measured, so its prompt's cost
is likely underestimated."""
SOFTWARE_LOAD_BYTES_PER_SECOND = 0.37e9
"""Bytes of a package's weights loaded per second (read and uploaded to lavapipe's
buffers): 6.8 GB in 17.1-17.3 s, 2.9 GB in 9.2 s."""
SLOW_BENCH_SECONDS = 60.0
"""A benchmark estimated longer than this on a software adapter is announced first."""
QUICK_LOOK: dict[str, tuple[int | str, str]] = {
    "prompt_len": (16, option("prompt_len", 16)),
    "new_tokens": (8, option("new_tokens", 8)),
    "repeats": (1, option("repeats", 1)),
    "warmup": (0, option("warmup", 0)),
    "graph_capture": ("off", option("graph_capture", "off")),
}
"""The settings :func:`slow_bench` offers instead: option key -> (value, markup)."""


def software_adapter_seconds(
    package: Package, config: BenchConfig, capture: CaptureMode, capture_check: bool = True
) -> tuple[str, float] | None:
    """(the adapter in words, roughly how many seconds the benchmark takes) when the EP
    runs on a software adapter here (lavapipe, no GPU), else None. Each session loads the
    package; each run (warm-ups, timed runs, and with ``capture_check``, the CLI's, the
    capture run's check against a run without capture) reads the prompt in one pass, which
    gives the first new token, then the weights once per further token
    (:func:`weight_reads`)."""
    adapter = _software_adapter(package, config)
    if adapter is None:
        return None
    return adapter, _seconds(weight_reads(package), config, capture, capture_check)


def _software_adapter(package: Package, config: BenchConfig) -> str | None:
    plugin = ort_plugin(get_caps(config.ep or package.ep).ort_provider)
    return plugin.adapter if plugin is not None and plugin.software else None


def _seconds(
    reads: WeightReads, config: BenchConfig, capture: CaptureMode, capture_check: bool
) -> float:
    cores = _cores()
    quantized = reads.quantized / (SOFTWARE_QUANTIZED_BYTES_PER_CORE_SECOND * cores)
    floats = reads.unquantized / (SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND * cores)
    a, b = SOFTWARE_PREFILL_STEPS
    prompt = quantized * (a + b * config.prompt_length) + floats
    run = prompt + (config.new_tokens - 1) * (quantized + floats)  # the prompt gives one
    sessions = 2 if capture == "both" or (capture == "on" and capture_check) else 1
    load = sessions * reads.stored / SOFTWARE_LOAD_BYTES_PER_SECOND
    return load + _runs(config, capture, capture_check) * run


def _runs(config: BenchConfig, capture: CaptureMode, capture_check: bool) -> int:
    """Generations a benchmark makes (:func:`software_adapter_seconds`)."""
    per_setting = config.warmup + config.repeats
    checked = 2 if capture_check else 0
    return {"off": per_setting, "on": per_setting + checked, "both": 2 * (per_setting + 1)}[capture]


@dataclass(frozen=True)
class WeightReads:
    """Bytes of a decoder's weights: what a token reads, by kind, and all it stores."""

    quantized: int
    """Read by MatMulNBits."""
    unquantized: int
    """Read by anything else but a Gather (float MatMul, a tied fp16 head)."""
    stored: int
    """Every initializer, the tables only gathered from included."""

    @property
    def per_token(self) -> int:
        return self.quantized + self.unquantized


def weight_reads(package: Package) -> WeightReads:
    """The decoder's :class:`WeightReads`. A token reads every initializer but the tables
    only gathered from (embeddings, per-layer tables: a few rows a token). From the graph
    alone; external data is not read."""
    import onnx

    model = onnx.load(str(package.decoder_file), load_external_data=False)
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    quantized = floats = stored = 0
    for tensor in model.graph.initializer:
        lengths = [int(e.value) for e in tensor.external_data if e.key == "length"]
        size = lengths[0] if lengths else len(tensor.raw_data)
        stored += size
        ops = readers.get(tensor.name, set())
        if ops and all(op.startswith("Gather") for op in ops):
            continue
        if "MatMulNBits" in ops:
            quantized += size
        else:
            floats += size
    return WeightReads(quantized, floats, stored)


def _cores() -> int:
    """CPU cores this process may run on (lavapipe runs a thread per core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class SlowBench:
    """What to say before a benchmark a software adapter makes slow (option markup)."""

    said: str
    """The adapter, the weights a token reads and roughly how long this benchmark takes."""
    quick: str | None
    """How long a quick look takes and the settings that differ for it; None where the
    chosen settings are already about as quick."""

    def __str__(self) -> str:
        return self.said if self.quick is None else f"{self.said}; {self.quick}"


def slow_bench(
    package: Package,
    config: BenchConfig,
    capture: CaptureMode,
    settable: Collection[str] = tuple(QUICK_LOOK),
    capture_check: bool = True,
    keep_capture: bool = False,
) -> SlowBench | None:
    """What to say before a benchmark that a software adapter makes last more than
    :data:`SLOW_BENCH_SECONDS`, with the :data:`QUICK_LOOK` settings among ``settable``
    (the option keys this face offers) that differ from the chosen ones and how long they
    take; None otherwise. ``capture_check``: as :func:`software_adapter_seconds`;
    ``keep_capture``: the user asked for this capture mode, so the quick look keeps it."""
    adapter = _software_adapter(package, config)
    if adapter is None:
        return None
    reads = weight_reads(package)  # the graph read once
    seconds = _seconds(reads, config, capture, capture_check)
    if seconds <= SLOW_BENCH_SECONDS:
        return None
    if keep_capture:
        settable = [key for key in settable if key != "graph_capture"]
    quick = {key: value for key, (value, _) in QUICK_LOOK.items() if key in settable}
    quick_config = replace(
        config,
        prompt_length=int(quick.get("prompt_len", config.prompt_length)),
        new_tokens=int(quick.get("new_tokens", config.new_tokens)),
        repeats=int(quick.get("repeats", config.repeats)),
        warmup=int(quick.get("warmup", config.warmup)),
    )
    quick_capture: CaptureMode = "off" if "graph_capture" in quick else capture
    chosen: dict[str, int | str] = {
        "prompt_len": config.prompt_length,
        "new_tokens": config.new_tokens,
        "repeats": config.repeats,
        "warmup": config.warmup,
        "graph_capture": capture,
    }
    quick_seconds = _seconds(reads, quick_config, quick_capture, capture_check)
    runs = _runs(config, capture, capture_check)
    said = (
        f"{package.path.name} runs through the {adapter} here, where each token reads its "
        f"{format_bytes(reads.per_token)} of weights: this benchmark's {runs} "
        f"run{'s' * (runs != 1)} of {config.prompt_length} + {config.new_tokens} tokens "
        f"{'takes' if runs == 1 else 'take'} roughly {_duration(seconds)}"
    )
    if quick_seconds > 0.5 * seconds:
        return SlowBench(said, None)  # already about as quick as a look gets
    settings = " ".join(QUICK_LOOK[k][1] for k, value in quick.items() if chosen[k] != value)
    return SlowBench(said, f"for a quick look (about {_duration(quick_seconds)}): {settings}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(round(seconds), 1)} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


def bench_prompt(vocab_size: int, length: int, seed: int = 0) -> list[int]:
    """A seeded random prompt avoiding the first few (special) ids."""
    low = min(4, max(vocab_size - 1, 0))
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(low, max(vocab_size, low + 1), size=length)]


class BenchSession:
    """One loaded runtime under benchmark: warm-up and timed runs, then a record.

    Sessions can be interleaved (A, B, A, B, ...) so that drift on a shared machine
    hits every setting alike.
    """

    def __init__(self, package: Package, config: BenchConfig, graph_capture: bool) -> None:
        self.package = package
        self.config = config
        self.graph_capture = graph_capture
        self._generate, self.runner = _open(package, config, graph_capture)
        self.prompt = bench_prompt(package.vocab_size, config.prompt_length, config.seed)
        self.runs: list[Generation] = []

    @property
    def label(self) -> str:
        return f"{self.config.runtime}{' + capture' if self.graph_capture else ''}"

    def run(self, timed: bool, cancel: CancelToken | None = None) -> None:
        """One generation; kept for the record when ``timed``."""
        run = self._generate(self.prompt, self.config.new_tokens, cancel=cancel)
        if timed:
            self.runs.append(run)

    def reference(self, cancel: CancelToken | None = None) -> Generation:
        """An extra untimed run with logits (reading them every step slows a timed run)."""
        return self._generate(self.prompt, self.config.new_tokens, keep_logits=True, cancel=cancel)

    def result(self, peak_rss_scope: Literal["benchmark", "process"]) -> BenchResult:
        runs, config, runner = self.runs, self.config, self.runner
        notes: list[str] = []
        if any(r.tokens != runs[0].tokens for r in runs):
            notes.append("timed runs produced different tokens: the runtime is not deterministic")
        if config.runtime == "genai":
            notes.append("onnxruntime-genai does not report node placement; provider as requested")
        plugin = ort_plugin(get_caps(runner.ep).ort_provider)
        if plugin is not None:
            notes.append(f"ran through the {plugin.adapter}")
        placement = getattr(runner, "placement", None)
        if placement is not None and placement.fallback_ops:
            notes.append(fallback_note(placement.fallback_ops))
        if config.media is not None:
            notes.append(
                f"prompt with {config.media.describe()}, {runs[0].prompt_length} tokens after "
                "genai's processor; the first token's time includes reading the files and "
                "the encoder sessions"
            )
        decode = [r.decode_tokens_per_second for r in runs]
        share = "shared" if self.package.share_buffer else "growing"
        return BenchResult(
            package=str(self.package.path),
            runtime=config.runtime,
            ep=runner.ep,
            provider=str(getattr(runner, "provider", "")),
            graph_capture=self.graph_capture,
            kv_mode=str(getattr(runner, "kv_mode", share)),
            prompt_length=runs[0].prompt_length,  # a prompt with media: the processed one
            new_tokens=config.new_tokens,
            repeats=len(runs),
            warmup=config.warmup,
            load_seconds=runner.load_seconds,
            time_to_first_token_seconds=statistics.median(r.first_token_seconds for r in runs),
            prefill_tokens_per_second=statistics.median(r.prefill_tokens_per_second for r in runs),
            decode_tokens_per_second=statistics.median(decode),
            decode_tokens_per_second_min=min(decode),
            decode_tokens_per_second_max=max(decode),
            decode_tokens_per_second_runs=tuple(decode),
            peak_rss_bytes=_peak_rss(),
            peak_rss_scope=peak_rss_scope,
            tokens=runs[0].tokens,
            placement=placement.to_json() if placement is not None else None,
            adapter=plugin.adapter if plugin is not None else None,
            notes=tuple(notes),
            media=config.media.kinds if config.media is not None else (),
        )

    def close(self) -> None:
        """Release the runner and its session (safe to call more than once)."""
        self.__dict__.pop("_generate", None)
        self.__dict__.pop("runner", None)
        gc.collect()


def bench(
    package: Package | str | os.PathLike[str],
    *,
    runtime: RuntimeName = "ort",
    ep: str | None = None,
    prompt_length: int | None = None,
    new_tokens: int | None = None,
    repeats: int = 3,
    warmup: int = 1,
    graph_capture: bool = False,
    threads: int | None = None,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> BenchResult:
    """Benchmark a package: the keyword-argument entry point for scripts and the app.

    ``prompt_length`` / ``new_tokens`` left ``None`` take 128 + 64, shrunk to fit the package.

    Raises:
        EngineError: A package, EP or option problem, with what to do about it.
    """
    pkg = package if isinstance(package, Package) else open_package(package)
    prompt_length, new_tokens = fit_lengths(pkg, prompt_length, new_tokens)
    config = BenchConfig(
        runtime=runtime,
        ep=ep,
        prompt_length=prompt_length,
        new_tokens=new_tokens,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
    )
    result, _ = run_bench(
        pkg, config, graph_capture=graph_capture, progress=progress, cancel=cancel
    )
    return result


def run_bench(
    package: Package | str | os.PathLike[str],
    config: BenchConfig | None = None,
    *,
    graph_capture: bool = False,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
    keep_logits: bool = False,
    isolated: bool = False,
) -> tuple[BenchResult, Generation]:
    """Benchmark one setting; returns the record and a generation of the same prompt
    (the first timed one, or with ``keep_logits`` an extra untimed one with logits).
    ``isolated``: in a child process (see the module's docstring).

    Raises:
        EngineError: A package, EP or option problem, with what to do about it.
    """
    config = config or BenchConfig()
    loading = f"loading ({config.runtime}{' + capture' if graph_capture else ''})"
    if isolated:
        progress(0.0, loading)  # while the process starts, too (a second or so)
        request = _ChildRun(_path(package), config, graph_capture, keep_logits)
        return _in_child(_bench_child, request, progress, cancel)
    cancel = cancel or CancelToken()
    pkg = package if isinstance(package, Package) else open_package(package)
    scope: Literal["benchmark", "process"] = "benchmark" if _reset_peak_rss() else "process"
    progress(0.0, loading)
    session = BenchSession(pkg, config, graph_capture)
    try:  # a cancel or an error must not keep the session (and its device buffers) alive
        cancel.raise_if_cancelled()
        total_runs = config.warmup + config.repeats
        for i in range(total_runs):
            timed = i >= config.warmup
            # Each kind counted on its own: --repeats 2 reads "run 1/2, run 2/2".
            step = (
                f"run {i - config.warmup + 1}/{config.repeats}"
                if timed
                else f"warm-up {i + 1}/{config.warmup}"
            )
            progress(0.1 + 0.9 * i / total_runs, step)
            session.run(timed, cancel)
        reference = session.runs[0]
        if keep_logits:
            progress(0.98, "reference run with logits")
            reference = session.reference(cancel)
        progress(1.0, "done")
        return session.result(scope), reference
    except BaseException as exc:
        # The traceback's frames (the runner's generate loop) would keep the session and
        # its device buffers alive for as long as anyone holds the exception.
        session.close()
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        session.close()


def interleave(
    package: Package | str | os.PathLike[str],
    settings: Sequence[tuple[BenchConfig, bool]],
    *,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> list[Outcome]:
    """Benchmark several (config, capture) settings at once, runs alternating A, B, A, B.

    All settings are loaded together; each is warmed up, then every repeat runs each
    setting once in turn. A setting that fails to load or run is dropped with its error.
    Peak RSS is the process's (shared by all settings).
    """
    from engine.errors import CancelledError, EngineError

    cancel = cancel or CancelToken()
    pkg = package if isinstance(package, Package) else open_package(package)
    _reset_peak_rss()
    sessions: dict[int, BenchSession] = {}
    errors: dict[int, str] = {}

    def guarded(index: int, action: Callable[..., Any], *args: Any) -> Any:
        try:
            return action(*args)
        except CancelledError:
            raise
        except EngineError as exc:
            errors[index] = str(exc)
            failed = sessions.pop(index, None)
            if failed is not None:
                failed.close()
            return None

    try:
        for i, (config, capture) in enumerate(settings):
            progress(0.3 * i / len(settings), f"loading {config.runtime}{' + capture' * capture}")
            session = guarded(i, BenchSession, pkg, config, capture)
            if session is not None:
                sessions[i] = session
        rounds = max(c.warmup + c.repeats for c, _ in settings)
        for r in range(rounds):
            progress(0.3 + 0.6 * r / rounds, f"round {r + 1}/{rounds}")
            for i, session in list(sessions.items()):
                if r < session.config.warmup + session.config.repeats:
                    guarded(i, session.run, r >= session.config.warmup, cancel)
        references: dict[int, Generation] = {}
        for i, session in list(sessions.items()):
            reference = guarded(i, session.reference, cancel)
            if reference is not None:
                references[i] = reference
        progress(1.0, "done")
        outcomes = []
        for i, (config, capture) in enumerate(settings):
            done = sessions.get(i)
            result = done.result("process") if done is not None else None
            outcomes.append(
                Outcome(config.runtime, capture, result, references.get(i), errors.get(i))
            )
    finally:
        for session in sessions.values():
            session.close()
    return outcomes


def compare_capture(
    package: Package | str | os.PathLike[str],
    config: BenchConfig | None = None,
    *,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
    isolated: bool = False,
    keep_on_cancel: bool = False,
) -> CaptureComparison:
    """Capture off, then on, on the same prompt; the capture run validated against off.

    A capture run that fails (the EP refuses capture for this graph) is reported in
    ``error`` rather than raised, so the capture-off numbers are still returned.
    ``isolated``: each run in a child process (see the module's docstring).
    ``keep_on_cancel``: a cancel (or Ctrl-C) once the capture-off run is done returns it,
    marked ``cancelled``, instead of raising, so a caller can report what was measured
    before it stops (a cancel during the capture-off run still raises).
    """
    from engine.errors import CancelledError, EngineError

    pkg = package if isinstance(package, Package) else open_package(package)
    off, off_run = run_bench(
        pkg,
        config,
        graph_capture=False,
        keep_logits=True,
        progress=sub_progress(progress, 0.0, 0.5),
        cancel=cancel,
        isolated=isolated,
    )
    try:
        on, on_run = run_bench(
            pkg,
            config,
            graph_capture=True,
            keep_logits=True,
            progress=sub_progress(progress, 0.5, 1.0),
            cancel=cancel,
            isolated=isolated,
        )
    except (CancelledError, KeyboardInterrupt):
        if not keep_on_cancel:
            raise
        return CaptureComparison(off, None, None, error="cancelled", cancelled=True)
    except EngineError as exc:
        return CaptureComparison(off=off, on=None, agreement=None, error=str(exc))
    return CaptureComparison(off=off, on=on, agreement=compare(off_run, on_run))


def validate_capture(
    package: Package | str | os.PathLike[str],
    config: BenchConfig,
    capture_run: Generation,
    cancel: CancelToken | None = None,
    isolated: bool = False,
) -> Agreement:
    """Rerun the capture run's prompt without capture and compare tokens and logits
    (``isolated``: that run in a child process, see the module's docstring)."""
    if isolated:
        request = _ChildRun(_path(package), config, False, True)
        plain = _in_child(_plain_child, request, no_progress, cancel)
    else:
        plain = _plain_run(package, config, cancel)
    return compare(plain, capture_run)


def _plain_run(
    package: Package | str | os.PathLike[str], config: BenchConfig, cancel: CancelToken | None
) -> Generation:
    """One untimed generation without capture, with logits."""
    pkg = package if isinstance(package, Package) else open_package(package)
    generate, runner = _open(pkg, config, graph_capture=False)
    prompt = bench_prompt(pkg.vocab_size, config.prompt_length, config.seed)
    plain = generate(prompt, config.new_tokens, keep_logits=True, cancel=cancel)
    del generate, runner
    gc.collect()
    return plain


@dataclass(frozen=True)
class _ChildRun:
    """One run for a child process: the package by path (the child opens it)."""

    package: Path
    config: BenchConfig
    graph_capture: bool
    keep_logits: bool
    drop_notices: bool = field(default_factory=dropping_adapter_notices)


def _path(package: Package | str | os.PathLike[str]) -> Path:
    return package.path if isinstance(package, Package) else Path(package)


def _in_child(
    job: Callable[[_ChildRun, Progress, CancelToken], Any],
    request: _ChildRun,
    progress: Progress,
    cancel: CancelToken | None,
) -> Any:
    from engine.child import run_in_child

    # A benchmark writes nothing the user keeps: a cancel ends the child at once.
    return run_in_child(
        job, request, progress, cancel, on_cancel="kill", name="export-studio-bench"
    )


def _bench_child(
    request: _ChildRun, progress: Progress, cancel: CancelToken
) -> tuple[BenchResult, Generation]:
    drop_adapter_notices(request.drop_notices)
    return run_bench(
        request.package,
        request.config,
        graph_capture=request.graph_capture,
        keep_logits=request.keep_logits,
        progress=progress,
        cancel=cancel,
    )


def _plain_child(request: _ChildRun, progress: Progress, cancel: CancelToken) -> Generation:
    drop_adapter_notices(request.drop_notices)
    return _plain_run(request.package, request.config, cancel)


def _open(
    pkg: Package, config: BenchConfig, graph_capture: bool
) -> tuple[Callable[..., Generation], Any]:
    check_fits(pkg, config)
    if pkg.vocab_size < 1:
        from engine.errors import PackageError

        raise PackageError(
            f"'{pkg.path}': genai_config.json gives no model.vocab_size; a benchmark draws its "
            "prompt from the vocabulary. Fix the file or rebuild the package"
        )
    max_length = config.prompt_length + config.new_tokens
    if config.runtime == "genai":
        from engine.runtime.genai_runner import GenaiRunner

        genai = GenaiRunner(pkg, ep=config.ep, graph_capture=graph_capture, threads=config.threads)
        media = config.media
        if media is None:
            return genai.generate, genai

        def generate_media(prompt: Sequence[int], new_tokens: int, **kwargs: Any) -> Generation:
            return genai.generate_media(media, new_tokens, **kwargs)

        return generate_media, genai
    from engine.runtime.runner import Runner, RunnerOptions

    runner = Runner(
        pkg,
        RunnerOptions(
            ep=config.ep,
            kv_mode=config.kv_mode,
            graph_capture=graph_capture,
            max_length=max_length,
            threads=config.threads,
        ),
    )
    return runner.generate, runner


_STATUS = Path("/proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter for this process (Linux); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """Peak resident set size in bytes (VmHWM on Linux, else ru_maxrss)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)
