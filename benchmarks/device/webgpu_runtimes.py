"""Two WebGPU runtimes against transformers on one full-size fp32 package (issue 21), one call.

1. a random full-size checkpoint of the preset (``side_by_side_stages.py checkpoint``:
   transformers' own initialisation, bf16) and our fp32 WebGPU text package of it;
2. transformers in fp32 on the GPU (eager attention, TF32 off): greedy tokens after a
   seeded random prompt and the last row of logits at every step;
3. each runtime (``--runtime NAME=SITE_OR_PYTHON``: a folder put first on PYTHONPATH for
   this interpreter, or another interpreter) runs the package with
   tests/webgpu/run_package.py, teacher-forced on transformers' tokens, capture off
   (``plain:dynamic``) and on (``capture:static``);
4. per runtime and mode: max |logit diff| and cosine per step against transformers, top-1
   agreement, and the same between the two runtimes.

``$OUT/webgpu_runtimes.json`` (or ``--json-out``) is rewritten after each stage.

    python3 benchmarks/device/webgpu_runtimes.py --runtime plugin=/tmp/site_plugin \\
        --runtime ort127=/tmp/site --budget-s 540

At toy size here (``--preset gemma4-tiny --device cpu``, the plugin on lavapipe and
.venv-webgpu's 1.27):

    python benchmarks/device/webgpu_runtimes.py --preset gemma4-tiny --device cpu \\
        --runtime plugin=.venv/bin/python --runtime ort127=.venv-webgpu/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from stage_report import Report

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNNER = REPO / "tests" / "webgpu" / "run_package.py"


def child(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, stdout: bool = False
) -> dict[str, Any]:
    """Run one stage; its exit code and stderr's tail (and stdout's with ``stdout``)."""
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout, 1)
        )
    except subprocess.TimeoutExpired as exc:
        return {"cmd": " ".join(cmd), "timeout_s": round(timeout), "stderr_tail": str(exc)[-500:]}
    result = {"cmd": " ".join(cmd), "rc": done.returncode, "stderr_tail": done.stderr[-2500:]}
    if stdout:
        result["stdout"] = done.stdout[-4000:]
    return result


def stdout_json(stage: dict[str, Any]) -> dict[str, Any] | None:
    """The last JSON object line a ``child(..., stdout=True)`` stage printed (its stdout is
    dropped from the stage), or None."""
    lines = [line for line in stage.pop("stdout", "").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def random_checkpoint(report: Report, work: Path, preset: str, device: str) -> Path | None:
    """A fresh ``work`` folder with a random full-size checkpoint of ``preset`` in it
    (``side_by_side_stages.py checkpoint``), recorded as the report's ``checkpoint`` stage;
    None when it could not be made."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    checkpoint = work / "checkpoint"
    stage = [sys.executable, str(HERE / "side_by_side_stages.py"), "checkpoint"]
    made = child(
        [*stage, str(checkpoint), "--preset", preset, "--device", device],
        min(300, report.remaining()),
    )
    report.stage("checkpoint", made)
    return checkpoint if made.get("rc") == 0 else None


def export_text(checkpoint: Path, package: Path, ep: str, dtype: str, timeout: float) -> dict:
    """``python -m engine build`` of the checkpoint's text decoder, as a stage."""
    build = [sys.executable, "-m", "engine", "build", "--model", str(checkpoint)]
    flags = ["--ep", ep, "--dtype", dtype, "--modalities", "text", "--quiet"]
    return child([*build, *flags, str(package)], timeout)


def runtime_env(spec: str) -> tuple[str, list[str], dict[str, str]]:
    """``NAME=PATH``: the interpreter and environment that run the package."""
    name, _, path = spec.partition("=")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    target = Path(path)
    if target.is_file():  # another interpreter
        return name, [str(target)], env
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(REPO)])
    return name, [sys.executable], env


def transformers_rows(
    checkpoint: Path,
    prompt: list[int],
    steps: int,
    *,
    dtype: str = "float32",
    device: str = "cuda",
    forced: list[int] | None = None,
) -> tuple[np.ndarray, list[int]]:
    """transformers' last logits row per step (prompt first, ``steps + 1`` rows) and its
    greedy tokens; ``forced`` feeds those tokens instead of its own (teacher forcing).
    Eager attention, TF32 off."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=getattr(torch, dtype), attn_implementation="eager"
    ).to(device)
    model.eval()
    rows, tokens = [], []
    with torch.no_grad():
        result = model(torch.tensor([prompt], device=device), use_cache=True)
        for i in range(steps + 1):
            row = result.logits[0, -1].float()
            rows.append(row.cpu().numpy())
            tokens.append(int(row.argmax()))
            if i == steps:
                break
            feed = forced[i] if forced is not None else tokens[-1]
            step = torch.tensor([[feed]], device=device)
            result = model(step, past_key_values=result.past_key_values, use_cache=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return np.stack(rows), tokens


def reference(args: argparse.Namespace, checkpoint: Path, out: Path) -> dict[str, Any]:
    """transformers fp32 from a seeded random prompt: its greedy tokens, the rows saved."""
    import transformers

    vocab = transformers.AutoConfig.from_pretrained(checkpoint).get_text_config().vocab_size
    prompt = np.random.default_rng(args.seed).integers(4, vocab, args.prompt_len).tolist()
    rows, tokens = transformers_rows(checkpoint, prompt, args.steps, device=args.device)
    np.save(out, rows)
    return {
        "prompt": prompt,
        "tokens": tokens,
        "transformers": __import__("transformers").__version__,
    }


def compare(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    diff = np.abs(a.astype(np.float64) - b).max(axis=1)
    cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    top = a.argmax(axis=1) == b.argmax(axis=1)
    return {
        "max_abs_diff": float(diff.max()),
        "max_abs_diff_per_step": [round(float(d), 6) for d in diff],
        "min_cosine": float(cos.min()),
        "top1_agreement": f"{int(top.sum())}/{len(top)}",
        "logit_range": float(np.abs(b).max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", action="append", required=True, help="NAME=SITE_DIR|PYTHON")
    p.add_argument("--preset", default="gemma4-e2b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=540)
    p.add_argument("--work", default="/tmp/webgpu_runtimes")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    path = Path(args.json_out) if args.json_out else out_dir / "webgpu_runtimes.json"
    report = Report(path, args.budget_s, "webgpu_runtimes")
    work = Path(args.work)
    checkpoint, package = random_checkpoint(report, work, args.preset, args.device), work / "fp32"
    if checkpoint is None:
        return
    built = export_text(checkpoint, package, "webgpu", "fp32", min(400, report.remaining()))
    built["package_bytes"] = sum(f.stat().st_size for f in package.glob("*") if f.is_file())
    report.stage("export_fp32", built)
    if built.get("rc") != 0:
        return
    try:
        ref = reference(args, checkpoint, work / "reference.npy")
    except Exception as exc:  # record and stop: nothing to compare against
        report.stage("transformers", {"error": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    report.stage("transformers", ref)
    ref_rows = np.load(work / "reference.npy")
    shutil.rmtree(checkpoint, ignore_errors=True)
    logits: dict[str, np.ndarray] = {}
    for spec in args.runtime:
        name, python, env = runtime_env(spec)
        saved = work / f"{name}.npz"
        stage = child(
            [
                *python,
                str(RUNNER),
                str(package),
                "--prompt",
                ",".join(map(str, ref["prompt"])),
                "--steps",
                str(args.steps),
                "--max-length",
                str(args.prompt_len + args.steps + 16),
                "--runs",
                "plain:dynamic,capture:static",
                "--force",
                ",".join(map(str, ref["tokens"][: args.steps])),
                "--save-logits",
                str(saved),
                "--json-out",
                str(work / f"{name}.json"),
            ],
            min(300, report.remaining()),
            env,
        )
        if (work / f"{name}.json").exists():
            run = json.loads((work / f"{name}.json").read_text())
            stage["runtime"] = run.get("runtime") or run.get("onnxruntime")
            stage["placement"] = {
                k: run.get("placement", {}).get(k) for k in ("nodes_by_provider", "strict_ok")
            }
            stage["runs"] = {
                mode: {k: v for k, v in r.items() if k in ("error", "seconds", "capture_log")}
                for mode, r in run.get("runs", {}).items()
            }
        if saved.exists():
            with np.load(saved) as data:
                for mode in data.files:
                    logits[f"{name}:{mode}"] = data[mode]
                    stage.setdefault("vs_transformers", {})[mode] = compare(data[mode], ref_rows)
        report.stage(f"runtime_{name}", stage)
    names = sorted(logits)
    report.data["between_runs"] = {
        f"{a} vs {b}": {
            k: v for k, v in compare(logits[a], logits[b]).items() if k != "max_abs_diff_per_step"
        }
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    report.save()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
