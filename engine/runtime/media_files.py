"""What image and audio files say about themselves, read from their headers alone.

Sizes and lengths are read without decoding (and without imaging or audio libraries), so
a file the processors cannot take is refused before any model is loaded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from engine.errors import OptionsError

_HEAD = 1 << 16
"""Bytes read from the start of a file: every header below fits (JPEG's frame header
follows its metadata segments, which are usually small)."""


@dataclass(frozen=True)
class ImageSize:
    width: int
    height: int


@dataclass(frozen=True)
class AudioInfo:
    """A clip's sample rate and length (``frames``: samples per channel; None = the
    header does not say, as for MP3)."""

    rate: int
    frames: int | None

    @property
    def seconds(self) -> float | None:
        return None if self.frames is None or self.rate <= 0 else self.frames / self.rate


def image_size(path: Path) -> ImageSize | None:
    """Width and height from a PNG, GIF, BMP or JPEG header (None: a JPEG whose frame
    header is not in the first 64 KiB).

    Raises:
        OptionsError: The header is truncated or gives an empty image.
    """
    head = _read_head(path)
    size: ImageSize | None
    if head.startswith(b"\x89PNG"):
        size = _unpack(path, ">II", head, 16, "PNG")
    elif head.startswith(b"GIF8"):
        size = _unpack(path, "<HH", head, 6, "GIF")
    elif head.startswith(b"BM"):
        found = _unpack(path, "<ii", head, 18, "BMP")
        size = ImageSize(abs(found.width), abs(found.height))  # negative height: top-down
    else:
        size = _jpeg_size(path, head)
    if size is not None and (size.width < 1 or size.height < 1):
        raise OptionsError(
            f"image '{path}' is {size.width}x{size.height} pixels, an empty image; give a "
            "picture with pixels in it"
        )
    return size


def audio_info(path: Path) -> AudioInfo | None:
    """Sample rate and length of a WAV or FLAC clip; the sample rate alone of an MP3
    (None when no MP3 frame header is found in its first 64 KiB).

    Raises:
        OptionsError: A WAV or FLAC header that is truncated or damaged.
    """
    head = _read_head(path)
    if head.startswith(b"RIFF"):
        return _wav_info(path, head)
    if head.startswith(b"fLaC"):
        if len(head) < 26:
            raise _damaged(path, "FLAC")
        # STREAMINFO: 20 bits of sample rate, 3 of channels, 5 of bits, 36 of samples.
        bits = int.from_bytes(head[18:26], "big")
        rate, total = bits >> 44, bits & ((1 << 36) - 1)
        return AudioInfo(rate=rate, frames=total or None)  # 0: not stated
    return _mp3_info(head)


def _read_head(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(_HEAD)
    except OSError as exc:
        raise OptionsError(f"cannot read '{path}': {exc.strerror or exc}") from exc


def _damaged(path: Path, kind: str) -> OptionsError:
    return OptionsError(
        f"'{path}' has a truncated or damaged {kind} header; save the file again or "
        "convert it to WAV"
    )


def _unpack(path: Path, fmt: str, head: bytes, offset: int, kind: str) -> ImageSize:
    if len(head) < offset + struct.calcsize(fmt):
        raise _damaged(path, kind)
    width, height = struct.unpack_from(fmt, head, offset)
    return ImageSize(int(width), int(height))


def _jpeg_size(path: Path, head: bytes) -> ImageSize | None:
    """The size in a JPEG's start-of-frame segment (any SOFn marker)."""
    at = 2
    while at + 9 <= len(head):
        if head[at] != 0xFF:
            raise _damaged(path, "JPEG")
        marker = head[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            at += 1 if marker == 0xFF else 2  # fill bytes and markers without a length
            continue
        length = int.from_bytes(head[at + 2 : at + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack_from(">HH", head, at + 5)
            return ImageSize(int(width), int(height))
        if length < 2:
            raise _damaged(path, "JPEG")
        at += 2 + length
    return None


def _wav_info(path: Path, head: bytes) -> AudioInfo:
    """A RIFF/WAVE file's rate and frames from its ``fmt `` and ``data`` chunks (any
    sample format: PCM, float, extensible)."""
    if head[8:12] != b"WAVE":
        raise _damaged(path, "WAV")
    at = 12
    channels = rate = block = 0
    while at + 8 <= len(head):
        kind, size = head[at : at + 4], int.from_bytes(head[at + 4 : at + 8], "little")
        if kind == b"fmt ":
            if at + 22 > len(head):
                break
            channels, rate = struct.unpack_from("<HI", head, at + 10)
            block = struct.unpack_from("<H", head, at + 20)[0]
        elif kind == b"data":
            if not (channels and rate and block):
                break
            # A streamed WAV may say 0 or 0xFFFFFFFF: the data runs to the end of the file.
            available = path.stat().st_size - (at + 8)
            data = available if size in (0, 0xFFFFFFFF) else min(size, available)
            return AudioInfo(rate=int(rate), frames=max(data, 0) // int(block))
        at += 8 + size + (size & 1)  # chunks are padded to even sizes
    raise _damaged(path, "WAV")


_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mp3_info(head: bytes) -> AudioInfo | None:
    """The sample rate of the first MPEG audio frame header after an ID3v2 tag."""
    at = 0
    if head.startswith(b"ID3") and len(head) >= 10:
        tag = head[6:10]
        at = 10 + ((tag[0] << 21) | (tag[1] << 14) | (tag[2] << 7) | tag[3])
    for i in range(at, len(head) - 3):
        if head[i] != 0xFF or head[i + 1] & 0xE0 != 0xE0:
            continue
        version, rate_index = (head[i + 1] >> 3) & 3, (head[i + 2] >> 2) & 3
        if version in _MP3_RATES and rate_index < 3:
            return AudioInfo(rate=_MP3_RATES[version][rate_index], frames=None)
    return None
