"""Prompts with images / audio: files and markers checked before any model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import OptionsError
from engine.runtime.media import AUDIO_MARKER, IMAGE_MARKER, MediaPrompt
from tests._support.media import write_png, write_wav


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
