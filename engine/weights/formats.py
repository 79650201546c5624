"""Checkpoint folders the export cannot read as they are, recognised by what they hold.

The export reads float safetensors weights of a whole model. Three common folders are
something else, and each has one fix the user can apply, so each is named with its fix
rather than reported as a list of missing and unexpected tensors:

* PyTorch pickles (``pytorch_model.bin``): re-save the model with transformers;
* pre-quantized checkpoints (FP8, GPTQ / AWQ, bitsandbytes: ``quantization_config`` in
  config.json, 8-bit float dtypes, ``*.weight_scale`` / ``*.scales`` tensors): the float
  checkpoint is needed, and the export quantizes it itself;
* PEFT adapters (``adapter_config.json``, ``lora_A`` / ``lora_B`` tensors): merge the
  adapter into its base model first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from engine.errors import option

PICKLE_PATTERNS = (
    "pytorch_model*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
)
OTHER_FORMATS = {
    "tf_model.h5": "TensorFlow",
    "flax_model.msgpack": "Flax",
}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
FP8_CODES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
QUANT_PARTS = frozenset(
    {
        "weight_scale",
        "weight_scale_inv",
        "weight_scale_2",
        "weight_global_scale",
        "weight_zero_point",
        "weight_packed",
        "weight_shape",
        "input_scale",
        "input_global_scale",
        "scales",
        "qweight",
        "qzeros",
        "g_idx",
        "absmax",
        "quant_map",
        "nested_absmax",
        "nested_quant_map",
        "SCB",
    }
)
"""Name components of the extra tensors quantizers save beside (or instead of) a weight:
compressed-tensors / FP8 scales, GPTQ and AWQ's packed codes, bitsandbytes' states."""
LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude")
_SHOWN = 3


def _merge_advice(folder: Path, base: str | None) -> str:
    base_model = f"the base model ({base})" if base else "the base model it was trained on"
    return (
        f"merge the adapter into {base_model} with peft and save the result: "
        f"PeftModel.from_pretrained(base_model, '{folder}').merge_and_unload()"
        ".save_pretrained(MERGED_DIR), copy the tokenizer files beside it, and point "
        f"{option('model')} at MERGED_DIR"
    )


def adapter_problem(folder: Path) -> str | None:
    """Why a folder holding a PEFT adapter cannot be exported as it is, or None."""
    found = [name for name in ADAPTER_FILES if (folder / name).is_file()]
    if not found:
        return None
    base = None
    try:
        data = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        pass  # a broken adapter config is no reason to hide the advice
    return (
        f"'{folder}' holds a PEFT adapter ({', '.join(found)}): the export needs a whole "
        f"model with the adapter's weights in it, not the adapter beside it. To export it, "
        + _merge_advice(folder, base if isinstance(base, str) else None)
    )


def no_safetensors_problem(folder: Path) -> str:
    """Why a folder without ``*.safetensors`` files has no weights the export reads."""
    pickles = sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)})
    others = [
        f"{name} ({kind})" for name, kind in OTHER_FORMATS.items() if (folder / name).is_file()
    ]
    gguf = sorted(p.name for p in folder.glob("*.gguf"))
    if pickles:
        shown = ", ".join(pickles[:_SHOWN]) + (" ..." if len(pickles) > _SHOWN else "")
        return (
            f"'{folder}' holds PyTorch pickle weights ({shown}), which the export does not "
            "read (unpickling can run arbitrary code). Convert them to safetensors with "
            f"transformers: load the model with from_pretrained('{folder}') (the class named "
            "in config.json's 'architectures'), save it with save_pretrained(NEW_DIR) "
            "(transformers 5 writes safetensors; older releases need "
            f"safe_serialization=True), and point {option('model')} at NEW_DIR"
        )
    if others or gguf:
        return (
            f"'{folder}' holds {', '.join(others + gguf)}, not safetensors weights: the export "
            "reads Hugging Face safetensors checkpoints. Use the model's safetensors release "
            "(or load it in transformers and save_pretrained it)"
        )
    return (
        f"'{folder}' has no .safetensors files; export needs safetensors weights "
        f"(or use {option('random_weights')} for an architecture-only package)"
    )


def _quant_named(key: str) -> bool:
    parts = key.split(".")
    return any(p in QUANT_PARTS or p.startswith("quant_state") for p in parts)


def _lora_named(key: str) -> bool:
    return any(p.startswith(LORA_PARTS) for p in key.split("."))


def _examples(keys: list[str]) -> str:
    shown = ", ".join(f"'{k}'" for k in keys[:_SHOWN])
    return shown + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


def quantized_problem(
    folder: Path,
    config: Mapping[str, Any],
    codes: Mapping[str, str],
    extra: Iterable[str],
) -> str | None:
    """Why a checkpoint whose tensors do not match its config is a pre-quantized one, or
    None when nothing says it is.

    Args:
        folder: The checkpoint folder (for the message).
        config: Its config.json.
        codes: Safetensors dtype codes of the tensors the export reads, by name.
        extra: Names of the tensors the export does not know.
    """
    extra = list(extra)
    signs = []
    quant = config.get("quantization_config")
    if quant is None and isinstance(config.get("text_config"), Mapping):
        quant = config["text_config"].get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, Mapping) else None
        said = f" (quant_method '{method}')" if isinstance(method, str) else ""
        signs.append(f"config.json has a quantization_config{said}")
    fp8 = sorted(name for name, code in codes.items() if code in FP8_CODES)
    if fp8:
        kinds = sorted({codes[name] for name in fp8})
        signs.append(f"{len(fp8)} weight(s) are stored as {'/'.join(kinds)}, e.g. '{fp8[0]}'")
    sidecars = sorted(k for k in extra if _quant_named(k))
    if sidecars:
        signs.append(f"{len(sidecars)} quantizer tensor(s) such as {_examples(sidecars)}")
    if not signs:
        return None
    return (
        f"'{folder}' is a pre-quantized checkpoint: {'; '.join(signs)}. The export reads "
        "float weights (bf16, fp16 or fp32) and quantizes them itself: point "
        f"{option('model')} at the model's original float checkpoint (its unquantized "
        f"release), and pass {option('weight_bits', '4')} (or 8) to quantize the package"
    )


def lora_problem(folder: Path, extra: Iterable[str]) -> str | None:
    """Why a checkpoint with LoRA tensors among its unknown ones cannot be exported, or None."""
    lora = sorted(k for k in extra if _lora_named(k))
    if not lora:
        return None
    return (
        f"'{folder}' holds {len(lora)} LoRA adapter tensor(s) such as {_examples(lora)}: "
        "the export needs the adapter merged into the model's own weights. "
        + _merge_advice(folder, None)
    )
