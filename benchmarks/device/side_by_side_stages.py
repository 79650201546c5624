"""The stages of ``webgpu_side_by_side.py`` that run in their own process.

    python side_by_side_stages.py checkpoint --preset gemma4-e2b --device cuda OUT_DIR
    python side_by_side_stages.py genai PACKAGE --ep webgpu|cuda|cpu --lengths default,192 ...
    python side_by_side_stages.py profile PACKAGE --ep webgpu --steps 16 ...

``checkpoint`` builds a random full-size checkpoint with transformers (run it with the
peer's transformers first on PYTHONPATH, so both exporters read a config they know);
``genai`` times any genai package (ours or the peer's) through onnxruntime-genai alone,
with graph capture off and on (the EP's own switch) and at several ``search.max_length``,
and the GPU memory it held; ``profile`` records an
onnxruntime profile of decode steps of one of our packages and sums the time of each op.
Each prints its report so far as one JSON line after every setting: the last line that
parses is the result, so a setting that kills the process loses only itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------------------- checkpoint


def checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """A random Gemma4ForCausalLM of the preset's architecture, saved with save_pretrained:
    transformers' initialisation, 1-D weights (norms, scalars) + 0.1 x randn."""
    import torch
    import transformers
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    started = time.perf_counter()
    preset = json.loads((REPO / "resources" / "presets" / f"{args.preset}.json").read_text())
    # A multimodal preset (E2B, E4B) keeps the decoder's fields under text_config: the
    # side by side compares text decoders (what both exporters take from a CausalLM).
    text = preset.get("text_config") or preset
    skip = ("architectures", "model_type")
    fields = {k: v for k, v in text.items() if not k.startswith("_") and k not in skip}
    dtype = getattr(torch, args.dtype)
    fields["dtype"] = args.dtype
    torch.manual_seed(args.seed)
    config = Gemma4TextConfig(**fields)
    with torch.device(args.device):
        model = Gemma4ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(0.1 * torch.randn_like(param))
    built = time.perf_counter() - started
    out = Path(args.out)
    model.cpu().save_pretrained(out, max_shard_size="4GB")
    try:
        _tokenizer(out, config.vocab_size)
        tokenizer = "written"
    except Exception as exc:  # exporters may do without one; say why there is none
        tokenizer = f"not written: {exc!r}"
    return {
        "tokenizer": tokenizer,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(built, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "bytes": sum(f.stat().st_size for f in out.iterdir()),
        "files": sorted(f.name for f in out.iterdir()),
    }


def _tokenizer(path: Path, vocab_size: int) -> None:
    """A small byte-fallback tokenizer: exporters copy tokenizer files, generation here
    feeds token ids."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = len(vocab)
    assert len(vocab) <= vocab_size
    GemmaTokenizer(vocab=vocab, merges=[]).save_pretrained(path)


# ---------------------------------------------------------------------------- genai


def _snapshot(report: dict[str, Any]) -> None:
    """Print the report so far as one JSON line: the caller keeps the last line it can
    parse, so a setting that kills the process loses only itself."""
    print(json.dumps(report), flush=True)


def _provider_options(config: dict[str, Any], provider: str) -> dict[str, str]:
    """The decoder's own provider options for ``provider`` in genai_config.json."""
    decoder = config.get("model", {}).get("decoder", {})
    out: dict[str, str] = {}
    for entry in decoder.get("session_options", {}).get("provider_options", []):
        for name, options in entry.items():
            if name.lower() == provider.lower():
                out.update({k: str(v) for k, v in options.items()})
    return out


def genai(args: argparse.Namespace) -> dict[str, Any]:
    """Decode tok/s through onnxruntime-genai per capture mode and search.max_length."""
    import onnxruntime_genai as og

    from engine.caps import get_caps
    from engine.runtime.bench import bench_prompt
    from engine.runtime.generation import Generation
    from engine.runtime.plugins import register_genai

    # The WebGPU plugin EP registers its library with genai (onnxruntime-webgpu 1.27 has
    # the provider built in: nothing to register).
    plugin = args.ep == "webgpu" and register_genai("WebGpuExecutionProvider")
    package = Path(args.package)
    config_json = json.loads((package / "genai_config.json").read_text())
    search = config_json.get("search", {})
    default_length = int(search.get("max_length") or config_json["model"]["context_length"])
    prompt = bench_prompt(int(config_json["model"]["vocab_size"]), args.prompt_len)
    caps = get_caps(args.ep)
    provider, capture_option = caps.genai_provider, caps.capture_option
    report: dict[str, Any] = {
        "package": str(package),
        "onnxruntime_genai": getattr(og, "__version__", None),
        "webgpu_plugin": plugin,
        "default_max_length": default_length,
        "past_present_share_buffer": search.get("past_present_share_buffer"),
        "package_provider_options": _provider_options(config_json, provider) if provider else None,
        "captures": {},
        "gpu_memory_mib": {},
    }
    reference: list[int] | None = None
    for capture in args.captures.split(","):
        entry: dict[str, Any] = {}
        report["captures"][capture] = entry
        _snapshot(report)  # a crash in this setting keeps the ones before it
        if capture == "on" and (provider is None or capture_option is None):
            entry["skipped"] = f"the {args.ep} EP has no graph capture"
            continue
        held_before = device_memory_mib()
        config = og.Config(str(package))
        config.clear_providers()
        if provider is not None:
            config.append_provider(provider)
            for key, value in _provider_options(config_json, provider).items():
                if key != capture_option:
                    config.set_provider_option(provider, key, value)
            if capture_option is not None:
                config.set_provider_option(
                    provider, capture_option, "1" if capture == "on" else "0"
                )
        started = time.perf_counter()
        try:
            model = og.Model(config)
        except Exception as exc:  # genai raises RuntimeError for everything
            entry["error"] = f"load: {exc}"
            continue
        entry["load_seconds"] = round(time.perf_counter() - started, 2)
        for label in args.lengths.split(","):
            length = default_length if label == "default" else int(label)
            row: dict[str, Any] = {"max_length": length}
            entry[label] = row
            try:
                runs = [
                    _genai_run(og, model, prompt, args.new_tokens, length, Generation)
                    for _ in range(args.warmup + args.repeats)
                ]
            except Exception as exc:
                row["error"] = str(exc)
                continue
            timed = runs[args.warmup :]
            rates = [g.decode_tokens_per_second for g in timed]
            row["decode_tokens_per_second"] = round(statistics.median(rates), 2)
            row["decode_tokens_per_second_all"] = [round(r, 2) for r in rates]
            row["prefill_tokens_per_second"] = round(
                statistics.median(g.prefill_tokens_per_second for g in timed), 1
            )
            row["ttft_ms"] = round(
                1000 * statistics.median(g.first_token_seconds for g in timed), 1
            )
            tokens = list(timed[0].tokens)
            row["tokens"] = tokens
            row["repeats_agree"] = all(list(g.tokens) == tokens for g in runs)
            if reference is None:
                reference = tokens
            else:
                same = [a == b for a, b in zip(tokens, reference, strict=False)]
                row["same_tokens_as_first_setting"] = all(same)
                row["first_difference"] = same.index(False) if False in same else None
            _snapshot(report)
        used = device_memory_mib()
        if used is not None and held_before is not None:  # what this setting added
            report["gpu_memory_mib"][capture] = used - held_before
        del model
        gc.collect()
    return report


def device_memory_mib() -> int | None:
    """GPU memory in use on the device (nvidia-smi; None without one). Read before a model
    is loaded and after its runs, the difference is what the setting held: onnxruntime's
    arenas keep what they grew to, so that is their peak (nvidia-smi in a container often
    cannot see a process's own use)."""
    import subprocess

    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = done.stdout.splitlines()[0].strip() if done.stdout.strip() else ""
    return int(first) if done.returncode == 0 and first.isdigit() else None


def _genai_run(
    og: Any, model: Any, prompt: list[int], new_tokens: int, length: int, gen: Any
) -> Any:
    """One greedy generation timed like GenaiRunner (engine.runtime.genai_runner)."""
    import numpy as np

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    generator = og.Generator(model, params)
    started = time.perf_counter()
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    prefill = time.perf_counter() - started
    tokens: list[int] = []
    steps: list[float] = []
    first = 0.0
    for i in range(new_tokens):
        step = time.perf_counter()
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
        elapsed = time.perf_counter() - step
        if i == 0:
            first = prefill + elapsed
        else:
            steps.append(elapsed)
    return gen(
        prompt_length=len(prompt),
        tokens=tuple(tokens),
        argmax=(),
        logits=(),
        prefill_seconds=prefill,
        first_token_seconds=first,
        step_seconds=tuple(steps),
        stopped_at_eos=False,
    )


# ---------------------------------------------------------------------------- profile


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Profile ``--steps`` decode steps (capture off) per KV buffer length and sum each
    op's time per step.

    Our runner profiles only its first run (to read node placement); here profiling stays
    on through the decode steps. On WebGPU, onnxruntime records GPU timestamps per kernel
    (events ``node&op&program``) when the adapter offers timestamp queries; CPU-side node
    events (dispatch time on WebGPU, compute time on the CPU EP) are summed as well.
    """
    from engine.runtime import runner as runner_module
    from engine.runtime.bench import bench_prompt
    from engine.runtime.runner import Runner, RunnerOptions
    from engine.runtime.session import Placement

    runner_module.read_placement = lambda handle: Placement(requested=handle.provider)
    report: dict[str, Any] = {"package": args.package, "decode_steps": args.steps, "lengths": {}}
    for label in args.lengths.split(","):
        started = time.perf_counter()
        max_length = None if label == "default" else int(label)
        options = RunnerOptions(ep=args.ep, graph_capture=False, max_length=max_length)
        runner = Runner(args.package, options)
        load = time.perf_counter() - started
        prompt = bench_prompt(runner.package.vocab_size, args.prompt_len)
        generation = runner.generate(prompt, 1 + args.steps)
        profile_file = Path(runner.handle.session.end_profiling())
        events = json.loads(profile_file.read_text())
        profile_file.unlink(missing_ok=True)
        report["provider"] = runner.handle.provider
        report["lengths"][label] = {
            "kv_mode": runner.kv_mode,
            "max_length": runner.max_length,
            "load_seconds": round(load, 2),
            "step_ms_profiled": round(1000 * statistics.median(generation.step_seconds), 3),
            "gpu": summarize_steps(events, gpu=True, top=args.top),
            "host": summarize_steps(events, gpu=False, top=args.top),
        }
        _snapshot(report)
        del runner
        gc.collect()
    return report


def _kernel_events(events: list[dict[str, Any]], gpu: bool) -> list[tuple[str, str, float]]:
    """(node, op type, microseconds) of each kernel in run order."""
    out = []
    for e in events:
        name = str(e.get("name", ""))
        if gpu and e.get("cat") == "Api" and name.count("&") >= 2:
            node, op, program = name.split("&", 2)
            out.append((f"{node}&{program}", op, float(e.get("dur", 0))))
        elif not gpu and e.get("cat") == "Node" and name.endswith("_kernel_time"):
            op = str(e.get("args", {}).get("op_name", "?"))
            provider = str(e.get("args", {}).get("provider", ""))
            out.append((f"{name[: -len('_kernel_time')]}@{provider}", op, float(e.get("dur", 0))))
    return out


def _period(names: list[str], repeats: int = 3) -> int | None:
    """The length of the repeating tail: the decode steps are identical runs."""
    for k in range(1, len(names) // repeats + 1):
        tail = names[-k:]
        if all(names[-(i + 1) * k : len(names) - i * k] == tail for i in range(1, repeats)):
            return k
    return None


def summarize_steps(events: list[dict[str, Any]], *, gpu: bool, top: int) -> dict[str, Any]:
    """Per decode step: total time, and the ops, programs and nodes that take it."""
    kernels = _kernel_events(events, gpu)
    if not kernels:
        return {"available": False, "kernel_events": 0}
    names = [k[0] for k in kernels]
    k = _period(names)
    if k is None:
        return {"available": False, "kernel_events": len(kernels), "reason": "no repeating step"}
    steps = 1
    while (steps + 1) * k <= len(names) and names[-(steps + 1) * k : -steps * k] == names[-k:]:
        steps += 1
    window = kernels[-steps * k :]
    per_index = [statistics.median(window[s * k + i][2] for s in range(steps)) for i in range(k)]
    by_op: dict[str, list[float]] = defaultdict(list)
    by_node: dict[str, float] = {}
    for (node, op, _), us in zip(kernels[-k:], per_index, strict=True):
        by_op[op].append(us)
        by_node[node] = by_node.get(node, 0.0) + us
    total = sum(per_index)
    ops = sorted(
        (
            {
                "op": op,
                "us_per_step": round(sum(v), 1),
                "share": round(sum(v) / total, 4) if total else 0.0,
                "kernels_per_step": len(v),
                "us_per_kernel": round(sum(v) / len(v), 2),
            }
            for op, v in by_op.items()
        ),
        key=lambda r: -float(r["us_per_step"]),  # type: ignore[arg-type]
    )
    nodes = sorted(by_node.items(), key=lambda kv: -kv[1])[:top]
    providers: dict[str, int] = defaultdict(int)
    for node, _, _ in kernels[-k:]:
        providers[node.rsplit("@", 1)[-1] if "@" in node else "gpu"] += 1
    return {
        "available": True,
        "kind": "gpu timestamps per kernel" if gpu else "host time per node",
        "kernels_per_step": k,
        "steps_matched": steps,
        "us_per_step": round(total, 1),
        "kernels_by_provider": dict(providers),
        "top_ops": ops[:top],
        "top_nodes": [{"node": n, "us_per_step": round(us, 1)} for n, us in nodes],
    }


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    ck = sub.add_parser("checkpoint")
    ck.add_argument("out")
    ck.add_argument("--preset", default="gemma4-e2b")
    ck.add_argument("--device", default="cuda")
    ck.add_argument("--dtype", default="bfloat16")
    ck.add_argument("--seed", type=int, default=0)
    for name in ("genai", "profile"):
        p = sub.add_parser(name)
        p.add_argument("package")
        p.add_argument("--ep", default="webgpu")
        p.add_argument("--prompt-len", type=int, default=128)
    ge = sub.choices["genai"]
    ge.add_argument("--new-tokens", type=int, default=64)
    ge.add_argument("--repeats", type=int, default=3)
    ge.add_argument("--warmup", type=int, default=1)
    ge.add_argument("--lengths", default="default,192")
    ge.add_argument("--captures", default="off,on")
    pr = sub.choices["profile"]
    pr.add_argument("--steps", type=int, default=16)
    pr.add_argument("--lengths", default="default,192")
    pr.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    result = {"checkpoint": checkpoint, "genai": genai, "profile": profile}[args.stage](args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
