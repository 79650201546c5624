"""Export full-size Gemma 4 architectures and report where time and memory go. Prints one
JSON object.

One export (in this process):

    python benchmarks/export_e2b.py [--preset gemma4-e2b] [--ep cpu] [--dtype fp16]
        [--weight-bits 4] [--embedding-bits 4] [--model CHECKPOINT_DIR]

The memory matrix (goal: every E2B / E4B export peaks at <= 2 GiB RSS): every preset x
variant in its own child process, whose peak RSS is read from the kernel (``wait4``) when
it exits, so one export's peak never hides another's:

    python benchmarks/export_e2b.py --matrix [--presets gemma4-e2b,gemma4-e4b]
        [--variants cpu-fp32,cpu-fp16,cpu-int4,webgpu-fp16,webgpu-int4]
        [--before BEFORE.json] [--work DIR]

``--before`` embeds an earlier matrix (e.g. run with ``PYTHONPATH`` pointing at an older
checkout: the script only uses the engine's public export path) and adds before / after
columns to the summary. Each package is deleted as soon as it has been measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.logical import LogicalWeight
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from engine.presets import load_preset
from engine.weights import sources

GIB = 1024**3
RSS_GOAL = 2 * GIB
VARIANTS: dict[str, list[str]] = {
    "cpu-fp32": ["--ep", "cpu", "--dtype", "fp32"],
    "cpu-fp16": ["--ep", "cpu", "--dtype", "fp16"],
    "cpu-int4": ["--ep", "cpu", "--dtype", "fp32", "--weight-bits", "4", "--embedding-bits", "4"],
    "webgpu-fp16": ["--ep", "webgpu", "--dtype", "fp16"],
    "webgpu-int4": [
        *("--ep", "webgpu", "--dtype", "fp16"),
        *("--weight-bits", "4", "--embedding-bits", "4"),
    ],
    # calibrated: need a checkpoint with a tokenizer (random_checkpoint.py --tokenizer)
    "cpu-int4-gptq": [
        *("--ep", "cpu", "--dtype", "fp32", "--weight-bits", "4", "--embedding-bits", "4"),
        *("--quant-method", "gptq"),
    ],
    # the same on the first 2,048 tokens of the built-in text (a shorter calibration file)
    "cpu-int4-gptq-2k": [
        *("--ep", "cpu", "--dtype", "fp32", "--weight-bits", "4", "--embedding-bits", "4"),
        *("--quant-method", "gptq", "--calibration-tokens", "2048"),
    ],
}


class TimedRandomSource(sources.RandomSource):
    """RandomSource that adds up the seconds spent producing source data."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.seconds = 0.0
        self.bytes = 0
        self._lock = threading.Lock()

    def read(self, weight: LogicalWeight, *args: Any, **kwargs: Any) -> np.ndarray:
        began = time.perf_counter()
        out = super().read(weight, *args, **kwargs)
        with self._lock:
            self.seconds += time.perf_counter() - began
            self.bytes += out.nbytes
        return out


def _calibration_file(args: argparse.Namespace, root: Path) -> str | None:
    """``--calibration-tokens N``: a text file in ``root`` of the built-in calibration
    text's first N tokens by the checkpoint's tokenizer (what a user's shorter calibration
    file does)."""
    if not args.calibration_tokens:
        return None
    from tokenizers import Tokenizer

    from engine.calibration import sample_text

    text = sample_text()
    tokenizer = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    end = tokenizer.encode(text).offsets[args.calibration_tokens - 1][1]
    root.mkdir(parents=True, exist_ok=True)
    path = root / "calibration.txt"
    path.write_text(text[:end], encoding="utf-8")
    return str(path)


def one_export(args: argparse.Namespace) -> dict[str, Any]:
    """Export once in this process; the report of where time and memory went."""
    random_weights = args.model is None
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-e2b-"))
    options = ExportOptions(
        ep=args.ep,
        dtype=args.dtype,
        weight_bits=args.weight_bits,
        embedding_bits=args.embedding_bits,
        quant_method=args.quant_method,
        calibration=_calibration_file(args, root),
        random_weights=random_weights,
        modalities=("text",),
    )
    spec = load_preset(args.preset)
    export_plan = plan(spec, options)
    largest = max(t.nbytes for s in export_plan.sessions for t in s.tensors())

    timed = TimedRandomSource()
    original = sources.RandomSource
    import engine.pipeline as pipeline_module

    pipeline_module.RandomSource = lambda seed=0: timed  # type: ignore[assignment,misc]
    out = root / "pkg"
    stages: dict[str, float] = {}
    last = [time.perf_counter(), "start"]

    def progress(fraction: float, message: str) -> None:
        stage = message.split(" ")[0] if message.startswith("writing ") else message
        if message.startswith("calibration"):  # one stage, however many groups and layers
            stage = message.split(":")[0].split(",")[0]
        now = time.perf_counter()
        stages[str(last[1])] = stages.get(str(last[1]), 0.0) + now - float(last[0])
        last[0], last[1] = now, stage

    began = time.perf_counter()
    try:
        source = {"preset": args.preset} if random_weights else {"model_dir": args.model}
        result = export(out, options=options, overwrite=True, progress=progress, **source)
    finally:
        pipeline_module.RandomSource = original  # type: ignore[misc]
    wall = time.perf_counter() - began
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    total = result.total_bytes
    report = {
        "benchmark": "export_e2b",
        "preset": args.preset,
        "weights": "random" if random_weights else f"checkpoint {args.model}",
        "ep": args.ep,
        "dtype": args.dtype,
        "weight_bits": args.weight_bits,
        "embedding_bits": args.embedding_bits,
        "cpu_count": os.cpu_count(),
        "wall_seconds": round(wall, 2),
        "package_bytes": total,
        "plan_bytes": export_plan.nbytes,
        "write_throughput_mb_s": round(total / wall / 1e6, 1),
        "peak_rss_bytes": peak_rss,
        "largest_tensor_bytes": largest,
        "source_generation_seconds_summed": round(timed.seconds, 2),
        "source_bytes": timed.bytes,
        "stage_seconds": {k: round(v, 2) for k, v in stages.items()},
        "calibration_tokens": args.calibration_tokens,
        "notes": list(result.notes),
        "files": result.files,
    }
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return report


def child_export(preset: str, variant: str, work: Path, model: str | None) -> dict[str, Any]:
    """One export in a child process; its peak RSS as the kernel counted it."""
    cmd = [sys.executable, __file__, "--preset", preset, *VARIANTS[variant]]
    cmd += ["--out", str(work / f"{preset}-{variant}")]
    if model:
        cmd += ["--model", model]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    # Read both pipes before wait4 reaps the child (a full pipe would block it).
    streams: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda n=n, s=s: streams.__setitem__(n, s.read()))
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for reader in readers:
        reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    shutil.rmtree(work / f"{preset}-{variant}", ignore_errors=True)
    row: dict[str, Any] = {
        "preset": preset,
        "variant": variant,
        "command": " ".join(["python", "benchmarks/export_e2b.py", *cmd[2:]]),
        "rc": proc.returncode,
        "process_wall_seconds": round(wall, 1),
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2),
        "within_goal": usage.ru_maxrss * 1024 <= RSS_GOAL,
    }
    try:
        row["report"] = json.loads(streams["out"])
        row["export_wall_seconds"] = row["report"]["wall_seconds"]
    except (json.JSONDecodeError, KeyError):
        row["stderr_tail"] = streams["err"][-3000:]
    return row


def _git_head() -> str | None:
    import engine

    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(engine.__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def matrix(args: argparse.Namespace) -> dict[str, Any]:
    import engine

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "benchmark": "export_e2b_matrix",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "engine": str(Path(engine.__file__).parent),
        "engine_commit": _git_head(),
        "cpu_count": os.cpu_count(),
        "weights": "random" if args.model is None else f"checkpoint {args.model}",
        "rss_goal_bytes": RSS_GOAL,
        "runs": [],
    }
    for preset in args.presets.split(","):
        for variant in args.variants.split(","):
            row = child_export(preset, variant, work, args.model)
            report["runs"].append(row)
            print(
                f"{preset} {variant}: {row['peak_rss_gib']} GiB, "
                f"{row.get('export_wall_seconds')} s, rc {row['rc']}",
                file=sys.stderr,
            )
    if args.before:
        before = json.loads(Path(args.before).read_text())
        report["before"] = before
        report["summary"] = summary(before, report)
    else:
        report["summary"] = summary(None, report)
    return report


def summary(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """preset -> variant -> peak RSS GiB and export seconds, before and after."""

    def rows(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        return {
            (r["preset"], r["variant"]): {
                "peak_rss_gib": r["peak_rss_gib"],
                "wall_s": r.get("export_wall_seconds"),
            }
            for r in report["runs"]
        }

    new, old = rows(after), rows(before) if before else {}
    table: dict[str, Any] = {}
    for (preset, variant), cell in new.items():
        entry: dict[str, Any] = {"after": cell} if before else dict(cell)
        if (preset, variant) in old:
            entry["before"] = old[(preset, variant)]
        table.setdefault(preset, {})[variant] = entry
    table["all_within_goal"] = all(r["within_goal"] and r["rc"] == 0 for r in after["runs"])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--ep", default="cpu")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--weight-bits", type=int, default=None)
    parser.add_argument("--embedding-bits", type=int, default=None)
    parser.add_argument("--quant-method", default="rtn")
    parser.add_argument("--model", default=None, help="a checkpoint folder instead of random")
    parser.add_argument("--calibration-tokens", type=int, default=None, metavar="N")
    parser.add_argument("--out", default=None, help="folder to write into (default: a temp dir)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--matrix", action="store_true", help="every preset x variant")
    parser.add_argument("--presets", default="gemma4-e2b,gemma4-e4b")
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if "gptq" not in v))
    parser.add_argument("--before", default=None, help="an earlier --matrix JSON to compare")
    parser.add_argument("--work", default=None, help="where the matrix writes packages")
    args = parser.parse_args()
    if args.calibration_tokens and not args.model:
        parser.error("--calibration-tokens tokenizes with a checkpoint's tokenizer: add --model")
    report = matrix(args) if args.matrix else one_export(args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
