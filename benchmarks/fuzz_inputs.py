"""Fuzz the engine's inputs: seeded mutations of safetensors headers and bytes, shard indexes,
config.json fields, export options, genai_config.json and manifest fields (the input kinds),
and of media files, tokenizer files, lengths and numeric options, checkpoints of other formats
and damaged package files (the user kinds, benchmarks/fuzz_user_inputs.py), each run through
the CLI (``build``, ``info``, ``plan``, ``bench``, ``audit``, ``verify``) as a user would.

Every case is classified by outcome:

* ``clear error``: the command failed with an ``error: ...`` message (or an argparse usage
  error), no traceback;
* ``ok``: the command succeeded;
* ``traceback``: an exception escaped the CLI, or the process died;
* ``leftover``: the command left something behind (a staging or ``.old`` folder, an empty
  parent folder, a temporary file, a changed input) or, after a success, the package is
  missing;
* ``hang``: the case ran past ``--timeout`` seconds (the worker is killed);
* ``broken package``: ``build`` succeeded, but the package it wrote fails to generate greedy
  tokens on the CPU EP (a package that cannot run should have been refused), or its tokenizer
  does not load in onnxruntime-genai; or a command succeeded on a package file damaged on
  purpose that it reads. CUDA / TensorRT-RTX packages (their default is bf16 or fp16 kernels
  the CPU lacks) and bf16 ones are not run.

The goal is 0 tracebacks, 0 leftovers, 0 hangs and 0 broken packages. Cases are a pure function of
``(seed, index)``: ``--only 17 42`` replays cases. Workers are forked processes that run the
CLI in-process (no interpreter start per case), each under an address-space limit so that a
case that allocates without bound fails instead of taking the machine. Prints one JSON object:

    python benchmarks/fuzz_inputs.py --cases 3000 --seed 0 [--kinds media,lengths,...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz_mutations import (
    CONFIG_EXTRA_KEYS,
    Base,
    Case,
    mutate_bytes,
    mutate_header,
    mutate_json,
    plausible_sizes,
    random_options,
    write_shards,
)
from fuzz_user_inputs import (
    USER_KINDS,
    UserBase,
    make_user_base,
    must_fail,
    prepare_user_case,
    tokenizer_problem,
)

OUTCOMES = ("clear error", "ok", "traceback", "leftover", "hang", "broken package")
INPUT_KINDS = ("header", "bytes", "shards", "config", "options", "genai", "manifest")
KINDS = (*INPUT_KINDS, *USER_KINDS)
WEIGHTS = "model.safetensors"
ADDRESS_SPACE = 12 * 2**30
"""Per-worker address-space limit (onnxruntime reserves generously, so not too tight)."""


@dataclass
class Result:
    index: int
    kind: str
    outcome: str
    detail: str
    mutations: list[str]
    argv: list[str]
    seconds: float
    warnings: int = 0


# ---------------------------------------------------------------------- base fixtures


def make_base(root: Path) -> Base:
    from engine.options import ExportOptions
    from engine.pipeline import export
    from tests._support.fake_checkpoint import tiny_config, write_checkpoint

    config = tiny_config()
    model = write_checkpoint(root / "base-model", config)
    raw = (model / WEIGHTS).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header_bytes = raw[8 : 8 + length]
    package = root / "base-package"
    export(package, preset="gemma4-tiny", options=ExportOptions(random_weights=True, max_length=64))
    return Base(
        root=root,
        config=config,
        header=json.loads(header_bytes),
        header_bytes=header_bytes,
        data=raw[8 + length :],
        package=package,
        genai=json.loads((package / "genai_config.json").read_text()),
        manifest=json.loads((package / "export_studio.json").read_text()),
    )


# ------------------------------------------------------------------------------ cases


def prepare(
    base: Base,
    seed: int,
    index: int,
    folder: Path,
    kinds: tuple[str, ...] = KINDS,
    user: UserBase | None = None,
) -> Case:
    """Write the mutated inputs of case ``index`` into ``folder``; returns the case."""
    rng = random.Random(f"{seed}:{index}")
    kind = kinds[index % len(kinds)] if rng.random() < 0.7 else rng.choice(kinds)
    case = Case(index, kind)
    if kind in USER_KINDS:
        assert user is not None
        prepare_user_case(kind, rng, user, folder, case)
        return case
    model, out = folder / "M", folder / "out" / "pkg"
    if kind in ("genai", "manifest"):
        package = folder / "P"
        package.mkdir()
        for item in base.package.iterdir():
            os.link(item, package / item.name)
        name, doc = (
            ("genai_config.json", base.genai)
            if kind == "genai"
            else ("export_studio.json", base.manifest)
        )
        mutated = mutate_json(rng, doc, case, [])
        (package / name).unlink()
        (package / name).write_text(json.dumps(mutated))
        command = rng.choice(["bench", "bench", "audit", "genai"])
        if command == "audit":
            case.argv = ["audit", str(package), "--no-placement"]
        else:
            runtime = ["--runtime", "genai"] if command == "genai" else []
            lengths = rng.choice([["--prompt-len", "4", "--new-tokens", "2"], []])
            case.argv = ["bench", str(package), *runtime, "--repeats", "1", "--warmup", "0"]
            case.argv += [*lengths, "--graph-capture", "off", "--quiet"]
        return case
    model.mkdir()
    config = base.config
    random_weights = False
    if kind == "header":
        (model / WEIGHTS).write_bytes(mutate_header(rng, base, case))
    elif kind == "bytes":
        (model / WEIGHTS).write_bytes(mutate_bytes(rng, base, case))
    elif kind == "shards":
        write_shards(rng, base, model, case)
    elif kind == "config":
        if rng.random() < 0.5:
            config = plausible_sizes(rng, base.config, case)
        else:
            config = mutate_json(rng, base.config, case, CONFIG_EXTRA_KEYS)
        if rng.random() < 0.1 and isinstance(config, dict):
            config = {"model_type": "gemma4", "text_config": config}
            case.mutations.append("nested under text_config (multimodal)")
        random_weights = rng.random() < 0.6
        if not random_weights:
            os.link(base.root / "base-model" / WEIGHTS, model / WEIGHTS)
    else:  # options
        os.link(base.root / "base-model" / WEIGHTS, model / WEIGHTS)
    (model / "config.json").write_text(json.dumps(config))
    options = random_options(rng, case, wild=kind == "options") if rng.random() < 0.5 else []
    command = rng.choice(["build"] * 6 + ["info", "plan"])
    if command == "info":
        case.argv = ["info", "--model", str(model)]
    elif command == "plan":
        case.argv = ["plan", "--model", str(model), *options]
    else:
        case.argv = ["build", "--model", str(model), *options, "--quiet"]
        case.argv += ["--random-weights"] if random_weights else []
        case.argv.append(str(out))
    return case


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for path in sorted(folder.rglob("*")):
        try:
            info = path.lstat()
        except OSError:
            continue
        out[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return out


def leftovers(folder: Path, inputs: dict[str, tuple[int, int]], built: bool) -> list[str]:
    """What a case left behind besides its inputs and (after a build) its package: anything
    new (a staging or ``.old`` folder, an empty parent) or any input changed."""
    now = snapshot(folder)
    expected = {"out", "out/pkg"} if built else set()
    new = [
        name
        for name in now
        if name not in inputs and name not in expected and not name.startswith("out/pkg/")
    ]
    found = [f"new: {name}" for name in new[:3]]
    changed = [name for name in inputs if now.get(name) != inputs[name]]
    if changed:
        found.append(f"inputs changed: {changed[:3]}")
    if built and not (folder / "out" / "pkg" / "export_studio.json").is_file():
        found.append("the build succeeded but out/pkg has no manifest")
    return found


def run_cli(argv: list[str]) -> tuple[int | None, str, str, str | None]:
    """The CLI in this process: (exit code, stdout, stderr, traceback or None)."""
    from engine.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    code: int | None = None
    failure = None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            failure = traceback.format_exc()
    return code, stdout.getvalue(), stderr.getvalue(), failure


def runs_on_cpu(argv: list[str]) -> bool:
    """A package this build wrote that the CPU EP can run (any EP's graph, not bf16)."""
    if argv[0] != "build":
        return False
    options = dict(itertools.pairwise(argv))
    return options.get("--dtype") != "bf16" and options.get("--ep") not in ("cuda", "trt-rtx")


def run_package(package: Path, tmp: Path) -> str:
    """Why a built package fails to generate on the CPU EP ('' when it runs): a prompt and
    greedy tokens filling as much of its length as a short run needs (at least 1 + 1)."""
    from engine.errors import EngineError
    from engine.runtime.bench import sequence_limit
    from engine.runtime.package import open_package
    from engine.runtime.runner import greedy_tokens

    try:
        opened = open_package(package)
        limit = sequence_limit(opened) or 64
        prompt = [min(3, opened.vocab_size - 1)] * min(4, limit - 1)
        new = min(8, limit - len(prompt))
        tokens = greedy_tokens(package, prompt, new, ep="cpu")
    except EngineError as exc:
        return f"the built package does not run: {exc}"
    except Exception:
        return "the built package does not run: " + traceback.format_exc().strip().splitlines()[-1]
    if len(tokens) != new:
        return f"the built package generated {len(tokens)} tokens, not {new}"
    return ""


def classify(case: Case, folder: Path, inputs: dict[str, tuple[int, int]], tmp: Path) -> Result:
    code, stdout, stderr, failure = run_cli(case.argv)

    def result(outcome: str, detail: str) -> Result:
        warned = stderr.count("Warning")
        return Result(case.index, case.kind, outcome, detail, case.mutations, case.argv, 0, warned)

    if failure is not None:
        return result("traceback", failure.strip().splitlines()[-1])
    left = leftovers(folder, inputs, code == 0 and case.argv[0] == "build")
    # onnxruntime keeps a session id in $TMPDIR/.ses (one file, rewritten): not ours.
    stray = sorted(p.name for p in tmp.iterdir() if p.name != ".ses")
    if stray:
        left.append(f"temporary files: {stray[:3]}")
        for path in tmp.iterdir():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name != ".ses":
                path.unlink()
    if "Traceback (most recent call last)" in stderr + stdout:
        return result("traceback", "printed a traceback")
    if left:
        return result("leftover", "; ".join(left))
    if code == 0:
        broken = must_fail(case)
        if not broken and runs_on_cpu(case.argv):
            broken = run_package(folder / "out" / "pkg", tmp)
        if not broken and case.kind == "tokenizer":
            broken = tokenizer_problem(folder / "out" / "pkg")
        if broken:
            return result("broken package", broken)
        return result("ok", "")
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    message = next(
        (
            line
            for line in lines
            if line.startswith(("error:", "cancelled:")) or ": error: " in line
        ),
        None,
    )
    if message is not None:
        return result("clear error", message)
    return result("traceback", f"exit {code} without an error line: {lines[-1:]}")


# ----------------------------------------------------------------------------- workers


def worker(
    base: Base,
    seed: int,
    tasks: Any,
    results: Any,
    work: Path,
    kinds: tuple[str, ...] = KINDS,
    user: UserBase | None = None,
) -> None:
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # onnxruntime's own logging goes to fd 2
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    while True:
        index = tasks.get()
        if index is None:
            return
        results.put(("started", index, os.getpid()))
        folder = work / f"case-{index}"
        folder.mkdir()
        started = time.perf_counter()
        try:
            case = prepare(base, seed, index, folder, kinds, user)
            result = classify(case, folder, snapshot(folder), tmp)
        except BaseException:
            detail = "fuzzer error: " + traceback.format_exc().strip().splitlines()[-1]
            result = Result(index, "?", "traceback", detail, [], [], 0.0)
        result.seconds = time.perf_counter() - started
        shutil.rmtree(folder, ignore_errors=True)
        results.put(("done", index, asdict(result)))


def run(
    cases: int = 200,
    seed: int = 0,
    workers: int = 2,
    timeout: float = 300.0,
    only: list[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    """Run the fuzz cases of ``kinds``; returns the report (see the module docstring)."""
    import engine.cli
    import engine.pipeline
    import engine.runtime.bench  # noqa: F401

    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="fuzz-inputs-"))
    try:
        base = make_base(root / "base")
        user = make_user_base(root / "user") if set(kinds) & set(USER_KINDS) else None
        indices = list(only) if only else list(range(cases))
        context = mp.get_context("fork")
        tasks: Any = context.Queue()
        results: Any = context.Queue()
        for index in indices:
            tasks.put(index)
        # pid -> (process, the case it runs or None, since when)
        running: dict[int, tuple[Any, int | None, float]] = {}
        spawned = 0

        def spawn() -> None:
            nonlocal spawned
            process = context.Process(
                target=worker,
                args=(base, seed, tasks, results, root / f"worker-{spawned}", kinds, user),
            )
            process.start()
            spawned += 1
            running[process.pid] = (process, None, time.monotonic())

        for _ in range(max(1, min(workers, len(indices)))):
            spawn()
        reports: dict[int, Result] = {}
        while len(reports) < len(indices):
            try:
                state, index, payload = results.get(timeout=1.0)
            except queue.Empty:
                state = None
            if state == "started" and payload in running:
                running[payload] = (running[payload][0], index, time.monotonic())
            elif state == "done":
                reports[index] = Result(**payload)
                if progress is not None:
                    progress(len(reports), len(indices))
            for pid, (process, current, since) in list(running.items()):
                if current is None or current in reports:
                    continue
                late = time.monotonic() - since > timeout
                if not late and process.is_alive():
                    continue
                if late:
                    process.kill()
                process.join()
                detail = (
                    f"no result after {timeout:.0f} s"
                    if late
                    else f"the worker died (exit code {process.exitcode})"
                )
                outcome = "hang" if late else "traceback"
                reports[current] = Result(current, "?", outcome, detail, [], [], timeout)
                del running[pid]
                spawn()
        for _ in running:
            tasks.put(None)
        for process, _, _ in running.values():
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(seed, [reports[i] for i in indices], time.perf_counter() - started, kinds)


def report(
    seed: int, results: list[Result], seconds: float, kinds: tuple[str, ...] = KINDS
) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = {}
    for r in results:
        by_kind.setdefault(r.kind, Counter())[r.outcome] += 1
    errors = Counter(_shape(r.detail) for r in results if r.outcome == "clear error")
    return {
        "seed": seed,
        "kinds": list(kinds),
        "cases": len(results),
        "seconds": round(seconds, 1),
        "outcomes": {o: sum(1 for r in results if r.outcome == o) for o in OUTCOMES},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "ok_with_warnings": sum(1 for r in results if r.outcome == "ok" and r.warnings),
        "slowest_case_seconds": round(max((r.seconds for r in results), default=0.0), 2),
        "common_errors": dict(errors.most_common(12)),
        "findings": [asdict(r) for r in results if r.outcome not in ("clear error", "ok")][:50],
    }


def _shape(message: str) -> str:
    """A message with its paths, names and numbers blanked, to count kinds of errors."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|/[^\s:;,)]+", "_", message)
    text = re.sub(r"-?\d[\d,.]*(e[+-]?\d+)?", "N", text)
    return text[:90]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a hang")
    parser.add_argument("--only", type=int, nargs="*", help="replay these case indices")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--kinds",
        type=lambda text: tuple(text.split(",")),
        default=KINDS,
        help=f"comma-separated kinds of cases (default all: {','.join(KINDS)})",
    )
    args = parser.parse_args()
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {','.join(KINDS)}")

    def show(done: int, total: int) -> None:
        if not args.quiet and (done % 100 == 0 or done == total):
            print(f"{done}/{total}", file=sys.stderr, flush=True)

    result = run(args.cases, args.seed, args.workers, args.timeout, args.only, show, args.kinds)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
