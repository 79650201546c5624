"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.caps import list_eps
from engine.errors import OptionsError, cli_phrase, option
from engine.options import (
    DTYPES,
    MODALITIES,
    WEIGHT_ONLY,
    ExportOptions,
    changed_fields,
    unused_quantization,
)
from engine.presets import list_presets
from engine.progress import Progress
from engine.units import parse_bytes


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--model", metavar="DIR", help="Hugging Face checkpoint folder (config.json + safetensors)"
    )
    group.add_argument(
        "--preset", metavar="NAME", help=f"built-in architecture: {', '.join(list_presets())}"
    )


def bits(text: str) -> int | None:
    if text.lower() in ("none", "float", "0"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 4, 8 or none, got '{text}'") from None


def count(text: str) -> int:
    """A whole number, also written as ``1e6`` or ``4,096``."""
    cleaned = text.strip().replace(",", "").replace("_", "")
    try:
        return int(cleaned)
    except ValueError:
        pass
    try:
        value = float(cleaned)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'")
    return int(value)


def size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_build_options(
    parser: argparse.ArgumentParser, ep_default: str | None = "cpu", ep_said: str = "default cpu"
) -> None:
    """Options that shape a package (shared by build, plan and audit). ``ep_default``: --ep
    when it is not given (audit's None: a package's own EP), as ``ep_said`` tells it."""
    parser.add_argument(
        "--ep", default=ep_default, help=f"execution provider: {', '.join(list_eps())} ({ep_said})"
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, help="activation dtype (default: the EP's preferred)"
    )
    parser.add_argument(
        "--weight-bits",
        type=bits,
        default=None,
        metavar="4|8|none",
        help="quantize linear weights to MatMulNBits",
    )
    parser.add_argument(
        "--embedding-bits",
        type=bits,
        default=None,
        metavar="4|8|none",
        help="quantize embedding tables to GatherBlockQuantized",
    )
    parser.add_argument(
        "--block-size", type=count, default=32, help="quantization block size (default 32)"
    )
    parser.add_argument(
        "--embedding-block-size",
        type=count,
        default=None,
        metavar="N",
        help="block size of the quantized embedding tables (default: --block-size)",
    )
    parser.add_argument(
        "--symmetric",
        action="store_true",
        help="symmetric quantization (no zero points; faster MatMulNBits on CUDA)",
    )
    parser.add_argument(
        "--quant-method",
        choices=("rtn", "search", "gptq", "awq", "awq-gptq"),
        default="rtn",
        help="rtn: round to nearest; search: per-block scale search (slower, lower error); "
        "gptq: error feedback from each linear's inputs on calibration text (a checkpoint "
        "with its tokenizer; slower, lowest error measured); awq: activation-aware input "
        "scales folded into the norms, then round to nearest (calibrated too; helps where a "
        "few input channels are loud); awq-gptq: those scales, then GPTQ",
    )
    parser.add_argument(
        "--calibration",
        metavar="TEXT_FILE",
        default=None,
        help="UTF-8 text whose tokens calibrate --quant-method gptq, awq or awq-gptq and the "
        "sensitivity measurement of --size-budget, --target-kld and plan --tradeoff (default: "
        "a built-in sample of the Python standard library's documentation strings)",
    )
    parser.add_argument(
        "--no-quantize-lm-head",
        dest="quantize_lm_head",
        action="store_false",
        help="keep an untied LM head in float when quantizing weights",
    )
    parser.add_argument(
        "--accuracy-level", type=count, default=None, help="MatMulNBits accuracy_level (0-4)"
    )
    parser.add_argument(
        "--graph-capture",
        choices=("auto", "on", "off"),
        default="auto",
        help="graph capture in the genai_config (auto: on where the EP has it and the "
        "audit finds nothing that breaks it; on: refuse to build otherwise)",
    )
    parser.add_argument(
        "--max-buffer-size",
        type=size,
        default=None,
        metavar="BYTES",
        help="largest single buffer, e.g. 256MiB or 1GiB (default: the EP's limit)",
    )
    parser.add_argument(
        "--max-length",
        type=count,
        default=None,
        help="longest sequence the package supports (default: the model's)",
    )
    parser.add_argument(
        "--keep-float",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave weights whose name matches PATTERN unquantized (as `plan` lists them, "
        "e.g. 'layers.*.per_layer_projection.weight'; repeatable)",
    )
    parser.add_argument(
        "--keep-int8",
        action="append",
        default=[],
        metavar="PATTERN",
        help="store quantized weights whose name matches PATTERN in 8 bits (mixed precision: "
        "e.g. --weight-bits 4 --keep-int8 'layers.0.*'; blocks of 128 where the width allows; "
        "repeatable)",
    )
    parser.add_argument(
        "--size-budget",
        type=size,
        default=None,
        metavar="SIZE",
        help="mixed precision by measured sensitivity: the most bytes the package may take "
        "(e.g. 20MB); the 4-bit weights that lose the most per byte go to INT8 (needs --model)",
    )
    parser.add_argument(
        "--target-kld",
        type=float,
        default=None,
        metavar="NATS",
        help="the same choice toward a predicted mean KL divergence (the fewest INT8 weights)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write the package even when a tensor exceeds the --max-buffer-size you chose",
    )
    parser.add_argument(
        "--attention",
        choices=("auto", "gqa", "standard"),
        default="auto",
        help="GroupQueryAttention or the standard-ONNX attention path",
    )
    parser.add_argument(
        "--modalities",
        type=modalities,
        default=None,
        metavar="LIST",
        help="towers to export, comma-separated from text,vision,audio "
        "(default: every tower the checkpoint has)",
    )


def modalities(text: str) -> tuple[str, ...]:
    """``text,vision`` -> ("text", "vision"); the text decoder is always exported."""
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in MODALITIES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown modality {', '.join(unknown)}; choose from {', '.join(MODALITIES)}"
        )
    return names if "text" in names else ("text", *names)


def options_from_args(args: argparse.Namespace, random_weights: bool = False) -> ExportOptions:
    return ExportOptions(
        ep=args.ep,
        dtype=args.dtype,
        weight_bits=args.weight_bits,
        embedding_bits=args.embedding_bits,
        block_size=args.block_size,
        embedding_block_size=args.embedding_block_size,
        symmetric=args.symmetric,
        quant_method=args.quant_method,
        calibration=args.calibration,
        quantize_lm_head=args.quantize_lm_head,
        accuracy_level=args.accuracy_level,
        graph_capture=args.graph_capture,
        max_buffer_size=args.max_buffer_size,
        max_length=args.max_length,
        attention=args.attention,
        keep_float=tuple(args.keep_float),
        keep_int8=tuple(args.keep_int8),
        size_budget=args.size_budget,
        target_kld=args.target_kld,
        force=args.force,
        random_weights=random_weights,
        seed=getattr(args, "seed", 0),
        modalities=args.modalities,
    )


def flag(name: str) -> str:
    """The command line's flag that sets ExportOptions field ``name``."""
    return "--no-quantize-lm-head" if name == "quantize_lm_head" else cli_phrase(name, None)


def refuse_unused_quantization(options: ExportOptions) -> None:
    """A quantization flag given to an export with nothing it applies to changes nothing:
    it is refused, as ``--keep-int8`` is, rather than ignored (the user meant some
    quantization). Values the options refuse anyway are refused for that first."""
    options.resolve()
    given = changed_fields(options, unused_quantization(options))
    if not given:
        return
    flags = ", ".join(flag(name) for name in given)
    verb = "shapes" if len(given) == 1 else "shape"
    these = "it" if len(given) == 1 else "them"
    if options.weight_bits is not None:
        raise OptionsError(
            f"{flags} shapes quantized embedding tables, but the embedding tables stay float; "
            f"add {option('embedding_bits', 4)}, or leave it out"
        )
    if options.embedding_bits is not None:
        raise OptionsError(
            f"{flags} {verb} quantized linear weights, but only the embedding tables are "
            f"quantized; add {option('weight_bits', 4)}, or leave {these} out"
        )
    # what the flags given need: weights (WEIGHT_ONLY), tables (their block size), or either
    weights = any(n in WEIGHT_ONLY for n in given)
    tables = "embedding_block_size" in given
    weight_bits, embedding_bits = option("weight_bits", 4), option("embedding_bits", 4)
    if weights or tables:
        needed = ((weight_bits, weights), (embedding_bits, tables))
        add = " and ".join(wanted for wanted, need in needed if need)
    else:
        add = f"{weight_bits} (and / or {embedding_bits})"
    raise OptionsError(
        f"{flags} {verb} quantized weights, but nothing is quantized; add {add}, or leave "
        f"{these} out"
    )


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


class progress_bar:
    """A tqdm bar on stderr driven by (fraction, message) callbacks; silent when quiet."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Any = None

    def __enter__(self) -> Progress:
        if self.quiet:
            return lambda fraction, message: None
        from tqdm import tqdm

        self.bar = tqdm(
            total=100,
            bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}",
            file=sys.stderr,
            leave=False,
            delay=0.5,  # quick runs and early errors draw no bar at all
            disable=None,  # no bar when stderr is not a terminal (a log would keep its \r frames)
        )

        def report(fraction: float, message: str) -> None:
            self.bar.set_description_str(message[:44].ljust(44), refresh=False)
            self.bar.update(round(fraction * 100, 2) - self.bar.n)

        return report

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
