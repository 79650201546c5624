"""Images, audio clips and the text of a benchmark prompt for a multimodal package.

The image field takes one file or several separated by ``;`` (its picker selects several
at once; what it picked is kept as picked, so a name with ``;`` in it survives); they go into
the prompt in that order. The audio field takes one clip: onnxruntime-genai 0.18 takes one per
prompt.

Each picker is enabled only where the package has the session that reads it (vision for
images, speech for audio) and onnxruntime-genai is installed; otherwise it is disabled with
the reason as its tooltip. Layout and wiring only: the files are checked by the engine
(``engine.runtime.media.MediaPrompt``) when the benchmark starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QGridLayout, QLabel, QLineEdit, QPushButton, QWidget

from app.package_jobs import PackageFacts

KINDS = {
    "image": (
        "&Image",
        "Images (PNG, JPEG, GIF or BMP; several separated by ;) sent with the prompt: the "
        "time to first token then includes the vision session.",
        "Images (*.png *.jpg *.jpeg *.gif *.bmp)",
    ),
    "audio": (
        "Au&dio",
        "One audio clip (WAV, FLAC or MP3; onnxruntime-genai takes one per prompt) sent with "
        "the prompt: the time to first token then includes the speech session.",
        "Audio (*.wav *.flac *.mp3)",
    ),
}
SEVERAL = {"image": True, "audio": False}
"""Whether a field takes several files (genai 0.18 takes one audio clip per prompt)."""
SEPARATOR = "; "
PROMPT_HELP = (
    "The text sent with the image and audio; markers for them are added at its start when "
    "it has none. Empty: “Describe what you see and hear.”"
)


class MediaInputs(QWidget):
    """Image and audio pickers and the prompt text; ``changed`` when any of them changes."""

    changed = Signal()

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.paths: dict[str, QLineEdit] = {}
        self.browse: dict[str, QPushButton] = {}
        self._picked: dict[str, tuple[str, ...]] = {}
        """What each picker chose, kept while its field still shows exactly that."""
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        for column, (kind, (label, help_text, _)) in enumerate(KINDS.items()):
            edit = QLineEdit()
            edit.setPlaceholderText("none")
            files = "files" if SEVERAL[kind] else "file"
            edit.setAccessibleName(f"{label.replace('&', '')} {files}")
            edit.setAccessibleDescription(help_text)
            button = QPushButton("…")
            button.setAccessibleName(f"Choose {kind} {files}")
            button.setMaximumWidth(32)
            button.clicked.connect(lambda _=False, k=kind: self._choose(k))
            edit.textChanged.connect(self.changed)
            buddy = QLabel(label)
            buddy.setBuddy(edit)
            grid.addWidget(buddy, 0, column * 3)
            grid.addWidget(edit, 0, column * 3 + 1)
            grid.addWidget(button, 0, column * 3 + 2)
            grid.setColumnStretch(column * 3 + 1, 1)
            self.paths[kind], self.browse[kind] = edit, button
        self.prompt = QLineEdit()  # on the same row: a small window keeps its chart height
        self.prompt.setPlaceholderText("Describe what you see and hear.")
        self.prompt.setToolTip(PROMPT_HELP)
        self.prompt.setAccessibleName("Prompt text")
        prompt_label = QLabel("Pro&mpt text")
        prompt_label.setBuddy(self.prompt)
        grid.addWidget(prompt_label, 0, 6)
        grid.addWidget(self.prompt, 0, 7)
        grid.setColumnStretch(7, 1)
        self.set_facts(None)

    @property
    def images(self) -> tuple[Path, ...]:
        return self._files("image")

    @property
    def audios(self) -> tuple[Path, ...]:
        return self._files("audio")

    @property
    def text(self) -> str | None:
        return self.prompt.text().strip() or None

    @property
    def any(self) -> bool:
        """An image or an audio clip is chosen."""
        return bool(self.images or self.audios)

    def set_facts(self, facts: PackageFacts | None) -> None:
        """Enable the pickers the package can take; the others say why not."""
        for kind, (_, help_text, _) in KINDS.items():
            problem = (
                "choose a package folder first" if facts is None else facts.media_problem(kind)
            )
            for widget in (self.paths[kind], self.browse[kind]):
                widget.setEnabled(problem is None)
            self.paths[kind].setToolTip(f"Not available: {problem}" if problem else help_text)
            self.browse[kind].setToolTip(
                f"Not available: {problem}"
                if problem
                else f"Choose one or more {kind} files"
                if SEVERAL[kind]
                else f"Choose an {kind} file"
            )
        self.prompt.setEnabled(facts is not None and bool(facts.media))
        self.prompt.setToolTip(
            PROMPT_HELP
            if facts is not None and facts.media
            else "Not available: the package takes text only (its prompt is random tokens)"
        )
        self.changed.emit()

    def _files(self, kind: str) -> tuple[Path, ...]:
        """The field's files: as picked while the field shows the pick; else its text, as one
        path where it takes one (or names one existing file), else split at ``;``."""
        edit = self.paths[kind]
        if not edit.isEnabled():
            return ()
        text = edit.text()
        picked = self._picked.get(kind)
        if picked is not None and text == SEPARATOR.join(picked):
            return tuple(Path(p) for p in picked)
        whole = Path(text.strip()).expanduser()
        if not SEVERAL[kind] or whole.is_file():
            return (whole,) if text.strip() else ()
        return tuple(Path(p.strip()).expanduser() for p in text.split(";") if p.strip())

    def _choose(self, kind: str) -> None:
        label, _, pattern = KINDS[kind]
        title = label.replace("&", "")
        if SEVERAL[kind]:
            paths, _ = QFileDialog.getOpenFileNames(self, title, "", pattern)
        else:
            path, _ = QFileDialog.getOpenFileName(self, title, "", pattern)
            paths = [path] if path else []
        if paths:
            self._picked[kind] = tuple(paths)
            self.paths[kind].setText(SEPARATOR.join(paths))


def media_words(kinds: tuple[str, ...]) -> str:
    """("image", "audio") -> "1 image and 1 audio clip"."""
    counts = [(kinds.count(k), word) for k, word in (("image", "image"), ("audio", "audio clip"))]
    return " and ".join(f"{n} {word}{'s' * (n > 1)}" for n, word in counts if n)
