"""Prompts that carry images or audio: the files, checked before any model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.caps import get_caps
from engine.errors import OptionsError, option
from engine.runtime.limits import sequence_limit
from engine.runtime.media_fit import check_media_fits
from engine.runtime.session import one_line

if TYPE_CHECKING:
    from engine.runtime.package import Package

IMAGE_MARKER = "<|image|>"
AUDIO_MARKER = "<|audio|>"
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM")
_AUDIO_MAGIC = (b"RIFF", b"fLaC", b"ID3", b"\xff\xfb", b"OggS")


@dataclass(frozen=True)
class MediaPrompt:
    """A text prompt with images and / or audio clips, run through genai's processors.

    Each image needs an ``<|image|>`` marker and each clip an ``<|audio|>`` marker in
    ``text``; missing markers are added at the start (as genai's processor does), and a
    prompt with more markers than files is refused.
    """

    text: str
    images: tuple[Path, ...] = ()
    audios: tuple[Path, ...] = ()

    @classmethod
    def build(
        cls, text: str | None, images: tuple[str, ...] = (), audios: tuple[str, ...] = ()
    ) -> MediaPrompt:
        prompt = cls(
            text if text is not None else "Describe what you see and hear.",
            tuple(Path(p).expanduser() for p in images),
            tuple(Path(p).expanduser() for p in audios),
        )
        prompt._check_files()
        missing_images = len(prompt.images) - prompt.text.count(IMAGE_MARKER)
        missing_audios = len(prompt.audios) - prompt.text.count(AUDIO_MARKER)
        if missing_images < 0 or missing_audios < 0:
            raise OptionsError(
                f"the prompt has {prompt.text.count(IMAGE_MARKER)} {IMAGE_MARKER} and "
                f"{prompt.text.count(AUDIO_MARKER)} {AUDIO_MARKER} markers for "
                f"{len(prompt.images)} image(s) and {len(prompt.audios)} clip(s); "
                "give one file per marker"
            )
        head = IMAGE_MARKER * missing_images + AUDIO_MARKER * missing_audios
        return cls(head + prompt.text, prompt.images, prompt.audios)

    def process(self, og: Any, model: Any) -> Any:
        """genai's own processor output for this prompt (``og``: the onnxruntime_genai
        module, ``model``: an ``og.Model``); a file it cannot decode is a clear error."""
        processor = model.create_multimodal_processor()
        try:
            images = og.Images.open(*map(str, self.images)) if self.images else None
            audios = og.Audios.open(*map(str, self.audios)) if self.audios else None
            return processor(self.text, images=images, audios=audios)
        except Exception as exc:  # genai raises RuntimeError for everything
            files = ", ".join(str(p) for p in (*self.images, *self.audios))
            raise OptionsError(
                f"onnxruntime-genai could not read {files}: {one_line(exc)}; check that the "
                "files are complete images (PNG / JPEG) and WAV audio"
            ) from exc

    @staticmethod
    def array(tensor: Any) -> Any:
        """A numpy array of one of genai's processor outputs (``og.Tensor``)."""
        import numpy as np

        return tensor.as_numpy() if hasattr(tensor, "as_numpy") else np.asarray(tensor)

    @property
    def kinds(self) -> tuple[str, ...]:
        """One entry per file: ``image`` or ``audio``."""
        return ("image",) * len(self.images) + ("audio",) * len(self.audios)

    def files(self) -> str:
        """The files' names, comma-separated (for messages)."""
        return ", ".join(p.name for p in (*self.images, *self.audios))

    def describe(self) -> str:
        parts = [f"{len(self.images)} image(s)"] if self.images else []
        parts += [f"{len(self.audios)} audio clip(s)"] if self.audios else []
        return " and ".join(parts) or "no media"

    def check(self, package: Package) -> None:
        """The package has the sessions these files need, and its processors and encoders
        can take the files (sizes and lengths from the files' headers)."""
        wanted = (["image"] if self.images else []) + (["audio"] if self.audios else [])
        missing = [kind for kind in wanted if kind not in package.media]
        if missing:
            has = ", ".join(package.media) or "text only"
            raise OptionsError(
                f"{package.path.name} cannot take {' or '.join(missing)} input (it has: {has}); "
                "export the checkpoint with that tower"
            )
        if len(self.audios) > 1:
            raise OptionsError("onnxruntime-genai takes one audio clip per prompt")
        caps = get_caps(package.ep)
        if caps.genai_max_images is not None and len(self.images) > caps.genai_max_images:
            raise OptionsError(
                f"onnxruntime-genai 0.18 crashes on a {caps.display_name} package given more "
                f"than {caps.genai_max_images} image(s) in one prompt; give one image per "
                "prompt, or run the CPU package"
            )
        check_media_fits(package, self.images, self.audios)

    def _check_files(self) -> None:
        for kind, paths, magic in (
            ("image", self.images, _IMAGE_MAGIC),
            ("audio", self.audios, _AUDIO_MAGIC),
        ):
            for path in paths:
                if not path.is_file():
                    raise OptionsError(f"{kind} file '{path}' does not exist")
                with path.open("rb") as f:
                    head = f.read(16)
                if not head.startswith(magic):
                    raise OptionsError(
                        f"'{path}' is not an {kind} file genai can read "
                        f"({'PNG, JPEG, GIF or BMP' if kind == 'image' else 'WAV, FLAC or MP3'})"
                    )


def check_processed_length(
    package: Package, media: MediaPrompt, prompt_length: int, new: int, new_option: str
) -> None:
    """The prompt genai's processor made of ``media`` plus ``new`` tokens (set by the
    option ``new_option``, as option markup) fits the package; checked before the
    first run.

    Raises:
        OptionsError: It does not fit, with the numbers.
    """
    limit = sequence_limit(package)
    if limit and prompt_length + new > limit:
        raise OptionsError(
            f"the prompt with {media.describe()} is {prompt_length} tokens after genai's "
            f"processor; with {new} new tokens that is {prompt_length + new}, more than the "
            f"{limit} this package supports; choose a smaller {new_option}, fewer files, "
            f"or rebuild the package with a longer {option('max_length')}"
        )
