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
import sys
from pathlib import Path

import numpy as np
from stage_report import Report
from webgpu_runtimes import HERE, child, compare


def rows(checkpoint: Path, dtype: str, prompt: list[int], tokens: list[int] | None, steps: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    model = (
        AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=getattr(torch, dtype), attn_implementation="eager"
        )
        .to("cuda")
        .eval()
    )
    out, chosen = [], []
    with torch.no_grad():
        result = model(torch.tensor([prompt], device="cuda"), use_cache=True)
        for i in range(steps + 1):
            row = result.logits[0, -1].float()
            out.append(row.cpu().numpy())
            chosen.append(int(row.argmax()))
            if i == steps:
                break
            feed = tokens[i] if tokens is not None else chosen[-1]
            result = model(
                torch.tensor([[feed]], device="cuda"),
                past_key_values=result.past_key_values,
                use_cache=True,
            )
    del model
    torch.cuda.empty_cache()
    return np.stack(out), chosen


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
    shutil.rmtree(work, ignore_errors=True)
    checkpoint = work / "checkpoint"
    made = child(
        [
            sys.executable,
            str(HERE / "side_by_side_stages.py"),
            "checkpoint",
            str(checkpoint),
            "--preset",
            args.preset,
        ],
        min(300, report.remaining()),
    )
    report.stage("checkpoint", made)
    prompt = np.random.default_rng(0).integers(4, 262144, args.prompt_len).tolist()
    ref, tokens = rows(checkpoint, "float32", prompt, None, args.steps)
    report.stage("float32", {"tokens": tokens})
    for dtype in ("float16", "bfloat16"):
        got, _ = rows(checkpoint, dtype, prompt, tokens, args.steps)
        result = compare(got, ref)
        result["nan_or_inf"] = bool(~np.isfinite(got).all())
        report.stage(dtype, result)
        print(dtype, result["max_abs_diff"], result["min_cosine"], result["top1_agreement"])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
