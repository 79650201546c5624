"""The local Hugging Face hub cache, scanned for checkpoints the engine can export.

Nothing is ever downloaded: only snapshot folders already on disk that hold a
``config.json`` of a supported model type are listed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheEntry:
    """One snapshot of one cached repository."""

    repo_id: str
    revision: str
    path: Path
    model_type: str
    has_weights: bool

    @property
    def label(self) -> str:
        weights = "" if self.has_weights else " (no weights)"
        return f"{self.repo_id} @ {self.revision[:8]}{weights}"


def cache_roots(env: dict[str, str] | None = None) -> list[Path]:
    """Hub cache folders in the order huggingface_hub looks: HF_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub (existing ones, once each)."""
    env = dict(os.environ) if env is None else env
    candidates = []
    if env.get("HF_HUB_CACHE"):
        candidates.append(Path(env["HF_HUB_CACHE"]))
    if env.get("HF_HOME"):
        candidates.append(Path(env["HF_HOME"]) / "hub")
    if env.get("XDG_CACHE_HOME"):
        candidates.append(Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub")
    candidates.append(Path.home() / ".cache" / "huggingface" / "hub")
    seen: list[Path] = []
    for path in candidates:
        path = path.expanduser()
        if path.is_dir() and path.resolve() not in [s.resolve() for s in seen]:
            seen.append(path)
    return seen


def _model_type(config: Path) -> str | None:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    kind = data.get("model_type")
    return kind if isinstance(kind, str) else None


def scan_cache(roots: Iterable[Path] | None = None) -> list[CacheEntry]:
    """Supported checkpoints in the hub cache(s), sorted by repository."""
    from engine.models import supported_model_types

    entries = []
    for root in cache_roots() if roots is None else roots:
        for repo in sorted(Path(root).glob("models--*")):
            repo_id = repo.name.removeprefix("models--").replace("--", "/")
            for snapshot in sorted((repo / "snapshots").glob("*")):
                kind = _model_type(snapshot / "config.json")
                if kind not in supported_model_types():
                    continue
                weights = any(snapshot.glob("*.safetensors"))
                entries.append(CacheEntry(repo_id, snapshot.name, snapshot, kind, weights))
    return entries
