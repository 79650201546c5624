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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import SpecError, option

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


def read_processing(
    model_dir: Path | None, *, image: bool = True, audio: bool = True
) -> tuple[ImageProcessing, AudioProcessing]:
    """The checkpoint's processor settings (transformers' defaults where it has none).

    ``image`` / ``audio``: whether the package has the tower that needs them. Only those
    are read, so a text-only export never opens (nor refuses) the processor files.
    """
    if model_dir is None or not (image or audio):
        return ImageProcessing(), AudioProcessing()
    files = _ProcessorFiles(model_dir)
    image_settings, audio_settings = ImageProcessing(), AudioProcessing()
    if image:
        image_settings = _image(files.block("image_processor", "patch_size"), model_dir)
    if audio:
        audio_settings = _audio(files.block("feature_extractor", "feature_size"), model_dir)
    return image_settings, audio_settings


class _ProcessorFiles:
    """``processor_config.json`` and the older flat ``preprocessor_config.json``, each
    read when a block is first looked for."""

    def __init__(self, model_dir: Path) -> None:
        self.combined_path = model_dir / IMAGE_CONFIG_FILE
        self.flat_path = model_dir / "preprocessor_config.json"
        self._read: dict[Path, dict[str, Any] | None] = {}

    def _data(self, path: Path) -> dict[str, Any] | None:
        if path not in self._read:
            self._read[path] = _read(path)
        return self._read[path]

    def block(self, key: str, marker: str) -> dict[str, Any]:
        """The combined file's ``key`` block, else the flat file when it has ``marker``."""
        combined = self._data(self.combined_path)
        block = None if combined is None else combined.get(key)
        if block is not None and not isinstance(block, dict):
            raise _unusable(self.combined_path, f"'{key}' must be an object, got {block!r}")
        if block is None:
            flat = self._data(self.flat_path)
            block = flat if flat is not None and marker in flat else None
        return block or {}


def _unusable(path: Path, problem: str) -> SpecError:
    return SpecError(
        f"{path}: {problem}. Copy {path.name} from the original checkpoint, or export "
        f"without the towers that need it ({option('modalities', 'text')})"
    )


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _unusable(path, f"cannot be read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _unusable(path, f"is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise _unusable(path, "is not a JSON object")
    return data


def _number(block: dict[str, Any], key: str, default: Any, origin: str) -> Any:
    value = block.get(key, default)
    if value is None:
        return default
    # Python's json reads NaN and Infinity literals: no processor setting means them.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{origin}: '{key}' must be a finite number, got {value!r}")
    return value


def _count(block: dict[str, Any], key: str, default: int, origin: str) -> int:
    """A size or a rate: a whole number of at least 1."""
    value = _number(block, key, default, origin)
    if value != int(value) or value < 1:
        raise SpecError(f"{origin}: '{key}' must be a whole number of at least 1, got {value!r}")
    return int(value)


def _numbers(block: dict[str, Any], key: str, default: list[float], origin: str) -> list[float]:
    value = block.get(key)
    if value is None:
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value] * 3  # transformers broadcasts one number to every channel
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise SpecError(f"{origin}: '{key}' must be a list of numbers, got {value!r}")
    return [float(v) for v in value]


def _image(block: dict[str, Any], model_dir: Path | None) -> ImageProcessing:
    origin = f"{model_dir}/processor_config.json (image_processor)"
    settings = ImageProcessing(
        patch_size=_count(block, "patch_size", 16, origin),
        max_soft_tokens=_count(block, "max_soft_tokens", 280, origin),
        pooling_kernel_size=_count(block, "pooling_kernel_size", 3, origin),
    )
    if settings.max_soft_tokens not in MAX_SOFT_TOKENS:
        raise SpecError(
            f"{origin}: max_soft_tokens {settings.max_soft_tokens} is not one of "
            f"{', '.join(map(str, MAX_SOFT_TOKENS))}"
        )
    mean = _numbers(block, "image_mean", [0.0, 0.0, 0.0], origin)
    std = _numbers(block, "image_std", [1.0, 1.0, 1.0], origin)
    if block.get("do_normalize") and (mean != [0, 0, 0] or std != [1, 1, 1]):
        raise SpecError(
            f"{origin}: image normalization (mean {mean}, std {std}) is not supported by "
            "onnxruntime-genai's Gemma 4 image transform"
        )
    return settings


def _audio(block: dict[str, Any], model_dir: Path | None) -> AudioProcessing:
    origin = f"{model_dir}/processor_config.json (feature_extractor)"
    rate = _count(block, "sampling_rate", 16_000, origin)
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
        feature_size=_count(block, "feature_size", 128, origin),
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
