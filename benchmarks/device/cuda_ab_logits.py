"""Do two engines build CUDA packages that compute the same thing on the CUDA EP? One call.

Builds the preset (random weights, ``--ep cuda``, text) with the engine in ``--baseline``
(another commit's ``engine/`` and ``resources/``) and with this checkout's, same flags, then
runs both through our runner on the CUDA EP (onnxruntime-gpu from ``--cuda-site``) with CUDA
graphs on: greedy tokens of the baseline package, then both packages teacher-forced on them.
Prints one JSON object: per step the max |logit difference| and the cosine between the two
packages' logits, and how many greedy tokens they share; then both packages on a batch of
two prompts (the short one right-padded, presents bound to the pasts' buffers as genai binds
them, raw onnxruntime), each row's logits per step compared. For graph changes that must not
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


# Two prompts in one batch (the short one right-padded, as genai pads), presents bound to the
# pasts' buffers; each row's last logits per step, each row's own greedy tokens.
BATCH = """
import json, sys
import numpy as np
import onnxruntime as ort
package, prompt, steps, ep = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
device = "cuda" if ep == "cuda" else "cpu"
provider = "CUDAExecutionProvider" if ep == "cuda" else "CPUExecutionProvider"
session = ort.InferenceSession(package + "/model.onnx", providers=[provider])
length = json.load(open(package + "/genai_config.json"))["search"]["max_length"]
names = [o.name for o in session.get_outputs()]
dtype = {"tensor(float16)": np.float16, "tensor(float)": np.float32}[session.get_inputs()[2].type]
past = {
    i.name: ort.OrtValue.ortvalue_from_numpy(
        np.zeros((2, i.shape[1], length, i.shape[3]), dtype), device, 0)
    for i in session.get_inputs() if i.name.startswith("past")
}
short = prompt[: len(prompt) // 3]
ids = np.array([prompt, short + [0] * (len(prompt) - len(short))], np.int64)
mask = np.ones(ids.shape, np.int64)
mask[1, len(short):] = 0
rows = []
for step in range(steps):
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", ids)
    binding.bind_cpu_input("attention_mask", mask)
    for name, value in past.items():
        binding.bind_ortvalue_input(name, value)
    for name in names:  # presents written into the pasts' buffers, as genai binds them
        if name.startswith("present"):
            binding.bind_ortvalue_output(name, past[name.replace("present", "past_key_values")])
        else:
            binding.bind_output(name, device)
    session.run_with_iobinding(binding)
    logits = binding.get_outputs()[names.index("logits")].numpy().astype(np.float32)
    last = [logits[0, -1], logits[1, len(short) - 1 if step == 0 else -1]]
    rows.append(np.stack(last))
    ids = np.array([[int(np.argmax(row))] for row in last], np.int64)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
np.save(sys.argv[5], np.stack(rows))
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
    parser.add_argument(
        "--batch-steps",
        type=int,
        default=8,
        help="steps of the right-padded batch of two (raw onnxruntime, fp16 / fp32 caches "
        "only: left out for bf16 packages); 0 leaves it out",
    )
    args = parser.parse_args()
    if "bf16" in args.flags:  # numpy caches cannot be bf16: the batch check cannot drive them
        args.batch_steps = 0
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
    batch = {}
    for name in ("baseline", "this") if args.batch_steps > 0 else ():
        out = work / f"{name}-batch.npy"
        cmd = [sys.executable, "-c", BATCH, str(packages[name]), json.dumps(prompt)]
        _child([*cmd, str(min(args.steps, args.batch_steps)), args.ep, str(out)], env)
        batch[name] = np.load(out)
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
    if batch:
        batch_diff = np.abs(batch["baseline"] - batch["this"]).max(-1)  # [steps, 2]
        report["batch_of_two_max_abs_logit_diff_per_step"] = [
            [round(float(x), 5) for x in row] for row in batch_diff
        ]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
