"""Export options: what the user chose, validated against the model and the EP."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Literal, get_args

from engine.caps import EpCapabilities, get_caps
from engine.errors import OptionsError, option

DType = Literal["fp32", "fp16", "bf16"]
GraphCapture = Literal["auto", "on", "off"]
AttentionPath = Literal["auto", "gqa", "standard"]
QuantMethod = Literal["rtn", "search", "gptq", "awq", "awq-gptq"]

AWQ_METHODS = ("awq", "awq-gptq")
"""Quantization methods that scale the linears' inputs (:mod:`engine.quantize.awq`)."""
GPTQ_METHODS = ("gptq", "awq-gptq")
"""Quantization methods that quantize with GPTQ's error feedback."""

DTYPES: tuple[DType, ...] = ("fp32", "fp16", "bf16")
VALID_BITS = (4, 8)
DEFAULT_CAPTURE_MAX_LENGTH = 4096
MAX_LENGTH_LIMIT = 2**31 - 1
"""Longest sequence onnxruntime's int32 ``total_sequence_length`` / ``seqlens_k`` count."""
MODALITIES = ("text", "vision", "audio")


@dataclass(frozen=True)
class ExportOptions:
    """Everything that shapes a package besides the model itself.

    ``None`` fields take the EP's default when the options are resolved
    (:meth:`resolve`), so a saved options object means the same thing on every EP.
    """

    ep: str = "cpu"
    dtype: DType | None = None
    weight_bits: int | None = None
    """4 or 8 to quantize linear weights with MatMulNBits; None keeps them float."""
    embedding_bits: int | None = None
    """4 or 8 to quantize embedding tables with GatherBlockQuantized; None keeps them float."""
    block_size: int = 32
    embedding_block_size: int | None = None
    """Block size of the embedding tables; None uses ``block_size``."""
    symmetric: bool = False
    quant_method: QuantMethod = "rtn"
    """``rtn``, ``search`` (per-block scale search), ``gptq`` (error feedback from the
    linears' inputs on calibration text, :mod:`engine.calibration`; a token table a tied
    head reads is calibrated as that head, other tables stay RTN), ``awq`` (activation-aware
    input scales folded into the norms and up projections, then round to nearest:
    :mod:`engine.quantize.awq`) or ``awq-gptq`` (those scales, then GPTQ)."""
    calibration: str | None = None
    """A UTF-8 text file whose tokens calibrate ``gptq`` / ``awq`` / ``awq-gptq`` and the
    sensitivity measurement of ``size_budget`` / ``target_kld``; None = the built-in
    sample."""
    quantize_lm_head: bool = True
    accuracy_level: int | None = None
    graph_capture: GraphCapture = "auto"
    max_buffer_size: int | None = None
    """Largest single buffer allowed; None = the EP's default (WebGPU: 256 MiB)."""
    max_length: int | None = None
    """Longest sequence (prompt + generated) the package is built for; sizes the RoPE
    caches and, with graph capture, the preallocated KV buffers."""
    attention: AttentionPath = "auto"
    keep_float: tuple[str, ...] = ()
    """Name patterns (``fnmatch``, as ``plan`` lists the weights, e.g.
    ``layers.*.per_layer_projection.weight``) of weights to leave unquantized."""
    keep_int8: tuple[str, ...] = ()
    """Name patterns of quantized weights to store in 8 bits whatever ``weight_bits`` /
    ``embedding_bits`` say: mixed precision, the layers a measurement found sensitive in
    INT8 and the rest in INT4 (``keep_float`` wins where both match). Their blocks are
    :data:`engine.plan.INT8_BLOCK` where the width allows (:func:`engine.plan.int8_block`)."""
    size_budget: int | None = None
    """Mixed precision by measured sensitivity: the most bytes the package may take; the
    4-bit weights that cost the most KL divergence per byte go to INT8 until it is spent
    (:mod:`engine.sensitivity`; needs the checkpoint)."""
    target_kld: float | None = None
    """The same choice toward a predicted mean KL divergence instead: the fewest INT8
    weights that bring it to this (nats per token)."""
    force: bool = False
    """Write the package even when a limit the user chose is exceeded."""
    random_weights: bool = False
    seed: int = 0
    modalities: tuple[str, ...] | None = None
    """Towers to export besides the text decoder (``vision``, ``audio``); None = every
    tower the checkpoint has. ``("text",)`` exports the text decoder alone."""

    def __post_init__(self) -> None:
        # Options read back from JSON (the app's settings) carry a list: keep them hashable
        # and equal to the options that were saved.
        for name in ("keep_float", "keep_int8"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.modalities, list):
            object.__setattr__(self, "modalities", tuple(self.modalities))

    @property
    def calibrated(self) -> bool:
        """The quantization method runs the float model on calibration text (GPTQ, AWQ)."""
        return self.quant_method in AWQ_METHODS + GPTQ_METHODS

    @property
    def block_quantizer(self) -> str:
        """How blocks are rounded where no calibration applies (``rtn`` or ``search``): the
        method itself, or round to nearest for a calibrated one (the weights GPTQ does not
        calibrate; the sensitivity measurement, whose codes have no feedback or scales)."""
        return "rtn" if self.calibrated else self.quant_method

    @property
    def caps(self) -> EpCapabilities:
        return get_caps(self.ep)

    def resolve(self) -> ExportOptions:
        """Fill EP defaults and check every value; raises :class:`OptionsError`."""
        caps = self.caps
        dtype = self.dtype or caps.default_dtype
        if dtype not in DTYPES:
            raise OptionsError(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")
        if dtype not in caps.float_dtypes:
            raise OptionsError(
                f"{caps.display_name} does not run {dtype} models; "
                f"choose one of: {', '.join(caps.float_dtypes)}"
            )
        for label, bits in (("weight", self.weight_bits), ("embedding", self.embedding_bits)):
            if bits is not None and bits not in VALID_BITS:
                raise OptionsError(f"{label} bits must be 4 or 8 (or none), got {bits}")
        for label, size in (
            ("block size", self.block_size),
            ("embedding block size", self.embedding_block_size),
        ):
            if size is None:
                continue
            if size < 16 or size > 256 or size & (size - 1):
                raise OptionsError(f"{label} must be a power of two from 16 to 256, got {size}")
        if self.quant_method not in get_args(QuantMethod):
            raise OptionsError(
                f"unknown quantization method {self.quant_method!r}; use rtn, search, gptq, "
                "awq or awq-gptq"
            )
        if self.calibrated and self.weight_bits is None:
            raise OptionsError(
                f"{option('quant_method', self.quant_method)} quantizes linear weights; add "
                f"{option('weight_bits', 4)}"
            )
        measured = self.size_budget is not None or self.target_kld is not None
        if self.calibration is not None and not self.calibrated and not measured:
            raise OptionsError(
                f"{option('calibration')} is read by {option('quant_method', 'gptq')}, "
                f"{option('quant_method', 'awq')} or {option('quant_method', 'awq-gptq')} and "
                f"by {option('size_budget')} / {option('target_kld')} only"
            )
        if self.weight_bits is not None and not caps.supports("MatMulNBits"):
            raise OptionsError(
                f"{caps.display_name} has no MatMulNBits: weight quantization is unavailable"
            )
        if self.embedding_bits is not None and not caps.supports("GatherBlockQuantized"):
            raise OptionsError(
                f"{caps.display_name} has no GatherBlockQuantized: "
                "embedding quantization is unavailable"
            )
        if self.accuracy_level is not None and self.accuracy_level not in (0, 1, 2, 3, 4):
            raise OptionsError(f"accuracy level must be 0-4, got {self.accuracy_level}")
        if self.graph_capture not in ("auto", "on", "off"):
            raise OptionsError(f"graph capture must be auto, on or off, got '{self.graph_capture}'")
        if self.graph_capture == "on" and not caps.graph_capture:
            raise OptionsError(
                f"{caps.display_name} does not support graph capture; "
                f"use {option('graph_capture', 'off')}"
            )
        if self.attention not in ("auto", "gqa", "standard"):
            raise OptionsError(f"attention must be auto, gqa or standard, got '{self.attention}'")
        if self.attention == "gqa" and not caps.supports("GroupQueryAttention"):
            raise OptionsError(
                f"{caps.display_name} has no GroupQueryAttention; "
                f"use {option('attention', 'standard')}"
            )
        if self.max_buffer_size is not None and self.max_buffer_size < 1024:
            raise OptionsError(
                f"max buffer size must be at least 1 KiB, got {self.max_buffer_size} bytes"
            )
        if self.modalities is not None:
            unknown = sorted(set(self.modalities) - set(MODALITIES))
            if unknown:
                raise OptionsError(
                    f"unknown modalities {unknown}; choose from {', '.join(MODALITIES)}"
                )
        if self.max_length is not None and self.max_length < 2:
            raise OptionsError(f"max length must be at least 2, got {self.max_length}")
        if self.max_length is not None and self.max_length > MAX_LENGTH_LIMIT:
            raise OptionsError(
                f"max length {self.max_length:,} is beyond what onnxruntime's int32 sequence "
                f"lengths can count ({MAX_LENGTH_LIMIT:,}); choose a smaller "
                f"{option('max_length')}"
            )
        patterns = {
            "keep_float": _patterns(self.keep_float, option("keep_float")),
            "keep_int8": _patterns(self.keep_int8, option("keep_int8")),
        }
        if self.size_budget is not None and self.target_kld is not None:
            raise OptionsError(
                f"give {option('size_budget')} or {option('target_kld')}, not both (one picks "
                "the INT8 weights for a size, the other for a quality)"
            )
        if self.size_budget is not None and self.size_budget < 1:
            raise OptionsError(f"{option('size_budget')} must be a size in bytes")
        if self.target_kld is not None and not self.target_kld >= 0:
            raise OptionsError(
                f"{option('target_kld')} must be a mean KL divergence of 0 or more, got "
                f"{self.target_kld}"
            )
        if (self.size_budget or self.target_kld is not None) and 4 not in (
            self.weight_bits,
            self.embedding_bits,
        ):
            raise OptionsError(
                f"{option('size_budget')} and {option('target_kld')} choose INT8 for some 4-bit "
                f"weights; add {option('weight_bits', 4)} (and / or {option('embedding_bits', 4)})"
            )
        if self.seed < 0:  # as bench's and verify's: one rule for every seed
            raise OptionsError(f"{option('seed')} must be 0 or more, got {self.seed}")
        if patterns["keep_int8"] and self.weight_bits is None and self.embedding_bits is None:
            raise OptionsError(
                f"{option('keep_int8')} stores quantized weights in 8 bits, but nothing is "
                f"quantized; add {option('weight_bits', 4)} (or {option('embedding_bits', 4)})"
            )
        return replace(
            self,
            keep_float=patterns["keep_float"],
            keep_int8=patterns["keep_int8"],
            ep=caps.name,
            dtype=dtype,
            embedding_block_size=self.embedding_block_size or self.block_size,
            accuracy_level=(
                self.accuracy_level if self.accuracy_level is not None else caps.int4_accuracy_level
            ),
            max_buffer_size=(
                self.max_buffer_size if self.max_buffer_size is not None else caps.max_buffer_size
            ),
        )

    def keeps_float(self, name: str) -> bool:
        """Whether the weight ``name`` matches a :attr:`keep_float` pattern."""
        return any(fnmatchcase(name, pattern) for pattern in self.keep_float)

    def keeps_int8(self, name: str) -> bool:
        """Whether the weight ``name`` matches a :attr:`keep_int8` pattern."""
        return any(fnmatchcase(name, pattern) for pattern in self.keep_int8)

    @property
    def uses_gqa(self) -> bool:
        """GroupQueryAttention (True) or the standard-ONNX attention path (False)."""
        caps = self.caps
        if self.attention == "standard":
            return False
        if self.attention == "gqa":
            return True
        return (
            caps.supports("GroupQueryAttention")
            and (self.dtype or caps.default_dtype) in caps.gqa_dtypes
        )


def _patterns(raw: str | Iterable[object], flag: str) -> tuple[str, ...]:
    """``keep_float`` / ``keep_int8`` (``flag``: the option, as a message names it):
    non-empty name patterns, stripped."""
    patterns = [raw] if isinstance(raw, str) else list(raw)
    if not all(isinstance(p, str) and p.strip() for p in patterns):
        raise OptionsError(f"{flag} takes weight name patterns, got {patterns!r}")
    return tuple(str(p).strip() for p in patterns)


WEIGHT_ONLY = ("accuracy_level", "quantize_lm_head")
"""ExportOptions fields that shape quantized linear weights (MatMulNBits) and nothing else."""
QUANTIZATION_ONLY = (
    "block_size",
    "embedding_block_size",
    "symmetric",
    "quant_method",
    *WEIGHT_ONLY,
)
"""ExportOptions fields that shape quantized weights or tables and nothing else."""


def unused_quantization(options: ExportOptions) -> tuple[str, ...]:
    """The fields of :data:`QUANTIZATION_ONLY` that this export has nothing to apply to: all
    of them without quantization, :data:`WEIGHT_ONLY` with float weights, the embedding
    block size with float tables (the command line refuses them given; the studio greys
    them out)."""
    if options.weight_bits is None:
        return WEIGHT_ONLY if options.embedding_bits is not None else QUANTIZATION_ONLY
    return ("embedding_block_size",) if options.embedding_bits is None else ()


def changed_fields(options: ExportOptions, names: Iterable[str]) -> list[str]:
    """Which of ``names`` (ExportOptions fields) differ from what is left out."""
    left_out = ExportOptions()
    return [name for name in names if getattr(options, name) != getattr(left_out, name)]
