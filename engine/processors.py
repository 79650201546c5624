"""Image and audio preprocessing settings, from the checkpoint to onnxruntime-genai.

A Hugging Face Gemma 4 checkpoint describes its processors in ``processor_config.json``
(``image_processor`` and ``feature_extractor`` blocks; older layouts use a flat
``preprocessor_config.json``). onnxruntime-genai 0.18 reads its own schemas: a
``processor.transforms`` list for images (``DecodeImage`` then ``Gemma4ImageTransform``)
and a ``feature_extraction.sequence`` for audio (``AudioDecoder`` then ``Gemma4LogMel``).
Settings genai cannot reproduce are refused rather than silently changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import SpecError

IMAGE_CONFIG_FILE = "processor_config.json"
AUDIO_CONFIG_FILE = "audio_processor_config.json"
MAX_SOFT_TOKENS = (70, 140, 280, 560, 1120)
"""Image token budgets the Gemma 4 image processor accepts."""


@dataclass(frozen=True)
class ImageProcessing:
    """How an image becomes patches (transformers' Gemma4ImageProcessor settings)."""

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3

    def genai_json(self) -> dict[str, Any]:
        return {
            "processor": {
                "name": "gemma4_image_processor",
                "transforms": [
                    _operation("decode_image", "DecodeImage", {"color_space": "RGB"}),
                    _operation(
                        "gemma4_image_transform",
                        "Gemma4ImageTransform",
                        {
                            "patch_size": self.patch_size,
                            "max_soft_tokens": self.max_soft_tokens,
                            "pooling_kernel_size": self.pooling_kernel_size,
                        },
                    ),
                ],
            }
        }


@dataclass(frozen=True)
class AudioProcessing:
    """How a waveform becomes log-mel features (Gemma4AudioFeatureExtractor settings)."""

    feature_size: int = 128
    sampling_rate: int = 16_000
    frame_length_ms: float = 20.0
    hop_length_ms: float = 10.0
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    preemphasis: float = 0.0
    preemphasis_htk_flavor: bool = True
    fft_overdrive: bool = False
    mel_floor: float = 1e-3

    def genai_json(self) -> dict[str, Any]:
        attrs = {
            "feature_size": self.feature_size,
            "sampling_rate": self.sampling_rate,
            "frame_length_ms": self.frame_length_ms,
            "hop_length_ms": self.hop_length_ms,
            "min_frequency": self.min_frequency,
            "max_frequency": self.max_frequency,
            "preemphasis": self.preemphasis,
            "preemphasis_htk_flavor": int(self.preemphasis_htk_flavor),
            "fft_overdrive": int(self.fft_overdrive),
            "mel_floor": self.mel_floor,
        }
        return {
            "feature_extraction": {
                "sequence": [
                    _operation("audio_decoder", "AudioDecoder"),
                    _operation("gemma4_log_mel", "Gemma4LogMel", attrs),
                ]
            }
        }


def _operation(name: str, kind: str, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {"name": name, "type": kind}
    if attrs is not None:
        operation["attrs"] = attrs
    return {"operation": operation}


def read_processing(model_dir: Path | None) -> tuple[ImageProcessing, AudioProcessing]:
    """The checkpoint's processor settings (transformers' defaults where it has none)."""
    image, audio = _blocks(model_dir)
    return _image(image, model_dir), _audio(audio, model_dir)


def _blocks(model_dir: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    if model_dir is None:
        return {}, {}
    combined = _read(model_dir / "processor_config.json")
    image = combined.get("image_processor") if isinstance(combined, dict) else None
    audio = combined.get("feature_extractor") if isinstance(combined, dict) else None
    flat = _read(model_dir / "preprocessor_config.json")
    if image is None and isinstance(flat, dict) and "patch_size" in flat:
        image = flat
    if audio is None and isinstance(flat, dict) and "feature_size" in flat:
        audio = flat
    return (image if isinstance(image, dict) else {}), (audio if isinstance(audio, dict) else {})


def _read(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc


def _number(block: dict[str, Any], key: str, default: Any, origin: str) -> Any:
    value = block.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{origin}: '{key}' must be a number, got {value!r}")
    return value


def _image(block: dict[str, Any], model_dir: Path | None) -> ImageProcessing:
    origin = f"{model_dir}/processor_config.json (image_processor)"
    settings = ImageProcessing(
        patch_size=int(_number(block, "patch_size", 16, origin)),
        max_soft_tokens=int(_number(block, "max_soft_tokens", 280, origin)),
        pooling_kernel_size=int(_number(block, "pooling_kernel_size", 3, origin)),
    )
    if settings.max_soft_tokens not in MAX_SOFT_TOKENS:
        raise SpecError(
            f"{origin}: max_soft_tokens {settings.max_soft_tokens} is not one of "
            f"{', '.join(map(str, MAX_SOFT_TOKENS))}"
        )
    mean, std = block.get("image_mean", [0, 0, 0]), block.get("image_std", [1, 1, 1])
    if block.get("do_normalize") and (list(mean) != [0, 0, 0] or list(std) != [1, 1, 1]):
        raise SpecError(
            f"{origin}: image normalization (mean {mean}, std {std}) is not supported by "
            "onnxruntime-genai's Gemma 4 image transform"
        )
    return settings


def _audio(block: dict[str, Any], model_dir: Path | None) -> AudioProcessing:
    origin = f"{model_dir}/processor_config.json (feature_extractor)"
    rate = int(_number(block, "sampling_rate", 16_000, origin))
    for key, neutral in (("dither", 0.0), ("input_scale_factor", 1.0)):
        value = _number(block, key, neutral, origin)
        if value != neutral:
            raise SpecError(
                f"{origin}: {key} {value} is not supported by onnxruntime-genai's "
                f"Gemma4LogMel (it assumes {neutral})"
            )
    for key in ("per_bin_mean", "per_bin_stddev"):
        if block.get(key) is not None:
            raise SpecError(f"{origin}: {key} is not supported by onnxruntime-genai's Gemma4LogMel")
    frame = _number(block, "frame_length", None, origin)
    hop = _number(block, "hop_length", None, origin)
    return AudioProcessing(
        feature_size=int(_number(block, "feature_size", 128, origin)),
        sampling_rate=rate,
        frame_length_ms=float(
            frame * 1000 / rate if frame else _number(block, "frame_length_ms", 20.0, origin)
        ),
        hop_length_ms=float(
            hop * 1000 / rate if hop else _number(block, "hop_length_ms", 10.0, origin)
        ),
        min_frequency=float(_number(block, "min_frequency", 0.0, origin)),
        max_frequency=float(_number(block, "max_frequency", 8000.0, origin)),
        preemphasis=float(_number(block, "preemphasis", 0.0, origin)),
        preemphasis_htk_flavor=bool(block.get("preemphasis_htk_flavor", True)),
        fft_overdrive=bool(block.get("fft_overdrive", False)),
        mel_floor=float(_number(block, "mel_floor", 1e-3, origin)),
    )
