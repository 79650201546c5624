"""Images and clips a package's processors and encoder sessions can take, checked from
the files' headers before any model is loaded.

Measured with onnxruntime-genai 0.18 on tiny multimodal packages (tests/engine/
test_run_input_checks.py):

- Audio: ``Gemma4LogMel`` makes ``floor((samples - frame / 2 - 1) / hop) + 1`` frames
  and divides by that count, so a clip of half a frame or less kills the process with
  SIGFPE: 160 samples at 16 kHz with Gemma 4's 20 ms frames (measured again with 32 ms
  frames and 8 ms hops: 256 crash, 257 run). One frame (161 samples) is enough for the
  speech session and for transformers. The limit applies after resampling (441 samples
  at 44.1 kHz crash, 442 run); the decoder only downsamples, so a clip sampled below the
  processor's rate is an error too.
- Images: ``Gemma4ImageTransform`` resizes exactly as transformers'
  ``get_aspect_ratio_preserving_size``; a thin image becomes one pooling block
  (3 patches) wide and up to ``max_soft_tokens`` blocks long, and the vision tower has
  position embeddings for ``position_embedding_size`` patches per side only (64 in the
  tiny model: a 2x4000 image needs 210), past which onnxruntime fails on a Gather and
  transformers raises ``IndexError``. Every image of at least one pixel is resized to at
  least one block, so there is no minimum size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import OptionsError
from engine.runtime.media_files import audio_info, image_size

if TYPE_CHECKING:
    from engine.runtime.package import Package

_POSITION_TABLE = "position_embedding_table"


def check_media_fits(
    package: Package, images: Sequence[Path] = (), audios: Sequence[Path] = ()
) -> None:
    """Refuse an image or clip the package's processors or encoders cannot take.

    Raises:
        OptionsError: Naming the file, what is wrong with it and what to do.
    """
    model = package.config.get("model") or {}
    if images:
        transform = _operation(package.path, model.get("vision"), "Gemma4ImageTransform")
        positions = _vision_positions(package.path, model.get("vision"))
        if transform is not None:
            for path in images:
                _check_image(path, transform, positions)
    if audios:
        mel = _operation(package.path, model.get("speech"), "Gemma4LogMel")
        if mel is not None:
            for path in audios:
                _check_audio(path, mel)


def resized_grid(
    width: int, height: int, patch: int, max_patches: int, kernel: int
) -> tuple[int, int]:
    """Patches across and down after the processor's resize (transformers'
    ``get_aspect_ratio_preserving_size``, which genai's ``Gemma4ImageTransform`` matches)."""
    factor = math.sqrt(max_patches * patch**2 / (width * height))
    block = kernel * patch
    target_h = math.floor(factor * height / block) * block
    target_w = math.floor(factor * width / block) * block
    longest = (max_patches // kernel**2) * block
    if target_h == 0:
        target_h, target_w = block, min(math.floor(width / height) * block, longest)
    elif target_w == 0:
        target_h, target_w = min(math.floor(height / width) * block, longest), block
    return target_w // patch, target_h // patch


def _check_image(path: Path, attrs: Mapping[str, Any], positions: int | None) -> None:
    size = image_size(path)
    if size is None or positions is None:
        return
    patch = int(attrs.get("patch_size", 16))
    kernel = int(attrs.get("pooling_kernel_size", 3))
    max_patches = int(attrs.get("max_soft_tokens", 280)) * kernel**2
    across, down = resized_grid(size.width, size.height, patch, max_patches, kernel)
    if max(across, down) > positions:
        raise OptionsError(
            f"image '{path}' ({size.width}x{size.height} pixels) is too elongated for this "
            f"package: its processor resizes it to {across}x{down} patches, and the vision "
            f"tower has positions for {positions} patches per side; crop or pad it closer "
            "to square"
        )


def _check_audio(path: Path, attrs: Mapping[str, Any]) -> None:
    info = audio_info(path)
    if info is None:
        return
    rate = int(attrs.get("sampling_rate", 16000))
    half_frame = round(rate * float(attrs.get("frame_length_ms", 20.0)) / 2000)
    if info.rate < rate:
        raise OptionsError(
            f"audio clip '{path}' is sampled at {info.rate} Hz; onnxruntime-genai's audio "
            f"processor only downsamples, to {rate} Hz: resample the clip to {rate} Hz or more"
        )
    # Half a frame or less makes no log-mel frame, and genai divides by the frame count.
    if info.frames is not None and info.frames * rate <= half_frame * info.rate:
        least = half_frame * info.rate // rate + 1
        raise OptionsError(
            f"audio clip '{path}' is {info.frames} samples at {info.rate} Hz "
            f"({1000 * info.frames / info.rate:.1f} ms); the package's audio processor needs "
            f"more than {1000 * half_frame / rate:g} ms (at least {least} samples at "
            f"{info.rate} Hz): give a longer clip"
        )


def _operation(folder: Path, section: Any, kind: str) -> Mapping[str, Any] | None:
    """The attrs of the ``kind`` operation in a session's processor file (None when the
    package has no such file: nothing to check against)."""
    if not isinstance(section, Mapping) or not isinstance(section.get("config_filename"), str):
        return None
    try:
        data = json.loads((folder / section["config_filename"]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # genai reports an unreadable processor file itself, by name
    found: list[Mapping[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if node.get("type") == kind and isinstance(node.get("attrs", {}), Mapping):
                found.append(node.get("attrs", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    return found[0] if found else None


def _vision_positions(folder: Path, section: Any) -> int | None:
    """Patches per side the vision session has position embeddings for: the middle
    dimension of its ``[2, positions, hidden]`` table, read from the graph without its
    weights (None when onnx is missing or the table is not found)."""
    if not isinstance(section, Mapping) or not isinstance(section.get("filename"), str):
        return None
    try:
        import onnx
    except ImportError:
        return None
    try:
        proto = onnx.load(str(folder / section["filename"]), load_external_data=False)
    except Exception:  # open_package has read it already; a failure here is not ours to word
        return None
    for tensor in proto.graph.initializer:
        if tensor.name.endswith(_POSITION_TABLE) and len(tensor.dims) == 3:
            return int(tensor.dims[1])
    return None
