"""Where the model comes from: a built-in preset, a checkpoint folder, or the HF cache (no Qt)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

SourceKind = Literal["preset", "folder", "cache"]
DEFAULT_PRESET = "gemma4-tiny"


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: a built-in preset, a checkpoint folder, or a folder in
    the Hugging Face cache."""

    kind: SourceKind
    value: str
    """The preset name, or the folder path."""
    label: str = ""

    @property
    def is_preset(self) -> bool:
        return self.kind == "preset"

    @property
    def display(self) -> str:
        if self.label:
            return self.label
        return f"preset {self.value}" if self.is_preset else Path(self.value).name

    def export_args(self) -> dict[str, str]:
        """``model_dir=`` or ``preset=`` for :func:`engine.pipeline.export`."""
        return {"preset": self.value} if self.is_preset else {"model_dir": self.value}

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelSource | None:
        try:
            data = json.loads(text)
            if data.get("kind") in ("preset", "folder", "cache"):
                return cls(data["kind"], str(data["value"]), str(data.get("label", "")))
        except (ValueError, TypeError, AttributeError, KeyError):
            pass
        return None
