"""``python -m engine``: build, info and plan packages from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from engine.caps import list_eps
from engine.errors import CancelledError, EngineError
from engine.options import DTYPES, ExportOptions
from engine.presets import DEFAULT_PRESET, list_presets
from engine.units import format_bytes, parse_bytes

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = fn
        return fn

    return register


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--model", metavar="DIR", help="Hugging Face checkpoint folder (config.json + safetensors)")
    group.add_argument(
        "--preset", metavar="NAME", help=f"built-in architecture: {', '.join(list_presets())}"
    )


def _bits(text: str) -> int | None:
    if text.lower() in ("none", "float", "0"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 4, 8 or none, got '{text}'") from None


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ep", default="cpu", help=f"execution provider: {', '.join(list_eps())} (default cpu)")
    parser.add_argument("--dtype", choices=DTYPES, help="activation dtype (default: the EP's preferred)")
    parser.add_argument("--weight-bits", type=_bits, default=None, metavar="4|8|none",
                        help="quantize linear weights to MatMulNBits")
    parser.add_argument("--embedding-bits", type=_bits, default=None, metavar="4|8|none",
                        help="quantize embedding tables to GatherBlockQuantized")
    parser.add_argument("--block-size", type=int, default=32, help="quantization block size (default 32)")
    parser.add_argument("--symmetric", action="store_true", help="symmetric quantization (no zero points)")
    parser.add_argument("--quant-method", choices=("rtn", "search"), default="rtn",
                        help="rtn: round to nearest; search: per-block clip search (slower, lower error)")
    parser.add_argument("--no-quantize-lm-head", dest="quantize_lm_head", action="store_false",
                        help="keep an untied LM head in float when quantizing weights")
    parser.add_argument("--accuracy-level", type=int, default=None, help="MatMulNBits accuracy_level (0-4)")
    parser.add_argument("--graph-capture", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--max-buffer-size", type=_size, default=None, metavar="BYTES",
                        help="largest single buffer, e.g. 256MiB or 1GiB (default: the EP's limit)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="longest sequence the package supports (default: the model's)")
    parser.add_argument("--attention", choices=("auto", "gqa", "standard"), default="auto",
                        help="GroupQueryAttention or the standard-ONNX attention path")


def _options(args: argparse.Namespace, random_weights: bool = False) -> ExportOptions:
    return ExportOptions(
        ep=args.ep,
        dtype=args.dtype,
        weight_bits=args.weight_bits,
        embedding_bits=args.embedding_bits,
        block_size=args.block_size,
        symmetric=args.symmetric,
        quant_method=args.quant_method,
        quantize_lm_head=args.quantize_lm_head,
        accuracy_level=args.accuracy_level,
        graph_capture=args.graph_capture,
        max_buffer_size=args.max_buffer_size,
        max_length=args.max_length,
        attention=args.attention,
        random_weights=random_weights,
        seed=getattr(args, "seed", 0),
    )


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


@command("build")
def _build(args: argparse.Namespace) -> int:
    from engine.pipeline import export
    from engine.progress import CancelToken

    options = _options(args, random_weights=args.random_weights)
    cancel = CancelToken()
    with _progress_bar(args.quiet) as progress:
        try:
            result = export(args.output, model_dir=args.model, preset=args.preset, options=options,
                            overwrite=args.overwrite, progress=progress, cancel=cancel)
        except KeyboardInterrupt:
            raise CancelledError("interrupted; nothing was written") from None
    if args.json:
        _print_json({"output": str(result.output), "files": result.files, "seconds": result.seconds,
                     "graph_capture": result.graph_capture, "total_bytes": result.total_bytes})
        return 0
    print(f"wrote {result.output} ({format_bytes(result.total_bytes)}) in {result.seconds:.1f} s")
    for name, size in result.files.items():
        print(f"  {name:<28} {format_bytes(size):>12}")
    print(f"  graph capture: {'on' if result.graph_capture else 'off'}; "
          f"past/present share buffer: {'on' if result.share_buffer else 'off'}")
    for note in result.notes:
        print(f"  note: {note}")
    return 0


class _progress_bar:
    """A tqdm bar driven by (fraction, message) callbacks."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Any = None

    def __enter__(self) -> Callable[[float, str], None]:
        if self.quiet:
            return lambda fraction, message: None
        from tqdm import tqdm

        self.bar = tqdm(total=100, bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}",
                        file=sys.stderr, leave=False)

        def report(fraction: float, message: str) -> None:
            self.bar.set_description_str(message[:44].ljust(44), refresh=False)
            self.bar.update(round(fraction * 100, 2) - self.bar.n)

        return report

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


@command("info")
def _info(args: argparse.Namespace) -> int:
    from engine.pipeline import load_model_spec

    spec = load_model_spec(args.model, args.preset)
    summary = spec.summary()
    if args.json:
        _print_json(summary)
        return 0
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        if key == "parameters":
            value = f"{value:,}"
        print(f"{key:<{width}}  {value}")
    return 0


@command("plan")
def _plan(args: argparse.Namespace) -> int:
    from engine.pipeline import load_model_spec
    from engine.plan import plan
    from engine.plan_report import render_plan

    spec = load_model_spec(args.model, args.preset)
    result = plan(spec, _options(args))
    if args.json:
        _print_json(result.to_json())
    else:
        print(render_plan(result, top=args.top))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine",
        description="Export Gemma 4 to ONNX Runtime GenAI packages tuned for one execution provider.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="export a package")
    _add_model_args(build)
    _add_build_options(build)
    build.add_argument("--random-weights", action="store_true",
                       help="seeded random weights (architecture-only packages; needed for presets)")
    build.add_argument("--seed", type=int, default=0, help="seed for --random-weights")
    build.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument("--json", action="store_true", help="print the result as JSON")
    build.add_argument("output", metavar="OUT", help="package folder to create")

    info = sub.add_parser("info", help="summarize a model's architecture")
    _add_model_args(info)
    info.add_argument("--json", action="store_true")

    plan_cmd = sub.add_parser("plan", help="preview sizes and buffer splits, no weights needed")
    _add_model_args(plan_cmd)
    _add_build_options(plan_cmd)
    plan_cmd.add_argument("--top", type=int, default=12, help="largest tensors to list")
    plan_cmd.add_argument("--json", action="store_true")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["info", "--preset", DEFAULT_PRESET]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except CancelledError as exc:
        print(f"cancelled: {exc}", file=sys.stderr)
        return 130
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
