"""Do two engines build CUDA packages that compute the same thing on the CUDA EP? One call.

Builds the preset (random weights, ``--ep cuda``, text) with the engine in ``--baseline``
(another commit's ``engine/`` and ``resources/``) and with this checkout's, same flags, then
runs both through our runner on the CUDA EP (onnxruntime-gpu from ``--cuda-site``) with CUDA
graphs on: greedy tokens of the baseline package, then both packages teacher-forced on them.
Prints one JSON object: per step the max |logit difference| and the cosine between the two
packages' logits, and how many greedy tokens they share. For graph changes that must not
change the math (a different kernel, buffers shared in place), where the CPU EP cannot say
what the CUDA kernels do.

    python3 cuda_ab_logits.py --cuda-site /tmp/site_cuda --baseline ../../.wt-base \
      --flags "--dtype fp16"
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from families_gpu import REPO, cuda_env

RUN = """
import json, sys
import numpy as np
from engine.runtime.runner import Runner, RunnerOptions
package, prompt, steps, forced, out, ep = sys.argv[1:7]
prompt, steps, forced = json.loads(prompt), int(steps), json.loads(forced)
runner = Runner(package, RunnerOptions(ep=ep, graph_capture=ep == "cuda"))
free = runner.generate(prompt, steps)
result = {"provider": runner.provider, "tokens": free.tokens}
if forced:
    run = runner.generate(prompt, len(forced), forced=forced, keep_logits=True)
    np.save(out, np.stack(run.logits).astype(np.float32))
print("RESULT", json.dumps(result))
"""


def _child(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> str:
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=400)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd[:6])} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-site", default="/tmp/site_cuda")
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--flags", default="--dtype fp16")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--ep", default="cuda", help="cpu: a dry run of the script itself")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cuda_ab_"))
    prompt = [int(t) for t in np.random.default_rng(0).integers(10, 500, args.prompt_len)]
    packages = {}
    for name, engine in (("baseline", Path(args.baseline).resolve()), ("this", REPO)):
        package = work / name
        build = [sys.executable, "-m", "engine", "build", "--preset", args.preset]
        build += ["--random-weights", "--ep", args.ep, "--modalities", "text"]
        build += [*shlex.split(args.flags), "--quiet", "--overwrite", str(package)]
        _child(build, cuda_env(args.cuda_site, engine), cwd=str(engine))
        packages[name] = package
    env = cuda_env(args.cuda_site)
    runs, logits = {}, {}
    forced: list[int] = []
    for name in ("baseline", "this"):
        out = work / f"{name}.npy"
        cmd = [sys.executable, "-c", RUN, str(packages[name]), json.dumps(prompt)]
        cmd += [str(args.steps), json.dumps(forced), str(out), args.ep]
        line = next(x for x in _child(cmd, env).splitlines() if x.startswith("RESULT"))
        runs[name] = json.loads(line.split(" ", 1)[1])
        if name == "baseline":  # its greedy tokens force both packages
            forced = runs[name]["tokens"]
            cmd[-3] = json.dumps(forced)
            _child(cmd, env)
        logits[name] = np.load(out)
    a, b = logits["baseline"], logits["this"]
    cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    pairs = zip(runs["baseline"]["tokens"], runs["this"]["tokens"], strict=True)
    shared = next((i for i, (x, y) in enumerate(pairs) if x != y), len(runs["this"]["tokens"]))
    report = {
        "benchmark": "cuda_ab_logits",
        "preset": args.preset,
        "flags": args.flags,
        "baseline": args.baseline,
        "providers": {k: v["provider"] for k, v in runs.items()},
        "steps": len(forced),
        "max_abs_logit_diff_per_step": [round(float(x), 5) for x in np.abs(a - b).max(-1)],
        "logit_range": round(float(np.abs(a).max()), 3),
        "cosine_min": round(float(cosine.min()), 6),
        "greedy_tokens_shared": shared,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
