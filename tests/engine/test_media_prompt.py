"""Prompts with images / audio: files and markers checked before any model is loaded."""

from __future__ import annotations

import struct
import wave
import zlib
from pathlib import Path

import numpy as np
import pytest

from engine.errors import OptionsError
from engine.runtime.media import AUDIO_MARKER, IMAGE_MARKER, MediaPrompt


def write_png(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """An RGB PNG written with zlib alone (no imaging library needed)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return path


def write_wav(path: Path, seconds: float, rate: int = 16_000, seed: int = 0) -> Path:
    """A mono 16-bit WAV of a chirp plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    signal = 0.3 * np.sin(2 * np.pi * (200 + 400 * t) * t) + 0.02 * rng.normal(size=t.size)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def test_missing_markers_are_added_in_front(tmp_path: Path) -> None:
    image = write_png(tmp_path / "a.png", 32, 32)
    clip = write_wav(tmp_path / "a.wav", 0.5)
    prompt = MediaPrompt.build("What is this?", (str(image), str(image)), (str(clip),))
    assert prompt.text == IMAGE_MARKER * 2 + AUDIO_MARKER + "What is this?"
    assert prompt.describe() == "2 image(s) and 1 audio clip(s)"


def test_more_markers_than_images_is_refused(tmp_path: Path) -> None:
    image = write_png(tmp_path / "a.png", 32, 32)
    with pytest.raises(OptionsError, match="give one file per marker"):
        MediaPrompt.build(f"{IMAGE_MARKER} and {IMAGE_MARKER}", (str(image),))


def test_a_file_that_is_not_an_image_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(OptionsError, match="is not an image file genai can read"):
        MediaPrompt.build(None, (str(text),))
    with pytest.raises(OptionsError, match="does not exist"):
        MediaPrompt.build(None, (), (str(tmp_path / "missing.wav"),))
