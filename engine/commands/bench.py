"""``bench``: load time, time to first token, prefill and decode tokens/s of a package."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.commands._args import count, print_json, progress_bar
from engine.errors import CancelledError, OptionsError, option, render_message


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmark a package (tokens/s, TTFT, capture on/off)")
    parser.add_argument("package", metavar="PACKAGE", help="package folder")
    parser.add_argument(
        "--runtime",
        choices=("ort", "genai"),
        default=None,
        help="our onnxruntime loop (ort) or onnxruntime-genai (default: ort; genai for "
        "multimodal packages and prompts with media)",
    )
    parser.add_argument("--ep", default=None, help="execution provider (default: the package's)")
    parser.add_argument(
        "--prompt-len",
        type=count,
        default=None,
        help="prompt tokens (default 128, less if the package is shorter)",
    )
    parser.add_argument(
        "--new-tokens",
        type=count,
        default=None,
        help="tokens to generate (default 64, less if the package is shorter)",
    )
    parser.add_argument("--repeats", type=count, default=3, help="timed runs (default 3)")
    parser.add_argument("--warmup", type=count, default=1, help="untimed runs first (default 1)")
    parser.add_argument(
        "--graph-capture",
        choices=("auto", "on", "off", "both"),
        default="auto",
        help="both = off and on side by side; auto = both where the EP can capture, else off",
    )
    parser.add_argument(
        "--kv-mode",
        choices=("auto", "shared", "growing"),
        default="auto",
        help="ort runtime: shared preallocated KV buffer or growing KV",
    )
    parser.add_argument("--threads", type=count, default=None, help="intra-op threads")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image for a multimodal package (repeatable; runs through genai)",
    )
    parser.add_argument(
        "--audio",
        action="append",
        default=[],
        metavar="PATH",
        help="an audio clip (WAV) for a multimodal package (runs through genai)",
    )
    parser.add_argument(
        "--prompt",
        default=None,
        metavar="TEXT",
        help="prompt text with the media (markers <|image|> / <|audio|> are added if missing)",
    )
    parser.add_argument("--seed", type=count, default=0, help="seed of the random prompt")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.runtime.bench import (
        DEFAULT_NEW_TOKENS,
        DEFAULT_PROMPT_LENGTH,
        BenchConfig,
        compare_capture,
        fit_lengths,
        run_bench,
        slow_bench,
        validate_capture,
    )
    from engine.runtime.media import MediaPrompt
    from engine.runtime.package import open_package

    if args.prompt is not None and not (args.image or args.audio):
        raise OptionsError(
            f"{option('prompt')} is the text of a prompt with media ({option('image', 'PATH')} "
            f"/ {option('audio', 'PATH')}); a text benchmark times {option('prompt_len', 'N')} "
            "seeded random tokens: leave it out"
        )
    package = open_package(args.package)
    media = None
    if args.image or args.audio:
        media = MediaPrompt.build(args.prompt, tuple(args.image), tuple(args.audio))
        media.check(package)
        prompt_length = args.prompt_len or DEFAULT_PROMPT_LENGTH  # the media prompt's own
        new_tokens = args.new_tokens or DEFAULT_NEW_TOKENS
    else:
        prompt_length, new_tokens = fit_lengths(package, args.prompt_len, args.new_tokens)
    config = BenchConfig(
        runtime=args.runtime or ("genai" if media or package.multimodal else "ort"),
        media=media,
        ep=args.ep,
        prompt_length=prompt_length,
        new_tokens=new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        kv_mode=args.kv_mode,
        seed=args.seed,
        threads=args.threads,
    )
    if config.runtime == "genai" and args.kv_mode != "auto":
        # (a multimodal package or a prompt with media runs through genai only)
        ort_too = not (media or package.multimodal)
        raise OptionsError(
            f"{option('kv_mode', args.kv_mode)} is our runner's ({option('runtime', 'ort')}); "
            "onnxruntime-genai keeps the KV cache as the package's genai_config says "
            "(search.past_present_share_buffer): leave it out"
            + (f", or add {option('runtime', 'ort')}" if ort_too else "")
        )
    cancel = getattr(args, "cancel", None)
    mode = args.graph_capture
    if mode == "auto":
        mode = "both" if _can_capture(package, args.ep) else "off"
    elif mode in ("on", "both") and (obstacle := package.capture_obstacle(args.ep)):
        # Refused before anything runs (``both`` would time the capture-off run first).
        off = f"use {option('graph_capture', 'off')}"
        fix = f"{obstacle.rebuild}, or {off}" if obstacle.rebuild else off
        raise OptionsError(f"{option('graph_capture', mode)}: {obstacle.why}; {fix}")
    # (a prompt with media is genai's processor's: its length is not known here)
    keep = args.graph_capture in ("on", "both")  # asked for: a quick look keeps it
    warning = slow_bench(package, config, mode, keep_capture=keep) if not media else None
    if warning is not None:  # before minutes of a software adapter: what a quick look takes
        print(f"note: {render_message(str(warning))}", file=sys.stderr, flush=True)
    with progress_bar(args.quiet or args.json) as progress:
        try:
            cancelled = False
            if mode == "both":
                comparison = compare_capture(
                    package,
                    config,
                    progress=progress,
                    cancel=cancel,
                    isolated=True,
                    keep_on_cancel=True,  # the capture-off row is printed before the cancel
                )
                data = comparison.to_json()
                results = [comparison.off] + ([comparison.on] if comparison.on else [])
                check = comparison.agreement
                error, cancelled = comparison.error, comparison.cancelled
            else:
                result, first = run_bench(
                    package,
                    config,
                    graph_capture=mode == "on",
                    keep_logits=mode == "on",
                    progress=progress,
                    cancel=cancel,
                    isolated=True,
                )
                check, error = None, None
                if mode == "on":
                    try:
                        check = validate_capture(
                            package, config, first, cancel=cancel, isolated=True
                        )
                    except (CancelledError, KeyboardInterrupt):
                        # the timed run is done: print it, then stop as cancelled
                        error, cancelled = "cancelled", True
                data = result.to_json()
                data["capture_check"] = check.to_json() if check else None
                data["cancelled"] = cancelled
                results = [result]
        except KeyboardInterrupt:
            raise CancelledError("interrupted") from None
    if args.json:
        print_json(data)
    else:
        _print_table(results, check, error)
    if cancelled:
        raise CancelledError("interrupted")
    if error is not None and args.graph_capture != "auto":
        return 1  # a capture run the user asked for did not happen
    return 1 if check is not None and not check.same_tokens else 0


def _can_capture(package: Any, ep: str | None) -> bool:
    """``auto``: capture where the package was built for it on this EP."""
    return package.capture_problem(ep) is None


def _print_table(results: list[Any], check: Any, error: str | None) -> None:
    first = results[0]
    print(f"package  {first.package}")
    # onnxruntime-genai reports no placement: its provider is the one asked for.
    ran = f"asked for {first.provider}" if first.runtime == "genai" else f"ran on {first.provider}"
    print(
        f"runtime  {first.runtime}   EP {first.ep}   {ran}   "
        f"KV {first.kv_mode}   prompt {first.prompt_length}   new tokens {first.new_tokens}"
    )
    header = f"{'capture':<8} {'load s':>7} {'TTFT ms':>8} {'prefill tok/s':>14} "
    print(header + f"{'decode tok/s (min-max)':>26} {'peak RSS':>10}")
    for r in results:
        spread = f"{r.decode_tokens_per_second_min:.1f}-{r.decode_tokens_per_second_max:.1f}"
        print(
            f"{'on' if r.graph_capture else 'off':<8} {r.load_seconds:>7.2f} "
            f"{r.time_to_first_token_seconds * 1e3:>8.1f} {r.prefill_tokens_per_second:>14.1f} "
            f"{r.decode_tokens_per_second:>12.1f} ({spread:>11}) "
            f"{r.peak_rss_bytes / 2**20:>7.0f} MiB"
        )
        for note in r.notes:
            print(f"  note: {note}")
    if len(results) == 2 and results[0].decode_tokens_per_second:
        ratio = results[1].decode_tokens_per_second / results[0].decode_tokens_per_second
        print(f"capture speed-up: {ratio:.2f}x decode")
    if check is not None:
        verdict = (
            "same tokens" if check.same_tokens else f"DIFFERENT from step {check.first_difference}"
        )
        diff = (
            ""
            if check.max_abs_logit_diff is None
            else f", max logit diff {check.max_abs_logit_diff:.3g}"
        )
        # With capture on alone, the run without it is the untimed check's own.
        against = "no capture" if len(results) > 1 else "an untimed run without it"
        print(f"capture vs {against}: {verdict}{diff}")
    if error:
        what = (
            "check against a run without capture"
            if len(results) == 1 and first.graph_capture
            else "run"
        )
        print(f"capture {what} not done: {error}")
