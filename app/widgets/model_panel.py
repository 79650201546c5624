"""Model: a built-in preset, a local checkpoint folder, or a checkpoint in the HF cache."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.state import ModelSource, StudioState
from app.widgets.messages import MessageLabel
from app.wording import CONTROLS
from app.workers import start_worker
from resources import resource_path

KINDS = (("preset", "&Preset"), ("folder", "Fol&der"), ("cache", "HF &cache"))
KIND_TIPS = (
    "A built-in architecture (no weights: packages get seeded random ones)",
    "A Hugging Face checkpoint folder on disk (config.json + *.safetensors)",
    "A checkpoint already in the local Hugging Face cache (nothing is downloaded)",
)


def preset_choices() -> list[tuple[str, str]]:
    """(name, description) of the built-in presets, read without importing the engine."""
    out = []
    for path in sorted(resource_path("presets").glob("*.json")):
        try:
            comment = str(json.loads(path.read_text(encoding="utf-8")).get("_comment", ""))
        except (OSError, ValueError):
            comment = ""
        out.append((path.stem, comment))
    return out


class ModelPanel(QGroupBox):
    """Chooses ``state.source`` and shows the model's spec summary."""

    cacheScanned = Signal(int)

    def __init__(self, state: StudioState, recent: list[ModelSource], parent: Any = None):
        super().__init__("1  Model", parent)
        self._state = state
        self._syncing = False
        self.kind_buttons = QButtonGroup(self)
        kinds = QHBoxLayout()
        for i, (_, label) in enumerate(KINDS):
            button = QRadioButton(label)
            button.setToolTip(KIND_TIPS[i])
            self.kind_buttons.addButton(button, i)
            kinds.addWidget(button)
        kinds.addStretch(1)

        self.presets = QComboBox()
        self._preset_notes = dict(preset_choices())
        self.presets.addItems(list(self._preset_notes))
        self.presets.setPlaceholderText("choose a preset")
        self.presets.setToolTip(CONTROLS["preset"].help)
        self.presets.setAccessibleName("Preset")
        self.preset_note = MessageLabel()
        self.folder = QLineEdit()
        self.folder.setPlaceholderText("a folder with config.json + *.safetensors")
        self.folder.setToolTip(CONTROLS["model"].help)
        self.folder.setAccessibleName("Model folder")
        browse = QPushButton("Browse…")
        browse.setToolTip("Choose a checkpoint folder (Ctrl+O)")
        self.cache = QComboBox()
        self.cache.setPlaceholderText("press Scan")
        self.cache.setToolTip("Checkpoints found in the local Hugging Face cache")
        self.cache.setAccessibleName("Cached checkpoint")
        self.scan_button = QPushButton("Scan")
        self.scan_button.setToolTip("List supported checkpoints in the local cache (no download)")
        self.cache_note = MessageLabel(
            "Scans ~/.cache/huggingface/hub (and HF_HOME); never downloads."
        )

        self.stack = QStackedWidget()
        self.stack.addWidget(_column(self.presets, self.preset_note))
        self.stack.addWidget(_column(_row(self.folder, browse)))
        self.stack.addWidget(_column(_row(self.cache, self.scan_button), self.cache_note))

        self.recent = QComboBox()
        self.recent.setToolTip("Models you exported before")
        self.recent.setAccessibleName("Recent models")
        self.recent.addItem("Recent models…")
        for source in recent:
            self.recent.addItem(source.display, source)
        self.summary = MessageLabel()
        self.summary.setAccessibleName("Model summary")

        layout = QVBoxLayout(self)
        layout.addLayout(kinds)
        layout.addWidget(self.stack)
        layout.addWidget(self.recent)
        layout.addWidget(self.summary)

        for combo in (self.presets, self.cache, self.recent):  # long entries must not widen
            combo.setSizeAdjustPolicy(  # the left column past a small window
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            combo.setMinimumContentsLength(14)
        self.kind_buttons.idClicked.connect(self._kind_clicked)
        self.presets.currentTextChanged.connect(self._preset_chosen)
        self.folder.editingFinished.connect(self._folder_chosen)
        browse.clicked.connect(self.browse_folder)
        self.scan_button.clicked.connect(self.scan_cache)
        self.cache.activated.connect(self._cache_chosen)
        self.recent.activated.connect(self._recent_chosen)
        state.sourceChanged.connect(self._sync)
        state.previewChanged.connect(self._show_summary)
        self._sync(state.source)

    def _sync(self, source: ModelSource) -> None:
        self._syncing = True
        index = [k for k, _ in KINDS].index(source.kind)
        self.kind_buttons.button(index).setChecked(True)
        self.stack.setCurrentIndex(index)
        if source.is_preset:
            # an unknown name (``--preset nope``) selects nothing: the list's first entry
            # stayed shown, and choosing it changed nothing
            self.presets.setCurrentIndex(self.presets.findText(source.value))
            self.preset_note.setText(self._preset_notes.get(source.value, ""))
        elif source.kind == "folder":
            self.folder.setText(source.value)
        self._syncing = False

    def _kind_clicked(self, index: int) -> None:
        self.stack.setCurrentIndex(index)
        kind = KINDS[index][0]
        if kind == "preset":
            self._preset_chosen(self.presets.currentText())
        elif kind == "folder" and self.folder.text().strip():
            self._folder_chosen()
        elif kind == "cache" and self.cache.count() == 0:
            self.scan_cache()

    def _preset_chosen(self, name: str) -> None:
        self.preset_note.setText(self._preset_notes.get(name, ""))
        if not self._syncing and name:
            self._state.set_source(ModelSource("preset", name))

    def _folder_chosen(self) -> None:
        text = self.folder.text().strip()
        if text and not self._syncing:
            self._state.set_source(ModelSource("folder", text))

    def browse_folder(self) -> None:
        """Pick a checkpoint folder with a dialog."""
        folder = QFileDialog.getExistingDirectory(self, "Hugging Face checkpoint folder")
        if folder:
            self.choose_folder(folder)

    def choose_folder(self, folder: str) -> None:
        """Use a checkpoint folder (from the dialog, a drop, or a script)."""
        self.kind_buttons.button(1).setChecked(True)
        self.stack.setCurrentIndex(1)
        self.folder.setText(folder)
        self._folder_chosen()

    def scan_cache(self) -> None:
        """List the cache's supported checkpoints (a disk walk, so in a worker)."""
        from app.hf_cache import scan_cache

        self.scan_button.setEnabled(False)
        self.cache_note.setText("Scanning…")
        start_worker(
            lambda progress, cancel: scan_cache(),
            owner=self,
            name="hf-cache",
            on_returned=self._scanned,
            on_errored=lambda exc: self.cache_note.setText(f"Scan failed: {exc}"),
            on_finished=lambda: self.scan_button.setEnabled(True),
        )

    def _scanned(self, entries: list[Any]) -> None:
        self.cache.clear()
        for entry in entries:
            self.cache.addItem(entry.label, ModelSource("cache", str(entry.path), entry.label))
        self.cache_note.setText(
            f"{len(entries)} supported checkpoint(s) in the cache."
            if entries
            else "No checkpoints of a supported family in the local cache (nothing is downloaded)."
        )
        self.cacheScanned.emit(len(entries))

    def _cache_chosen(self, index: int) -> None:
        source = self.cache.itemData(index)
        if isinstance(source, ModelSource):
            self._state.set_source(source)

    def _recent_chosen(self, index: int) -> None:
        source = self.recent.itemData(index)
        if isinstance(source, ModelSource):
            self._state.set_source(source)
        self.recent.setCurrentIndex(0)

    def _show_summary(self, data: Any) -> None:
        s = getattr(data, "spec_summary", None)
        if not s:
            self.summary.setText("")
            return
        count = s["parameters"]
        params = f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.2f} M"
        self.summary.setText(", ".join(_summary_parts(s, params)))


def _summary_parts(s: dict[str, Any], params: str) -> list[str]:
    """The model's summary in words, naming only what the model has (a Llama has no
    sliding layers, no per-layer embeddings, no shared KV)."""
    sliding, full = s["sliding_layers"], s["full_layers"]
    layers = f"{s['layers']} layers"
    if sliding and full:
        layers += f" ({sliding} sliding, {full} full)"
    elif sliding:
        layers += " (all sliding)"

    def values(key: str) -> str:
        found = [v for v in s[key].values() if v is not None]
        return "/".join(str(v) for v in dict.fromkeys(found))

    caches = f"{s['kv_cache_layers']} KV caches"
    if s["kv_shared_layers"]:
        caches += f" ({s['kv_shared_layers']} layers share)"
    parts = [
        f"{s['name']} ({s['model_type']}): {params} parameters",
        layers,
        f"hidden {s['hidden_size']}",
        f"{s['attention_heads']} heads",
        f"KV heads {values('kv_heads')}",
        f"head dim {values('head_dim')}",
        f"vocab {s['vocab_size']:,}",
        caches,
    ]
    if s["per_layer_embedding_dim"]:
        parts.append(f"per-layer embeddings {s['per_layer_embedding_dim']}")
    if sliding:
        parts.append(f"window {s['sliding_window']}")
    return parts


def _row(*widgets: QWidget) -> QWidget:
    box = QWidget()
    layout = QHBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        layout.addWidget(w, 1 if isinstance(w, (QLineEdit, QComboBox)) else 0)
    return box


def _column(*widgets: QWidget) -> QWidget:
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        layout.addWidget(w)
    layout.addStretch(1)
    return box
