"""``verify``: compare a package with transformers on its source checkpoint."""

from __future__ import annotations

import argparse

from engine.commands._args import count, print_json, progress_bar
from engine.errors import CancelledError

TEXT_TOKENS = 128
"""engine.runtime.quality.DEFAULT_TOKENS, without importing numpy to build the parser."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "verify", help="compare a package with transformers (logits per step, greedy tokens)"
    )
    parser.add_argument("package", metavar="PACKAGE", help="package folder")
    parser.add_argument(
        "--model",
        metavar="DIR",
        required=True,
        help="the Hugging Face checkpoint the package was exported from",
    )
    parser.add_argument(
        "--steps",
        type=count,
        default=16,
        help="generated positions (default 16; prompt + steps must fit the package)",
    )
    parser.add_argument("--prompt-len", type=count, default=12, help="random prompt length")
    parser.add_argument("--seed", type=count, default=0, help="seed of the random prompt")
    parser.add_argument(
        "--ep",
        default="cpu",
        help="EP to run the package on (default cpu, whatever EP the package was built for)",
    )
    parser.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="an image (repeatable)"
    )
    parser.add_argument("--audio", action="append", default=[], metavar="PATH", help="a WAV clip")
    parser.add_argument("--prompt", default=None, metavar="TEXT", help="prompt text with media")
    parser.add_argument(
        "--text",
        default=None,
        metavar="FILE",
        help="UTF-8 text to measure quality on: KL divergence, top-1 agreement and perplexity "
        "against transformers (default: a built-in sample)",
    )
    parser.add_argument(
        "--text-tokens",
        type=count,
        default=TEXT_TOKENS,
        metavar="N",
        help=f"positions of the text to score (default {TEXT_TOKENS}; 0: no quality run)",
    )
    parser.add_argument(
        "--max-kld",
        type=float,
        default=None,
        metavar="NATS",
        help="fail when the mean KL divergence on the text is above this",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.runtime.media import MediaPrompt
    from engine.runtime.verify import verify
    from engine.runtime.verify_media import verify_media

    with progress_bar(args.quiet or args.json) as progress:
        try:
            if args.image or args.audio:
                media = MediaPrompt.build(args.prompt, tuple(args.image), tuple(args.audio))
                result = verify_media(
                    args.package, args.model, media, steps=args.steps, ep=args.ep, progress=progress
                )
            else:
                result = verify(
                    args.package,
                    args.model,
                    steps=args.steps,
                    prompt_length=args.prompt_len,
                    seed=args.seed,
                    ep=args.ep,
                    text=args.text,
                    quality_tokens=args.text_tokens,
                    max_kld=args.max_kld,
                    progress=progress,
                    cancel=getattr(args, "cancel", None),
                )
        except KeyboardInterrupt:
            raise CancelledError("interrupted") from None
    if args.json:
        print_json(result.to_json())
        return 0 if result.passed else 1
    kind = "quantized" if result.quantized else (result.dtype or "float")
    print(f"package  {result.package} ({kind}, ran on {result.provider})")
    if result.adapter:
        print(f"         through the {result.adapter}")
    if result.cpu_fallback:
        from engine.runtime.session import fallback_note

        print(f"         {fallback_note(result.cpu_fallback)}")
    built_for = result.package_ep
    if result.ep != built_for and built_for != "cpu":
        print(f"         built for {built_for}: add --ep {built_for} to check it there too")
    print(f"model    {result.model}")
    print(f"{'step':>4} {'ref':>7} {'pkg':>7} {'max |diff|':>11} {'rel':>9} {'cosine':>8}")
    for s in result.steps:
        mark = "" if s.package_token == s.reference_token else f"  <- margin {s.margin:.3g}"
        print(
            f"{s.step:>4} {s.reference_token:>7} {s.package_token:>7} {s.max_abs_diff:>11.3g} "
            f"{s.rel_diff:>9.3g} {s.cosine:>8.5f}{mark}"
        )
    if not result.greedy_tokens_identical:
        print(
            "     (margin: how much higher the reference scored its token than the package's "
            "top-1; a small one is a near-tie)"
        )
    print(
        f"max |diff| {result.max_abs_diff:.3g} (relative {result.max_rel_diff:.3g}), "
        f"min cosine {result.min_cosine:.5f}, top-1 agreement {result.agreement:.0%}, "
        f"greedy tokens {'identical' if result.greedy_tokens_identical else 'differ'}"
    )
    if result.quality is not None:
        print(f"quality  {result.quality.summary()}")
    if result.passed:
        print("verdict: PASS")
        return 0
    print("verdict: FAIL - " + "; ".join(result.reasons))
    for note in result.notes:
        print(f"note: {note}")
    return 1
