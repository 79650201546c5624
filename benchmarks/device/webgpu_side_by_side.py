"""Gemma 4 E2B on WebGPU, ours against the peer exporter (mobius), in one device call.

1. records the environment;
2. builds one random full-size E2B checkpoint (``--preset gemma4-e4b``: E4B) with
   transformers on the GPU (with the peer's transformers first on PYTHONPATH, so both
   exporters read a config they know);
3. exports it three ways at once: ours fp16, ours INT4 weights + INT4 embeddings, mobius
   fp16; each export's wall time and peak RSS (the kernel's, from ``wait4``) and decoder
   node count are recorded, then the checkpoint is deleted;
4. runs every package through onnxruntime-genai with graph capture off and on, at the
   package's default ``search.max_length`` and at 192 (prompt 128 random ids, 64 new
   tokens, greedy, median of 3 after a warm-up); our runner (``python -m engine bench``)
   on our packages; and an onnxruntime profile of decode steps of our INT4 and fp16 decoders,
   summed per op (GPU timestamps per kernel where the adapter has them);
5. deletes each package when it is done with it.

Each stage is a subprocess with a timeout inside one time budget; the JSON
(``$OUT/webgpu_side_by_side.json``) is rewritten after every stage, so a crash keeps what
was measured. ``--tiny`` runs the same steps at toy size on the CPU EP (the peer is
skipped when it is not installed): tests/benchmarks/test_side_by_side.py runs it.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stage_report import Report

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STAGES = HERE / "side_by_side_stages.py"
OURS = {
    "fp16": ["--dtype", "fp16"],
    "int4": ["--weight-bits", "4", "--embedding-bits", "4"],
    "int4_fp32": ["--weight-bits", "4", "--embedding-bits", "4", "--dtype", "fp32"],
}
DEFAULT_PACKAGES = "ours_fp16,ours_int4,mobius_fp16"


class Child:
    """A subprocess whose peak RSS the kernel reports when it is reaped (``wait4``)."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: dict[str, str] = {}
        self.result: dict[str, Any] = {}
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: Any) -> None:
        self.out[name] = stream.read()

    def wait(self, timeout: float) -> dict[str, Any]:
        """Wait until ``timeout`` seconds after the child started, then kill it."""
        deadline = self.started + max(timeout, 1)
        # Reap the child with wait4 only (Popen.poll would reap it and lose its rusage).
        while time.monotonic() < deadline:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.result["peak_rss_bytes"] = usage.ru_maxrss * 1024
                break
            time.sleep(0.2)
        else:
            self.proc.kill()
            self.proc.wait()
            self.result["timeout_s"] = round(timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        self.result.update(
            rc=self.proc.returncode,
            seconds=round(time.monotonic() - self.started, 1),
            cmd=" ".join(str(c) for c in self.cmd),
            stderr_tail=self.out.get("stderr", "")[-2500:],
        )
        if "peak_rss_bytes" in self.result:
            self.result["peak_rss_gib"] = round(self.result["peak_rss_bytes"] / 1024**3, 2)
        return self.result

    def json(self, timeout: float) -> dict[str, Any]:
        """Wait, then parse stdout (or its last line that parses) as the stage's JSON."""
        result = self.wait(timeout)
        stdout = self.out.get("stdout", "").strip()
        for text in (stdout, *reversed(stdout.splitlines())):
            try:
                result["result"] = json.loads(text)
                break
            except json.JSONDecodeError:
                continue
        else:
            result["stdout_tail"] = stdout[-2000:]
        return result


def environment(args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    for dist in (
        "onnxruntime",
        "onnxruntime-webgpu",
        "onnxruntime-genai",
        "onnx-ir",
        "onnx",
        "onnxscript",
        "torch",
        "transformers",
        "numpy",
    ):
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[dist] = None
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        env["gpu"] = subprocess.run(smi, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        env["gpu"] = f"none ({exc.__class__.__name__})"
    env["vk_driver_files"] = os.environ.get("VK_DRIVER_FILES")
    env["disk_free_gib"] = round(shutil.disk_usage(args.work).free / 1024**3, 1)
    return env


def peer_env(args: argparse.Namespace, report: Report) -> dict[str, str] | None:
    """The environment of the peer's processes: its wheels (mobius-onnx, transformers
    5.14.1, tokenizers, onnx-shape-inference) first on PYTHONPATH, or None if absent."""
    wheels = sorted(glob.glob(str(Path(args.peer_wheels) / "*.whl")))
    base = dict(os.environ)
    if wheels:
        site = Path(args.work) / "peer-site"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        cmd += ["--no-compile", "--target", str(site), *wheels]
        done = subprocess.run(cmd, capture_output=True, text=True)
        report.stage("peer_install", {"rc": done.returncode, "stderr": done.stderr[-1500:]})
        if done.returncode != 0:
            return None
        base["PYTHONPATH"] = os.pathsep.join([str(site), base.get("PYTHONPATH", "")])
        return base
    probe = subprocess.run([sys.executable, "-c", "import mobius"], capture_output=True)
    report.stage(
        "peer_install",
        {"wheels": 0, "mobius_importable": probe.returncode == 0},
    )
    return base if probe.returncode == 0 else None


def node_count(model: Path) -> dict[str, Any]:
    """Nodes of a decoder graph (read without its weights), by op type."""
    try:
        import onnx

        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception as exc:
        return {"error": str(exc)}
    ops: dict[str, int] = {}
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"nodes": len(graph.node), "by_op": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def decoder_file(package: Path) -> Path | None:
    try:
        config = json.loads((package / "genai_config.json").read_text())
        return package / config["model"]["decoder"]["filename"]
    except (OSError, KeyError, json.JSONDecodeError):
        return None


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def exports(
    args: argparse.Namespace,
    report: Report,
    checkpoint: Path,
    peer: dict[str, str] | None,
    ours: dict[str, list[str]] = OURS,
    with_peer: bool = True,
) -> dict[str, Path]:
    """All exports at once (their wall times overlap; each one's RSS is its own): ours
    ``ours_<variant>`` with each variant's flags, and (``with_peer``) the peer's fp16 where
    asked for."""
    work = Path(args.work)
    children: dict[str, tuple[Child, Path]] = {}
    for variant, flags in ours.items():
        if f"ours_{variant}" not in args.packages:
            continue
        out = work / f"ours-{variant}"
        cmd = [sys.executable, "-m", "engine", "build", "--model", str(checkpoint)]
        cmd += ["--ep", args.ep, *flags, "--quiet", "--json", "--overwrite", str(out)]
        children[f"ours_{variant}"] = (Child(cmd), out)
    if with_peer and "mobius_fp16" in args.packages:
        if peer is None:
            report.stage("export_mobius_fp16", {"skipped": "mobius is not installed here"})
        else:
            out = work / "mobius-fp16"
            cmd = [sys.executable, "-m", "mobius", "build", "--config", str(checkpoint)]
            cmd += ["--ep", args.ep, "--runtime", "ort-genai", "--dtype", "f16", str(out)]
            children["mobius_fp16"] = (Child(cmd, peer), out)
    packages = {}
    for name, (child, out) in children.items():
        result = child.json(min(args.export_timeout_s, report.remaining() - 60))
        result["concurrent_with"] = [n for n in children if n != name]
        ok = result.get("rc") == 0 and (out / "genai_config.json").is_file()
        result["ok"] = ok
        if ok:
            result["package_bytes"] = folder_bytes(out)
            model = decoder_file(out)
            result["decoder"] = node_count(model) if model else {"error": "no decoder entry"}
            packages[name] = out
        report.stage(f"export_{name}", result)
    return packages


def remove(path: Path, args: argparse.Namespace) -> None:
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)


def stage_args(args: argparse.Namespace) -> list[str]:
    return ["--ep", args.ep, "--prompt-len", str(args.prompt_len)]


def genai_bench(args: argparse.Namespace, report: Report, name: str, package: Path) -> None:
    cmd = [sys.executable, str(STAGES), "genai", str(package), *stage_args(args)]
    cmd += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
    cmd += ["--warmup", str(args.warmup), "--lengths", f"default,{args.short_length}"]
    cmd += ["--captures", "off,on"]
    report.stage(f"genai_{name}", Child(cmd).json(min(300, report.remaining() - 20)))


def ours_bench(args: argparse.Namespace, report: Report, name: str, package: Path) -> None:
    cmd = [sys.executable, "-m", "engine", "bench", str(package), "--json", "--quiet"]
    cmd += ["--graph-capture", "both" if args.ep != "cpu" else "off"]
    cmd += ["--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    cmd += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    report.stage(f"runner_{name}", Child(cmd).json(min(240, report.remaining() - 20)))


def profile(args: argparse.Namespace, report: Report, name: str, package: Path) -> None:
    cmd = [sys.executable, str(STAGES), "profile", str(package), *stage_args(args)]
    cmd += ["--steps", str(args.profile_steps), "--lengths", f"default,{args.short_length}"]
    report.stage(f"profile_{name}", Child(cmd).json(min(180, report.remaining() - 20)))


def make_checkpoint(
    args: argparse.Namespace, report: Report, peer: dict[str, str] | None
) -> Path | None:
    """A random checkpoint of ``args.preset`` in ``args.work`` (on the GPU, bf16; ``--tiny``:
    the CPU, fp32), as the report's ``checkpoint`` stage; None (and the report says so)
    when none could be made."""
    checkpoint = Path(args.work) / "checkpoint"
    cmd = [sys.executable, str(STAGES), "checkpoint", str(checkpoint)]
    cmd += ["--preset", args.preset, "--device", "cpu" if args.tiny else "cuda"]
    cmd += ["--dtype", "float32" if args.tiny else "bfloat16"]
    built = report.stage("checkpoint", Child(cmd, peer).json(min(240, report.remaining())))
    if built.get("rc") == 0:
        return checkpoint
    report.data["error"] = "no checkpoint; nothing to export"
    report.save()
    print(json.dumps(built, indent=1))
    return None


Action = Callable[[argparse.Namespace, Report, str, Path], None]


def run_plan(
    args: argparse.Namespace,
    report: Report,
    packages: dict[str, Path],
    plan: list[tuple[str, str]],
    actions: dict[str, Action],
    summary: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    """The GPU stages one at a time in ``plan`` order ((action, package) pairs, most wanted
    first, those past the budget recorded as skipped), each package deleted after its last
    stage; the summary rewritten after each, then printed."""
    for i, (action, name) in enumerate(plan):
        package = packages.get(name)
        if package is None:
            continue
        if report.remaining() < 40:
            report.stage(f"{action}_{name}", {"skipped": "no time left in the budget"})
        else:
            actions[action](args, report, name, package)
        if all(n != name for _, n in plan[i + 1 :]):
            remove(package, args)
        report.data["summary"] = summary(report.data["stages"])
        report.save()
    report.data["summary"] = summary(report.data["stages"])
    report.data["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    report.save()
    print(json.dumps(report.data["summary"], indent=1))


UNSTEADY = 0.15
"""A genai or runner row whose repeats spread wider than this share of their median is
listed in the summary's ``unsteady``: the machine's rate moved during it, so its median
says little."""


def unsteady(runs: list[float]) -> str:
    """``"low-high"`` where the repeats spread more than :data:`UNSTEADY` of their median,
    else ``""``."""
    if len(runs) < 2 or max(runs) - min(runs) <= UNSTEADY * statistics.median(runs):
        return ""
    return f"{round(min(runs), 2)}-{round(max(runs), 2)}"


def summarize(stages: dict[str, Any]) -> dict[str, Any]:
    """The side-by-side table: exports, genai tok/s per capture and length, our runner, and
    the genai and runner rows whose repeats disagree (``unsteady``)."""
    out: dict[str, Any] = {"exports": {}, "genai_decode_tok_s": {}, "runner_decode_tok_s": {}}
    out["unsteady"] = []
    for key, value in stages.items():
        if key.startswith("export_") and isinstance(value, dict) and "rc" in value:
            out["exports"][key[len("export_") :]] = {
                "ok": value.get("ok"),
                "wall_s": value.get("seconds"),
                "peak_rss_gib": value.get("peak_rss_gib"),
                "decoder_nodes": (value.get("decoder") or {}).get("nodes"),
                "package_gb": round(value.get("package_bytes", 0) / 1e9, 2),
            }
        if key.startswith("genai_"):
            result = (value or {}).get("result") or {}
            table: dict[str, Any] = {}
            for capture, entry in (result.get("captures") or {}).items():
                for row in entry.values():
                    if isinstance(row, dict):
                        cell = row.get("decode_tokens_per_second", row.get("error"))
                        label = f"capture_{capture}@{row.get('max_length')}"
                        table[label] = cell
                        spread = unsteady(row.get("decode_tokens_per_second_all") or [])
                        if spread:
                            name = key[len("genai_") :]
                            out["unsteady"].append(f"genai {name} {label}: {spread}")
                if "error" in entry or "skipped" in entry:
                    table[f"capture_{capture}"] = entry.get("error") or entry.get("skipped")
            out["genai_decode_tok_s"][key[len("genai_") :]] = table or value.get("stderr_tail")
        if key.startswith("runner_"):
            result = (value or {}).get("result") or {}
            rows = {
                mode: (result.get(mode) or {}).get("decode_tokens_per_second")
                for mode in ("off", "on")
                if isinstance(result.get(mode), dict)
            }
            if not rows and isinstance(result, dict):
                rows = {"off": result.get("decode_tokens_per_second")}
            out["runner_decode_tok_s"][key[len("runner_") :]] = rows
            for mode in ("off", "on"):
                spread = unsteady(
                    (result.get(mode) or {}).get("decode_tokens_per_second_runs") or []
                )
                if spread:
                    name = key[len("runner_") :]
                    out["unsteady"].append(f"runner {name} {mode}: {spread}")
        if key.startswith("profile_"):
            result = ((value or {}).get("result") or {}).get("lengths") or {}
            for label, run in result.items():
                gpu, host = run.get("gpu") or {}, run.get("host") or {}
                best = gpu if gpu.get("available") else host
                out[f"{key}@{label}"] = {
                    "kind": best.get("kind"),
                    "us_per_step": best.get("us_per_step"),
                    "step_ms_profiled": run.get("step_ms_profiled"),
                    "top_ops": [
                        (r["op"], r["us_per_step"], r["kernels_per_step"])
                        for r in best.get("top_ops", [])
                    ],
                }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy size on the CPU EP")
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--work", default="/tmp/side-by-side")
    parser.add_argument("--peer-wheels", default=str(REPO / ".whl" / "mobius"))
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--short-length", type=int, default=192)
    parser.add_argument("--profile-steps", type=int, default=16)
    parser.add_argument("--export-timeout-s", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep checkpoint and packages")
    parser.add_argument("--ep", default=None, help="default: webgpu (cpu with --tiny)")
    parser.add_argument("--checkpoint", default=None, help="use this checkpoint (kept)")
    parser.add_argument(
        "--preset",
        default="gemma4-e2b",
        choices=("gemma4-e2b", "gemma4-e4b"),
        help="architecture of the random checkpoint (--tiny: gemma4-tiny)",
    )
    parser.add_argument(
        "--packages",
        default=DEFAULT_PACKAGES,
        help=f"comma-separated, from {', '.join([*(f'ours_{v}' for v in OURS), 'mobius_fp16'])} "
        f"(default {DEFAULT_PACKAGES})",
    )
    args = parser.parse_args()
    args.packages = set(args.packages.split(","))
    known = {*(f"ours_{v}" for v in OURS), "mobius_fp16"}
    if args.packages - known:
        parser.error(f"unknown --packages {sorted(args.packages - known)}; known: {sorted(known)}")
    if args.tiny:
        args.preset = "gemma4-tiny"
    args.ep = args.ep or ("cpu" if args.tiny else "webgpu")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(os.environ.get("OUT") or work)
    report = Report(out / "webgpu_side_by_side.json", args.budget_s, "webgpu_side_by_side")
    report.data["settings"] = {
        k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()
    }
    report.stage("environment", environment(args))
    peer = peer_env(args, report)

    if args.checkpoint:
        checkpoint: Path | None = Path(args.checkpoint)
        report.stage("checkpoint", {"given": str(checkpoint)})
    else:
        checkpoint = make_checkpoint(args, report, peer)
    if checkpoint is None:
        return
    packages = exports(args, report, checkpoint, peer)
    if not args.checkpoint:
        remove(checkpoint, args)

    # GPU work one stage at a time, most wanted first, each package deleted after its
    # last stage.
    plan: list[tuple[str, str]] = [
        ("genai", "ours_int4"),
        ("profile", "ours_int4"),
        ("runner", "ours_int4"),
        ("genai", "ours_int4_fp32"),
        ("profile", "ours_int4_fp32"),
        ("genai", "ours_fp16"),
        ("profile", "ours_fp16"),
        ("genai", "mobius_fp16"),
        ("runner", "ours_fp16"),
    ]
    actions: dict[str, Action] = {"genai": genai_bench, "profile": profile, "runner": ours_bench}
    run_plan(args, report, packages, plan, actions, summarize)


if __name__ == "__main__":
    main()
