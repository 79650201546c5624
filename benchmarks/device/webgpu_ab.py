"""A change to the WebGPU decoder measured against the engine before it, in one device call:
the same preset and options built by two engines, then decode through onnxruntime-genai
with graph capture on at the package's default ``search.max_length`` and at a short one,
the two packages alternating (baseline, this checkout, baseline, this checkout) so drift
on the machine falls on both.

    python3 webgpu_ab.py --baseline ../../.wt-old [--preset gemma4-e2b] [--rounds 2]
    python3 webgpu_ab.py --variants "sym128=--modalities text --weight-bits 4 \
        --embedding-bits 4 --symmetric --block-size 128"

``--baseline DIR`` is another commit's ``engine/`` and ``resources/`` (``git archive REV
engine resources | tar -x -C DIR``); ``--baseline DIR1,DIR2`` measures each (named by
its folder) before this checkout. ``--variants "NAME=OPTIONS;..."`` adds packages of this
checkout built with other options (a flag's cost or gain, same engine). Each package is
built by ``python -m engine build --random-weights`` with ``--options`` (default: text
only, INT4 weights and tables) unless a variant names its own, and
timed by ``side_by_side_stages.py genai`` (prompt 128 random ids, 64 new tokens, median of
3 after a warm-up), which also records the greedy tokens. Writes ``$OUT/webgpu_ab.json``
after every stage; ``summary`` has decode tok/s per package, length and round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stage_report import Report

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STAGES = HERE / "side_by_side_stages.py"


def _env(engine: Path) -> dict[str, str]:
    """This interpreter's site (the runtime) first, then ``engine``'s checkout."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != REPO]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(engine)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _child(
    cmd: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None
) -> dict[str, Any]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": f"timed out after {timeout:.0f} s"}
    out: dict[str, Any] = {"rc": done.returncode, "seconds": round(time.monotonic() - started, 1)}
    if done.returncode:
        out["stderr_tail"] = done.stderr[-1500:]
    out["stdout_tail"] = done.stdout[-4000:]
    return out


def _last_json(text: str) -> Any:
    for line in reversed(text.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="", help="engine folders, comma-separated")
    parser.add_argument(
        "--variants",
        default="",
        help='this checkout with other options too: "NAME=OPTIONS;NAME2=OPTIONS2"',
    )
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--options", default="--modalities text --weight-bits 4 --embedding-bits 4")
    parser.add_argument("--short-length", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/webgpu_ab"))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--budget-s", type=float, default=540)
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    report = Report(out_dir / "webgpu_ab.json", args.budget_s, "webgpu_ab")
    builds = {  # name -> (engine folder, build options)
        Path(d).resolve().name.lstrip("."): (Path(d).resolve(), args.options)
        for d in filter(None, args.baseline.split(","))
    }
    builds["this"] = (REPO, args.options)
    for item in filter(None, args.variants.split(";")):
        name, _, options = item.partition("=")
        if not name.strip() or not options.strip() or name.strip() in builds:
            parser.error(f"--variants {item!r}: give NAME=OPTIONS with a new name")
        builds[name.strip()] = (REPO, options)
    if len(builds) < 2:
        parser.error("nothing to compare: give --baseline DIR or --variants NAME=OPTIONS")
    engines = {name: engine for name, (engine, _) in builds.items()}
    report.data["builds"] = {name: options for name, (_, options) in builds.items()}
    packages: dict[str, Path] = {}
    for name, (engine, options) in builds.items():
        package = args.work / name
        shutil.rmtree(package, ignore_errors=True)
        cmd = [sys.executable, "-m", "engine", "build", "--preset", args.preset]
        cmd += ["--random-weights", "--ep", "webgpu", *options.split(), "--quiet"]
        # Started in the engine's folder: ``-m engine`` looks in the working folder first.
        build = [*cmd, str(package.resolve())]
        result = _child(build, _env(engine), min(300, report.remaining()), cwd=engine)
        report.stage(f"build_{name}", result)
        if result.get("rc") == 0:
            packages[name] = package
    summary: dict[str, Any] = {}
    for round_ in range(args.rounds):
        for name, package in packages.items():
            if report.remaining() < 60:
                break
            cmd = [sys.executable, str(STAGES), "genai", str(package), "--ep", "webgpu"]
            cmd += ["--prompt-len", "128", "--new-tokens", str(args.new_tokens), "--repeats", "3"]
            cmd += ["--warmup", "1", "--lengths", f"default,{args.short_length}"]
            cmd += ["--captures", "on"]
            result = _child(cmd, _env(engines[name]), min(240, report.remaining() - 20))
            parsed = _last_json(result.get("stdout_tail", ""))
            result["result"] = parsed
            report.stage(f"genai_{name}_round{round_}", result)
            for row in ((parsed or {}).get("captures", {}).get("on") or {}).values():
                if isinstance(row, dict) and "max_length" in row:
                    cell = row.get("decode_tokens_per_second", row.get("error"))
                    summary.setdefault(name, {}).setdefault(str(row["max_length"]), []).append(cell)
            report.data["summary"] = summary
            report.save()


if __name__ == "__main__":
    main()
