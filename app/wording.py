"""The app's words: control labels, choices and help, and every engine message phrased with them.

The engine names options in its messages through markup (``engine.errors.option``); the CLI
renders it as flags, and the app renders it here, with the labels its controls carry, so an
error says "use “Graph capture: off”" instead of "use --graph-capture off". Panels build
their controls from :data:`CONTROLS` (label, mnemonic, tooltip, choices), so the words in a
message and on the screen cannot drift apart. No Qt here: it is plain data and text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.caps import EpCapabilities
from engine.errors import EngineError, render_message
from engine.units import format_bytes


@dataclass(frozen=True)
class Control:
    """How the app shows one engine option."""

    label: str
    """The form label; ``&`` marks the mnemonic (Alt+letter)."""
    help: str
    """Tooltip: what the choice means and where its default comes from."""
    choices: tuple[tuple[str, Any], ...] = ()
    """(shown text, option value) of a combo box, in order."""

    @property
    def name(self) -> str:
        """The label as read (no mnemonic marker)."""
        return self.label.replace("&", "")

    def choice_text(self, value: Any) -> str | None:
        """The shown text of an option value, or None when it is not a choice here."""
        for text, data in self.choices:
            if data == value or str(data) == str(value):
                return text
            # A list option as the command line writes it: --modalities text,vision
            if isinstance(data, tuple) and ",".join(map(str, data)) == str(value):
                return text
        return None


BITS_CHOICES = (("float (none)", None), ("4-bit", 4), ("8-bit", 8))
BLOCK_SIZES = (16, 32, 64, 128, 256)

CONTROLS: dict[str, Control] = {
    "model": Control(
        "Model &folder",
        "A Hugging Face checkpoint folder: config.json plus *.safetensors (sharded or not). "
        "Drop a folder on the window to choose it.",
    ),
    "preset": Control(
        "&Preset",
        "A built-in architecture (config only, no weights): its packages use seeded random "
        "weights, for sizes, benchmarks and trying the tool.",
    ),
    "ep": Control(
        "E&xecution provider",
        "The onnxruntime backend the package is built for. It decides which fused operators "
        "the graph may use, the activation dtypes, graph capture, and the largest buffer one "
        "tensor may occupy.",
    ),
    "dtype": Control(
        "Activation d&type",
        "Float type of activations and unquantized weights. 'EP default' is the EP's "
        "preferred type (fp32 on the CPU, fp16 on GPUs).",
    ),
    "graph_capture": Control(
        "&Graph capture",
        "Record the decoder's GPU work once and replay it each token (CUDA graphs, WebGPU "
        "capture): fewer launches, faster decoding. Needs batch 1, static shapes, every node "
        "on the device and a shared KV buffer. auto: on where the EP and the audit allow it.",
        (("auto", "auto"), ("on", "on"), ("off", "off")),
    ),
    "weight_bits": Control(
        "&Weight bits",
        "Quantize every linear layer's weights to 4 or 8 bits (MatMulNBits, blockwise with "
        "scales and zero points): about 4x or 2x smaller than fp16, small accuracy cost.",
        BITS_CHOICES,
    ),
    "embedding_bits": Control(
        "E&mbedding bits",
        "Quantize the token and per-layer embedding tables (GatherBlockQuantized). Gemma 4's "
        "tables are most of its bytes: 4-bit makes E2B's 4.4 GiB per-layer table ~1.2 GiB.",
        BITS_CHOICES,
    ),
    "block_size": Control(
        "&Block size",
        "Values that share one scale (and zero point) when quantizing. Smaller blocks are "
        "more accurate and slightly larger. Widths that are not a whole number of blocks are "
        "padded; sizes the model cannot use (a partial block under a tied head, an odd "
        "block count where the EP cannot read it) are disabled with the reason.",
        tuple((str(b), b) for b in BLOCK_SIZES),
    ),
    "embedding_block_size": Control(
        "Embedding block si&ze",
        "Block size of the embedding tables; 'same' uses the block size above.",
        (("same as weights", None), *((str(b), b) for b in BLOCK_SIZES)),
    ),
    "symmetric": Control(
        "Symmetric quantization",
        "Symmetric blocks (no zero points): slightly smaller, usually a little less "
        "accurate, and faster on CUDA (onnxruntime-gpu reads no zero points: E2B INT4 on an "
        "H200 decoded 315 tok/s against 299, 327 at block size 128).",
    ),
    "quant_method": Control(
        "Quantizer",
        "round to nearest (fast), a per-block scale search (slower, lower error), GPTQ: "
        "error feedback from each linear's inputs on a built-in calibration text (a "
        "checkpoint with its tokenizer; slower, lowest error measured), AWQ: activation-aware "
        "input scales folded into the norms (calibrated too; helps where a few input channels "
        "are loud), or AWQ then GPTQ.",
        (
            ("round to nearest", "rtn"),
            ("scale search", "search"),
            ("GPTQ (calibrated)", "gptq"),
            ("AWQ (calibrated)", "awq"),
            ("AWQ + GPTQ (calibrated)", "awq-gptq"),
        ),
    ),
    "quantize_lm_head": Control(
        "Quantize the LM head",
        "With weight bits set, also quantize an untied LM head (a tied one shares the "
        "embedding table's storage).",
    ),
    "accuracy_level": Control(
        "Accurac&y level",
        "MatMulNBits accuracy_level: the activation type of the quantized matmul "
        "(4 = int8 where the EP supports it; 0 = the EP's choice).",
        (("EP default", None), *((str(n), n) for n in range(5))),
    ),
    "modalities": Control(
        "Inp&uts",
        "What the package takes besides text: images (the vision tower) and audio (the "
        "speech tower), each exported as its own session beside an embedding session. "
        "Choices the model's checkpoint has no tower for are disabled.",
        (
            ("everything the model takes", None),
            ("text", ("text",)),
            ("text, images", ("text", "vision")),
            ("text, images, audio", ("text", "vision", "audio")),
        ),
    ),
    "max_buffer_size": Control(
        "Buffer &limit",
        "The largest single buffer (one tensor) the EP may allocate. Tables above it are split "
        "into pieces that fit. WebGPU's default is the W3C spec default maxBufferSize, 256 MiB "
        "(268,435,456 B); desktop adapters often grant 1-4 GiB, phones 128-256 MiB. Choose "
        "custom when you know what your target device grants.",
        (("EP default", "default"), ("custom", "custom")),
    ),
    "force": Control(
        "Write even if a tensor is over the limit",
        "A custom buffer limit that a tensor cannot be split under refuses the export (a "
        "device with that limit could not load the package). Tick to write it anyway.",
    ),
    "keep_float": Control(
        "Keep in &float",
        "Weight name patterns left unquantized, comma-separated, as the split table names "
        "them (e.g. layers.*.per_layer_projection.weight).",
    ),
    "calibration": Control(
        "Calibration text",
        "A UTF-8 text file whose tokens calibrate GPTQ (default: a built-in sample).",
    ),
    "keep_int8": Control(
        "Keep in &8 bits",
        "Weight name patterns stored in 8 bits while the others take the chosen bits "
        "(mixed precision: the sensitive layers in INT8, the rest in INT4), comma-separated, "
        "e.g. layers.0.*, embed_tokens.weight.",
    ),
    "size_budget": Control(
        "Si&ze budget",
        "Mixed precision chosen by measurement: the most bytes the package may take. At "
        "export each 4-bit weight's cost is measured on the checkpoint's float model (the "
        "KL divergence with only that weight in INT4, on the calibration text), and the ones "
        "that lose the most per byte go to INT8 until the budget is spent. Needs a checkpoint "
        "of up to about 0.5 B parameters. The preview shows the mix, weight by weight, once "
        "“Compare sizes and quality…” has measured (all-INT4 until then).",
    ),
    "target_kld": Control(
        "Target KLD",
        "The same measured choice toward a predicted mean KL divergence (nats per token): "
        "the fewest INT8 weights that reach it (command line and Python API).",
    ),
    "tradeoff": Control(
        "Compa&re sizes and quality…",
        "Measure each 4-bit weight on the checkpoint's float model (as the size budget does) "
        "and compare all-INT4, INT4 + INT8 mixes, INT8 and float: bytes and predicted mean KL "
        "divergence side by side, before any export. Pick one to set the size budget.",
    ),
    "max_length": Control(
        "Max le&ngth",
        "The longest sequence (prompt plus generated tokens) the package supports. It sizes "
        "the RoPE caches and, with graph capture, the preallocated KV buffers.",
    ),
    "attention": Control(
        "&Attention",
        "GroupQueryAttention (fused, needed for graph capture and a shared KV buffer) or "
        "standard ONNX operators (any EP, KV grown by Concat). auto: GQA where the EP has it. "
        "On WebGPU, whose GroupQueryAttention is not trusted under graph capture, the GQA "
        "choice is built as explicit attention over static KV buffers instead.",
        (("auto", "auto"), ("GroupQueryAttention", "gqa"), ("standard ONNX", "standard")),
    ),
    "random_weights": Control(
        "Random we&ights",
        "Seeded random weights instead of the checkpoint's: an architecture-only package "
        "for sizes and speed (no checkpoint needed).",
    ),
    "seed": Control("Random seed", "Seed of the random weights."),
    "output": Control(
        "&Output folder",
        "Where the package is written. It follows the model and the options (bits and dtype "
        "in its name) until you edit it.",
    ),
    "overwrite": Control(
        "Replace an exi&sting folder",
        "Replace the output folder if it exists, only once the new package is complete. You "
        "are asked to confirm before each export; it is never remembered between launches.",
    ),
    "runtime": Control(
        "R&untime",
        "Our onnxruntime loop (IOBinding, node placement measured) or onnxruntime-genai.",
        (("our runner (ort)", "ort"), ("onnxruntime-genai", "genai")),
    ),
    "prompt_len": Control("&Prompt tokens", "Length of the seeded random prompt."),
    "new_tokens": Control("&New tokens", "Tokens generated per timed run (at least 2)."),
    "repeats": Control("Repeats", "Timed runs; decode tok/s is their median, with min and max."),
    "warmup": Control(
        "Warm-up run&s",
        "Untimed runs before the timed ones (each as long as one; 0 for a quick look on a "
        "software adapter).",
    ),
    "threads": Control("Threads", "onnxruntime's intra-op threads (default: the runtime's)."),
    "image": Control("Images", "Images sent with the prompt (PNG, JPEG, GIF or BMP)."),
    "audio": Control("Audio", "An audio clip sent with the prompt (WAV, FLAC or MP3)."),
    "prompt": Control("Prompt", "The text sent with images or audio (the markers are added)."),
    # The command line's bench only: the studio's runner picks its KV mode from the package.
    "kv_mode": Control("KV mode", "Our runner's KV cache: shared preallocated or growing."),
    "steps": Control("Steps", "Generated positions Verify compares with transformers."),
    # Verify's quality on text: the studio measures on the built-in sample with the defaults.
    "text": Control("Text", "A UTF-8 text file Verify measures quality on (KLD, perplexity)."),
    "text_tokens": Control("Text tokens", "Positions of the text Verify scores (0: none)."),
    "max_kld": Control("Largest KLD", "Verify fails above this mean KL divergence on the text."),
    "top": Control("Largest tensors", "How many of the largest tensors the plan lists."),
    # The command line's audit only (the studio's audit never measures placement).
    "runtime_python": Control(
        "Runtime Python", "The interpreter of the environment that has the EP's onnxruntime."
    ),
    "no_placement": Control("Skip node placement", "Audit the graph alone, without the EP."),
}
"""Every option key the engine's messages may name (ExportOptions fields and the rest)."""

_NUMBER_OF_BYTES = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d{5,}) B\b")


def phrase(key: str, value: str | None = None) -> str:
    """An option as the app names it: “Graph capture: off”, “Replace an existing folder”."""
    control = CONTROLS.get(key)
    if control is None:  # a key no control has yet: still readable, never a crash
        label = key.replace("_", " ")
        return f"“{label}: {value}”" if value is not None else f"“{label}”"
    if value is None:
        return f"“{control.name}”"
    shown = control.choice_text(value)
    return f"“{control.name}: {shown if shown is not None else value}”"


def render(text: str) -> str:
    """Any engine text (an error, a plan warning or note) in the app's words and units."""
    return _human_bytes(render_message(text, phrase))


def error_text(exc: BaseException) -> str:
    """What the user reads for a failure: the engine's message in the app's words; anything
    else (a bug) with its type, so it can be reported."""
    if isinstance(exc, EngineError):
        return _human_bytes(exc.render(phrase))
    return f"unexpected {type(exc).__name__}: {exc}"


ENGINE_TERMS = {
    "max_storage_binding_size": "the storage binding limit",
    "max_buffer_size": "the buffer limit",
}
"""Capability names that engine texts use as words."""


def _human_bytes(text: str) -> str:
    """Raw byte counts ("268,435,456 B") in the binary units the rest of the app uses, and
    capability names in words."""
    for term, words in ENGINE_TERMS.items():
        text = re.sub(rf"\b{term}\b", words, text)

    return _NUMBER_OF_BYTES.sub(
        lambda match: format_bytes(int(match.group(1).replace(",", ""))), text
    )


def ep_summary(caps: EpCapabilities) -> str:
    """What choosing an EP means, for its item's tooltip (from its capability flags)."""
    limit = (
        f"largest buffer {format_bytes(caps.max_buffer_size)} by default"
        if caps.max_buffer_size
        else "no buffer limit"
    )
    quantized = [op for op in ("MatMulNBits", "GatherBlockQuantized") if caps.supports(op)]
    summary = (
        f"{caps.display_name} ({caps.ort_provider}): activations "
        f"{' or '.join(caps.float_dtypes)}; {limit}; graph capture "
        f"{'available' if caps.graph_capture else 'not available'}; quantized ops: "
        f"{', '.join(quantized) or 'none'}"
    )
    return f"{summary}. {caps.untested_note()}." if caps.untested else summary
