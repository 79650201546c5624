"""transformers itself in fp16 and bf16 against its fp32 on the same random checkpoint: how
far a 16-bit run of the model is from fp32 before any exporter is involved (issue 19).

    python3 benchmarks/device/hf_precision.py --budget-s 300

Prints and writes ``$OUT/hf_precision.json``: per dtype, max |logit diff| and cosine per
step against fp32 teacher-forced on fp32's greedy tokens, and top-1 agreement.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import numpy as np
from stage_report import Report
from webgpu_runtimes import compare, random_checkpoint, transformers_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gemma4-e2b")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--budget-s", type=float, default=300)
    p.add_argument("--work", default="/tmp/hf_precision")
    args = p.parse_args()
    report = Report(
        Path(os.environ.get("OUT", ".")) / "hf_precision.json", args.budget_s, "hf_precision"
    )
    work = Path(args.work)
    checkpoint = random_checkpoint(report, work, args.preset, "cuda")
    if checkpoint is None:
        return
    prompt = np.random.default_rng(0).integers(4, 262144, args.prompt_len).tolist()
    ref, tokens = transformers_rows(checkpoint, prompt, args.steps)
    report.stage("float32", {"tokens": tokens})
    for dtype in ("float16", "bfloat16"):
        got, _ = transformers_rows(checkpoint, prompt, args.steps, dtype=dtype, forced=tokens)
        result = compare(got, ref)
        result["nan_or_inf"] = bool(~np.isfinite(got).all())
        report.stage(dtype, result)
        print(dtype, result["max_abs_diff"], result["min_cosine"], result["top1_agreement"])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
