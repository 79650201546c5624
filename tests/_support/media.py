"""Media files for tests, written without imaging or audio libraries: PNG (zlib) and WAV."""

from __future__ import annotations

import struct
import wave
import zlib
from pathlib import Path

import numpy as np


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


def read_wav(path: Path) -> np.ndarray:
    """The samples of a mono 16-bit WAV as float32 in [-1, 1)."""
    with wave.open(str(path), "rb") as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0
