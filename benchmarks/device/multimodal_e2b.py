"""Gemma 4 E2B with its vision and audio towers on WebGPU through onnxruntime-genai, in one
device call (issue 11's benchmark).

1. exports the E2B preset with random weights (``--source preset``, the default) or a
   random full-size multimodal checkpoint written from it first (``--source
   checkpoint``: ``benchmarks/random_checkpoint.py``, text + vision + audio weights,
   bf16, sharded), INT4 weights + INT4 embeddings by default, with every tower: export
   wall time, peak RSS (the kernel's, from ``wait4``) and bytes per session;
2. gives the package a tokenizer whose image / audio markers sit at E2B's ids;
3. runs ``python -m engine bench`` through onnxruntime-genai, decoder graph capture off
   and on: an image + a clip prompt, an image-only prompt, and a text-only prompt of the
   same package (128 random ids): time to first token (encoders included) and decode
   tokens/second, median of 3 after a warm-up.

Every stage is a subprocess with a timeout inside one budget; ``$OUT/multimodal_e2b.json``
is rewritten after each. ``--tiny`` runs the same stages on a tiny multimodal checkpoint
on the CPU EP (tests/benchmarks/test_multimodal_bench.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

from stage_report import Report  # noqa: E402
from webgpu_side_by_side import Child, environment, folder_bytes  # noqa: E402

FLAGS = {
    "int4": ["--weight-bits", "4", "--embedding-bits", "4"],
    "fp16": ["--dtype", "fp16"],
}
SESSIONS = ("vision", "speech", "embedding", "decoder")


def e2b_markers(preset: str) -> dict[str, int]:
    """Gemma 4's marker strings at the preset's token ids."""
    from engine.presets import preset_config

    config = preset_config(preset)
    return {
        "<|image>": config["boi_token_id"],
        "<|image|>": config["image_token_id"],
        "<image|>": config["eoi_token_id"],
        "<|audio>": config["boa_token_id"],
        "<|audio|>": config["audio_token_id"],
        "<audio|>": config["eoa_token_id"],
    }


def make_checkpoint(args: argparse.Namespace, report: Report, checkpoint: Path) -> bool:
    if args.source == "preset" and not args.tiny:
        return True
    if args.tiny:
        cmd = [sys.executable, "-c", _TINY_CHECKPOINT, str(checkpoint)]
    else:
        cmd = [sys.executable, str(REPO / "benchmarks" / "random_checkpoint.py")]
        cmd += ["--preset", args.preset, str(checkpoint)]
    built = report.stage("checkpoint", Child(cmd).json(min(400, report.remaining() - 200)))
    return bool(built.get("rc") == 0)


def add_tokenizer(args: argparse.Namespace, package: Path) -> None:
    """A tokenizer with the preset's marker ids (what genai's processor looks up)."""
    from engine.presets import preset_config
    from tests._support.tiny_gemma_mm import make_mm_tokenizer

    vocab = preset_config(args.preset)["text_config"]["vocab_size"]
    make_mm_tokenizer(package, vocab, e2b_markers(args.preset))


_TINY_CHECKPOINT = """
import sys
from pathlib import Path
from tests._support.tiny_gemma_mm import make_mm_checkpoint
make_mm_checkpoint(Path(sys.argv[1]), seed=3)
print('{"tiny": true}')
"""


def session_bytes(package: Path) -> dict[str, int]:
    """Bytes of each session's graph and data files, by genai_config section."""
    model = json.loads((package / "genai_config.json").read_text())["model"]
    out = {}
    for name in SESSIONS:
        filename = (model.get(name) or {}).get("filename")
        if filename:
            files = [package / filename, package / (filename + ".data")]
            out[name] = sum(f.stat().st_size for f in files if f.is_file())
    return out


def export(args: argparse.Namespace, report: Report, checkpoint: Path) -> Path | None:
    out = Path(args.work) / f"e2b-mm-{args.variant}"
    cmd = [sys.executable, "-m", "engine", "build"]
    if args.source == "preset" and not args.tiny:
        cmd += ["--preset", args.preset, "--random-weights"]
    else:
        cmd += ["--model", str(checkpoint)]
    cmd += ["--ep", args.ep, *FLAGS[args.variant], "--quiet", "--json", "--overwrite", str(out)]
    result = Child(cmd).json(min(args.export_timeout_s, report.remaining() - 120))
    ok = result.get("rc") == 0 and (out / "genai_config.json").is_file()
    result["ok"] = ok
    if ok and not args.tiny and not (out / "tokenizer.json").is_file():
        add_tokenizer(args, out)
    if ok:
        result["package_bytes"] = folder_bytes(out)
        result["session_bytes"] = session_bytes(out)
    report.stage("export", result)
    return out if ok else None


def bench(args: argparse.Namespace, report: Report, package: Path, name: str, extra: list) -> None:
    cmd = [sys.executable, "-m", "engine", "bench", str(package), "--json", "--quiet"]
    cmd += ["--runtime", "genai", "--graph-capture", "off" if args.ep == "cpu" else "both"]
    cmd += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
    cmd += ["--warmup", str(args.warmup), *extra]
    report.stage(f"bench_{name}", Child(cmd).json(min(args.bench_timeout_s, report.remaining())))


_FIRST_STEPS = """
import json, sys
import numpy as np
from engine.runtime.genai_runner import GenaiRunner
from engine.runtime.media import MediaPrompt
package, capture, image, clip, out = sys.argv[1:6]
runner = GenaiRunner(package, graph_capture=capture == "on")
prompt = MediaPrompt.build("Describe the picture and the sound.", (image,), (clip,))
run = runner.generate_media(prompt, 4, keep_logits=True)
np.save(out, np.stack(run.logits))
print(json.dumps({"tokens": list(run.tokens), "prompt_length": run.prompt_length}))
"""


def first_steps(args: argparse.Namespace, report: Report, package: Path, image: Path, clip: Path):
    """The image + clip prompt's first 4 steps with capture off, off again (a fresh
    process) and on: logits compared, top-2 margins, non-finite counts."""
    import numpy as np

    modes = ["off", "off", "on"] if args.ep != "cpu" else ["off", "off"]
    runs, arrays = [], []
    for i, mode in enumerate(modes):
        out = Path(args.work) / f"logits-{i}.npy"
        cmd = [sys.executable, "-c", _FIRST_STEPS, str(package), mode, str(image), str(clip)]
        result = Child([*cmd, str(out)]).json(min(90, report.remaining() - 10))
        result["capture"] = mode
        runs.append(result)
        arrays.append(np.load(out) if out.is_file() else None)
    summary: dict[str, Any] = {"runs": runs}
    if arrays[0] is not None:
        first = arrays[0][0]
        top = np.sort(first[np.isfinite(first)])[-2:]
        summary["step0_top2_margin"] = float(top[-1] - top[0]) if top.size == 2 else None
        summary["step0_nonfinite"] = int((~np.isfinite(first)).sum())
        summary["step0_abs_max"] = float(np.nanmax(np.abs(first)))
        for i, other in enumerate(arrays[1:], start=1):
            if other is not None:
                diff = np.abs(other - arrays[0][: len(other)])
                summary[f"max_abs_diff_vs_run{i}_{modes[i]}"] = [float(np.nanmax(d)) for d in diff]
    report.stage("first_steps", summary)


def media(work: Path) -> tuple[Path, Path]:
    from tests._support.media import write_png, write_wav

    return write_png(work / "image.png", 640, 480, seed=1), write_wav(work / "clip.wav", 5.0)


def summarize(stages: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    exported = stages.get("export") or {}
    out["export"] = {
        "ok": exported.get("ok"),
        "wall_s": exported.get("seconds"),
        "peak_rss_gib": exported.get("peak_rss_gib"),
        "session_bytes": exported.get("session_bytes"),
    }
    for key, value in stages.items():
        if not key.startswith("bench_"):
            continue
        result = (value or {}).get("result")
        rows = {}
        if isinstance(result, dict):
            runs = {m: result[m] for m in ("off", "on") if isinstance(result.get(m), dict)}
            for mode, run in (runs or {"off": result}).items():
                rows[f"capture_{mode}"] = {
                    "prompt_tokens": run.get("prompt_length"),
                    "ttft_s": run.get("time_to_first_token_seconds"),
                    "decode_tok_s": run.get("decode_tokens_per_second"),
                    "load_s": run.get("load_seconds"),
                    "peak_rss_gib": round((run.get("peak_rss_bytes") or 0) / 1024**3, 2),
                }
        out[key[len("bench_") :]] = rows or (value or {}).get("stderr_tail")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny checkpoint on the CPU EP")
    parser.add_argument("--budget-s", type=float, default=560)
    parser.add_argument("--work", default="/tmp/multimodal-e2b")
    parser.add_argument("--preset", default="gemma4-e2b")
    parser.add_argument("--source", choices=("preset", "checkpoint"), default="preset")
    parser.add_argument("--variant", choices=sorted(FLAGS), default="int4")
    parser.add_argument("--ep", default=None, help="default: webgpu (cpu with --tiny)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--export-timeout-s", type=float, default=240)
    parser.add_argument("--bench-timeout-s", type=float, default=150)
    parser.add_argument(
        "--first-steps", action="store_true", help="compare the first steps' logits too"
    )
    parser.add_argument("--skip-bench", action="store_true", help="only the first steps")
    args = parser.parse_args()
    args.ep = args.ep or ("cpu" if args.tiny else "webgpu")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(os.environ.get("OUT") or work)
    report = Report(out / "multimodal_e2b.json", args.budget_s, "multimodal_e2b")
    report.data["settings"] = dict(vars(args))
    report.stage("environment", environment(args))
    checkpoint = work / "checkpoint"
    package = (
        export(args, report, checkpoint) if make_checkpoint(args, report, checkpoint) else None
    )
    shutil.rmtree(checkpoint, ignore_errors=True)
    if package is not None:
        image, clip = media(work)
        prompt = "<|image|><|audio|>Describe the picture and the sound."
        prompts = {
            "image_audio": ["--image", str(image), "--audio", str(clip), "--prompt", prompt],
            "image": ["--image", str(image), "--prompt", "<|image|>What is this?"],
            "text": ["--prompt-len", "128"],
        }
        for name, extra in prompts.items() if not args.skip_bench else ():
            bench(args, report, package, name, extra)
        if args.first_steps:
            first_steps(args, report, package, image, clip)
        shutil.rmtree(package, ignore_errors=True)
    report.data["summary"] = summarize(report.data["stages"])
    report.data["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    report.save()
    print(json.dumps(report.data["summary"], indent=1))


if __name__ == "__main__":
    main()
