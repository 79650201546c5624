"""Our onnxruntime runner against onnxruntime-genai on the same package, side by side.

For each runtime: load time, time to first token, prefill and decode tokens/s (median
and spread over repeats after warm-up), peak RSS and the provider that ran the nodes;
with graph capture off and, where the EP can capture, on (the capture run validated
against the capture-off run: same greedy tokens, max logit difference). All settings are
loaded together and their runs interleaved (A, B, C, A, B, C, ...) so that drift on a
shared machine hits each alike (peak RSS is then the process's); on the CPU EP settings
run one after another instead, since two sessions' thread pools would fight for the same
cores. A setting that fails is reported in the JSON instead of stopping the benchmark.

Prints one JSON object. Run from the repository root:

    python benchmarks/bench_runtime.py [PACKAGE] [--ep EP] [--prompt-len 128]
        [--new-tokens 64] [--repeats 3] [--runtimes ort,genai] [--graph-capture auto|off|both]

Without PACKAGE a package is built first into a temporary folder (default: the
gemma4-tiny preset, random weights, for --build-ep) and removed afterwards.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.errors import EngineError
from engine.runtime.bench import BenchConfig, Outcome, interleave, run_bench
from engine.runtime.generation import Generation, compare
from engine.runtime.package import Package, open_package
from engine.runtime.session import available_providers


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    import onnxruntime as ort

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "onnxruntime": ort.__version__,
        "onnxruntime_package": next(
            (p for p in ("onnxruntime-webgpu", "onnxruntime-gpu", "onnxruntime") if _version(p)),
            None,
        ),
        "onnxruntime_genai": _version("onnxruntime-genai"),
        "providers": available_providers(),
    }


def build(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from engine.options import ExportOptions
    from engine.pipeline import export

    options = ExportOptions(
        ep=args.build_ep,
        dtype=args.dtype,
        weight_bits=args.weight_bits,
        embedding_bits=args.embedding_bits,
        random_weights=True,
    )
    result = export(folder / "pkg", preset=args.preset, options=options)
    return {"preset": args.preset, "ep": args.build_ep, "seconds": result.seconds}


def warm_page_cache(folder: Path) -> float:
    """Read every file once so the first runtime's load time is not a cold disk read."""
    started = time.perf_counter()
    for path in folder.iterdir():
        if path.is_file():
            with path.open("rb") as handle:
                while handle.read(1 << 24):
                    pass
    return time.perf_counter() - started


def can_capture(package: Package, ep: str | None) -> bool:
    from engine.caps import get_caps

    caps = get_caps(ep or package.ep)
    capture = bool(caps.capture_option)
    return caps.graph_capture and package.share_buffer and capture


def sequential(package: Package, settings: list[tuple[BenchConfig, bool]]) -> list[Outcome]:
    """One setting loaded at a time (CPU runtimes: no two thread pools on the same cores)."""
    outcomes = []
    for config, capture in settings:
        try:
            result, reference = run_bench(package, config, graph_capture=capture, keep_logits=True)
            outcomes.append(Outcome(config.runtime, capture, result, reference))
        except EngineError as exc:
            outcomes.append(Outcome(config.runtime, capture, error=str(exc)))
    return outcomes


def bench_all(
    package: Package, config: BenchConfig, runtimes: list[str], capture: bool, schedule: str
) -> dict[str, Any]:
    """Every runtime x capture setting, interleaved or one after another; never raises."""
    settings = [
        (replace(config, runtime=runtime), on)  # type: ignore[arg-type]
        for runtime in runtimes
        for on in ((False, True) if capture else (False,))
    ]
    started = time.perf_counter()
    try:
        run = interleave if schedule == "interleave" else sequential
        outcomes = run(package, settings)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(5)}
    runs: dict[str, dict[str, Any]] = {}
    references: dict[tuple[str, bool], Generation] = {}
    for outcome in outcomes:
        run = runs.setdefault(outcome.runtime, {"off": None, "on": None, "errors": {}})
        mode = "on" if outcome.graph_capture else "off"
        run[mode] = outcome.result.to_json() if outcome.result else None
        if outcome.error:
            run["errors"][mode] = outcome.error
        if outcome.reference is not None:
            references[(outcome.runtime, outcome.graph_capture)] = outcome.reference
    if not capture:
        for run in runs.values():
            run["errors"]["on"] = "capture not applicable to this EP / package"
    for runtime, run in runs.items():
        off, on = run["off"], run["on"]
        speedup = (
            on["decode_tokens_per_second"] / off["decode_tokens_per_second"] if off and on else None
        )
        pair = (references.get((runtime, False)), references.get((runtime, True)))
        agreement = compare(*pair) if pair[0] and pair[1] else None  # type: ignore[arg-type]
        run["capture_speedup"] = speedup
        run["capture_agreement"] = agreement.to_json() if agreement else None
        run["capture_validated"] = agreement.same_tokens if agreement else None
    plain = [references.get((rt, False)) for rt in ("ort", "genai")]
    cross = compare(*plain) if all(plain) else None  # type: ignore[arg-type]
    return {
        "schedule": schedule,
        "runs": runs,
        "ort_vs_genai_agreement": cross.to_json() if cross else None,
        "seconds": time.perf_counter() - started,
    }


def _decode(run: dict[str, Any], mode: str) -> float | None:
    record = run.get(mode)
    return record["decode_tokens_per_second"] if record else None


def summarize(runs: dict[str, dict[str, Any]], cross: dict[str, Any] | None) -> dict[str, Any]:
    decode = {
        f"{rt}_{mode}": _decode(run, mode) for rt, run in runs.items() for mode in ("off", "on")
    }
    ratio: dict[str, float | None] = {}
    for mode in ("off", "on"):
        ours, genai = decode.get(f"ort_{mode}"), decode.get(f"genai_{mode}")
        ratio[mode] = ours / genai if ours and genai else None
    return {
        "decode_tokens_per_second": decode,
        "ort_over_genai_decode": ratio,
        "capture_speedup": {rt: run.get("capture_speedup") for rt, run in runs.items()},
        "capture_validated": {rt: run.get("capture_validated") for rt, run in runs.items()},
        "same_greedy_tokens_ort_genai": cross["same_tokens"] if cross else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", help="package folder (default: build one)")
    parser.add_argument("--ep", default=None, help="EP to run on (default: the package's)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runtimes", default="ort,genai", help="comma-separated: ort, genai")
    parser.add_argument("--graph-capture", choices=("auto", "off", "both"), default="auto")
    parser.add_argument(
        "--threads",
        default="auto",
        help="intra-op threads for both runtimes; auto = all cores on the CPU EP (genai "
        "and onnxruntime default to different counts), the runtimes' defaults elsewhere",
    )
    parser.add_argument(
        "--schedule",
        choices=("auto", "interleave", "sequential"),
        default="auto",
        help="interleave runs of all settings loaded together, or one setting at a time; "
        "auto = sequential on the CPU EP (thread pools would share the cores), else interleave",
    )
    parser.add_argument("--preset", default="gemma4-tiny", help="preset to build without PACKAGE")
    parser.add_argument("--build-ep", default="cpu", help="EP to build for without PACKAGE")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--weight-bits", type=int, default=None)
    parser.add_argument("--embedding-bits", type=int, default=None)
    args = parser.parse_args()

    report: dict[str, Any] = {
        "benchmark": "bench_runtime",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
    }
    temp = None
    try:
        if args.package:
            folder = Path(args.package)
        else:
            temp = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
            report["built"] = build(args, temp)
            folder = temp / "pkg"
        package = open_package(folder)
        report["package"] = {
            "path": str(package.path),
            "built_for": package.ep,
            "dtype": package.dtype,
            "quantized": package.quantized,
            "share_buffer": package.share_buffer,
            "bytes": sum(p.stat().st_size for p in package.path.iterdir() if p.is_file()),
        }
        report["package"]["page_cache_warmup_s"] = warm_page_cache(package.path)
        on_cpu = (args.ep or package.ep) == "cpu"
        if args.threads == "auto":
            threads = os.cpu_count() if on_cpu else None
        else:
            threads = int(args.threads) or None
        config = BenchConfig(
            ep=args.ep,
            threads=threads,
            prompt_length=args.prompt_len,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            warmup=args.warmup,
        )
        capture = args.graph_capture == "both" or (
            args.graph_capture == "auto" and can_capture(package, args.ep)
        )
        report["settings"] = {
            "ep": args.ep or package.ep,
            "prompt_length": args.prompt_len,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "threads": threads,
            "graph_capture_both": capture,
        }
        runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
        schedule = args.schedule
        if schedule == "auto":
            schedule = "sequential" if on_cpu else "interleave"
        measured = bench_all(package, config, runtimes, capture, schedule)
        report.update(measured)
        if "runs" in measured:
            report["summary"] = summarize(measured["runs"], measured["ort_vs_genai_agreement"])
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
