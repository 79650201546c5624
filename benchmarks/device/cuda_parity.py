"""Our CUDA packages against transformers on the GPU (issue 19), one call.

A random full-size checkpoint of the preset (``side_by_side_stages.py checkpoint``,
transformers' initialisation, bf16); transformers in fp32 on the GPU (eager attention, TF32
off) gives greedy tokens after a seeded random prompt and the last logits row per step;
then our ``--ep cuda`` packages (``--dtypes``, default fp32 and fp16) run in our runner on the
CUDA EP (onnxruntime-gpu in ``--cuda-site``), CUDA graph off and on, (a) teacher-forced on
transformers' tokens — max |logit diff| and cosine per step, top-1 agreement — and (b) free
running, greedy — how many of transformers' tokens it reproduces before the first
difference. ``$OUT/cuda_parity.json``, rewritten after each stage.

    python3 benchmarks/device/cuda_parity.py --cuda-site /tmp/site_cuda --budget-s 540

At toy size on the CPU EP here: ``--preset gemma4-tiny --device cpu --ep cpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from families_gpu import cuda_env
from stage_report import Report
from webgpu_runtimes import (
    child,
    compare,
    export_text,
    random_checkpoint,
    reference,
    stdout_json,
)

RUN = """
import json, sys
import numpy as np
from engine.runtime.runner import Runner, RunnerOptions
package, ep, capture, prompt, tokens, out = sys.argv[1:7]
prompt, tokens = json.loads(prompt), json.loads(tokens)
if capture == "notf32":  # the CUDA EP's TF32 matmuls off (its use_tf32 option defaults to 1)
    from pathlib import Path
    path = Path(package) / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    entries = options.setdefault("provider_options", [])
    entries[:] = [e for e in entries if "cuda" not in e] + [{"cuda": {"use_tf32": "0"}}]
    path.write_text(json.dumps(config, indent=2))
    capture = "off"
runner = Runner(package, RunnerOptions(ep=ep, graph_capture=capture == "on"))
forced = runner.generate(prompt, len(tokens), forced=tokens, keep_logits=True)
free = runner.generate(prompt, len(tokens))
np.save(out, np.stack(forced.logits))
same = next((i for i, (a, b) in enumerate(zip(free.tokens, tokens)) if a != b), len(tokens))
print(json.dumps({"provider": runner.provider, "free_tokens_equal": same,
                  "free_steps": len(tokens), "decode_tok_s": free.decode_tokens_per_second}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuda-site", default="/tmp/site_cuda")
    p.add_argument("--preset", default="gemma4-e2b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--ep", default="cuda")
    p.add_argument("--dtypes", default="fp32,fp16")
    p.add_argument(
        "--modes",
        default="cuda:off,cuda:on",
        help="EP:CAPTURE runs per package (CAPTURE off, on, or notf32: CUDA's TF32 off)",
    )
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=540)
    p.add_argument("--work", default="/tmp/cuda_parity")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    path = Path(args.json_out or Path(os.environ.get("OUT", ".")) / "cuda_parity.json")
    report = Report(path, args.budget_s, "cuda_parity")
    work = Path(args.work)
    checkpoint = random_checkpoint(report, work, args.preset, args.device)
    if checkpoint is None:
        return
    packages: dict[str, Path] = {}
    for dtype in args.dtypes.split(","):
        package = work / dtype
        built = export_text(checkpoint, package, args.ep, dtype, min(400, report.remaining()))
        report.stage(f"export_{dtype}", built)
        if built.get("rc") == 0:
            packages[dtype] = package
    try:
        ref = reference(args, checkpoint, work / "reference.npy")
    except Exception as exc:  # nothing to compare against
        report.stage("transformers", {"error": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    report.stage("transformers", ref)
    ref_rows = np.load(work / "reference.npy")
    shutil.rmtree(checkpoint, ignore_errors=True)
    env = cuda_env(args.cuda_site)
    for dtype, package in packages.items():
        for mode in args.modes.split(","):
            ep, _, capture = mode.partition(":")
            saved = work / f"{dtype}-{ep}-{capture}.npy"
            stage = child(
                [
                    sys.executable,
                    "-c",
                    RUN,
                    str(package),
                    ep,
                    capture,
                    json.dumps(ref["prompt"]),
                    json.dumps(ref["tokens"]),
                    str(saved),
                ],
                min(300, report.remaining()),
                env,
                stdout=True,
            )
            printed = stdout_json(stage)
            if saved.exists():
                stage["vs_transformers"] = compare(np.load(saved), ref_rows)
            stage.update(printed or {})
            report.stage(f"{dtype}_{ep}_{capture}", stage)
        shutil.rmtree(package, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
