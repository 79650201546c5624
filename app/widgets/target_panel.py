"""Target: EP, dtype, graph capture, quantization, buffer limit and the output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.state import ModelSource, StudioState
from engine.caps import get_caps, list_eps
from engine.options import ExportOptions
from engine.units import format_bytes, parse_bytes

BITS = (("none", None), ("4-bit", 4), ("8-bit", 8))
BLOCKS = (16, 32, 64, 128, 256)
INVALID_STYLE = "QLineEdit { border: 1px solid #c62828; background: #fdecea; }"


def default_output(source: ModelSource, ep: str) -> str:
    """A sensible output folder for a model and EP under ~/export-studio."""
    name = source.value if source.is_preset else Path(source.value).name
    return str(Path.home() / "export-studio" / f"{name}-{ep}")


class TargetPanel(QGroupBox):
    """Edits ``state.options`` and ``state.output``; a bad custom limit is refused inline."""

    def __init__(self, state: StudioState, parent: Any = None) -> None:
        super().__init__("2  Target", parent)
        self._state = state
        self._syncing = False
        self._output_auto = not state.output
        self.ep = QComboBox()
        for name in list_eps():
            self.ep.addItem(get_caps(name).display_name, name)
        self.dtype = QComboBox()
        self.capture = _combo(("auto", "auto"), ("on", "on"), ("off", "off"))
        self.weight_bits = _combo(*BITS)
        self.embedding_bits = _combo(*BITS)
        self.block_size = _combo(*((str(b), b) for b in BLOCKS))
        self.limit_mode = _combo(("EP default", "default"), ("custom", "custom"))
        self.limit = QLineEdit()
        self.limit.setPlaceholderText("e.g. 1GiB")
        self.limit.setMaximumWidth(90)
        self.max_length = QSpinBox()
        self.max_length.setRange(0, 1 << 20)
        self.max_length.setSpecialValueText("model's maximum")
        self.max_length.setSingleStep(1024)
        self.attention = _combo(
            ("auto", "auto"), ("GroupQueryAttention", "gqa"), ("standard ONNX", "standard")
        )
        self.random_weights = QCheckBox("random weights (no checkpoint needed)")
        self.output = QLineEdit()
        browse = QPushButton("Browse…")
        self.overwrite = QCheckBox("replace an existing folder")
        self.overwrite.setToolTip(
            "the old folder is replaced only once the new package is complete"
        )

        form = QFormLayout(self)
        form.addRow("Execution provider", self.ep)
        form.addRow("Activation dtype", self.dtype)
        form.addRow("Graph capture", self.capture)
        form.addRow("Weight bits", self.weight_bits)
        form.addRow("Embedding bits", self.embedding_bits)
        form.addRow("Block size", self.block_size)
        form.addRow("Buffer limit", _row(self.limit_mode, self.limit))
        form.addRow("Max length", self.max_length)
        form.addRow("Attention", self.attention)
        form.addRow("", self.random_weights)
        form.addRow("Output folder", _row(self.output, browse))
        form.addRow("", self.overwrite)

        for combo in (
            self.ep,
            self.dtype,
            self.capture,
            self.weight_bits,
            self.embedding_bits,
            self.block_size,
            self.limit_mode,
            self.attention,
        ):
            combo.currentIndexChanged.connect(self._apply)
        self.limit.editingFinished.connect(self._apply)
        self.max_length.valueChanged.connect(self._apply)
        self.random_weights.toggled.connect(self._apply)
        self.output.textEdited.connect(self._output_edited)
        self.overwrite.toggled.connect(self._overwrite_toggled)
        browse.clicked.connect(self._browse)
        state.optionsChanged.connect(self._sync)
        state.sourceChanged.connect(self._source_changed)
        state.outputChanged.connect(self._sync_output)
        self._sync(state.options)
        self._source_changed(state.source)
        self._sync_output(state.output)

    # state -> widgets
    def _sync(self, options: ExportOptions) -> None:
        self._syncing = True
        caps = get_caps(options.ep)
        self.ep.setCurrentIndex(max(self.ep.findData(caps.name), 0))
        self.dtype.clear()
        self.dtype.addItem(f"EP default ({caps.default_dtype})", None)
        for dtype in caps.float_dtypes:
            self.dtype.addItem(dtype, dtype)
        _select(self.dtype, options.dtype)
        _select(self.capture, options.graph_capture)
        _select(self.weight_bits, options.weight_bits)
        _select(self.embedding_bits, options.embedding_bits)
        _select(self.block_size, options.block_size)
        _select(self.attention, options.attention)
        default = format_bytes(caps.max_buffer_size) if caps.max_buffer_size else "no limit"
        self.limit_mode.setItemText(0, f"EP default ({default})")
        custom = options.max_buffer_size is not None
        self.limit_mode.setCurrentIndex(1 if custom else 0)
        self.limit.setEnabled(custom)
        if custom:
            self.limit.setText(format_bytes(options.max_buffer_size or 0).replace(" ", ""))
        self.limit.setStyleSheet("")
        self.max_length.setValue(options.max_length or 0)
        self.random_weights.setChecked(options.random_weights or self._state.source.is_preset)
        self._syncing = False
        if self._output_auto:
            self._state.set_output(default_output(self._state.source, caps.name))

    def _source_changed(self, source: ModelSource) -> None:
        self.random_weights.setEnabled(not source.is_preset)
        self.random_weights.setToolTip(
            "presets carry no weights: their packages always use random ones"
            if source.is_preset
            else ""
        )
        self._sync(self._state.options)

    def _sync_output(self, output: str) -> None:
        if self.output.text() != output:
            self.output.setText(output)
        self.overwrite.setChecked(self._state.overwrite)

    # widgets -> state
    def _apply(self, *_: Any) -> None:
        if self._syncing:
            return
        limit = self._custom_limit()
        if limit is False:
            return
        ep = self.ep.currentData()
        ep_changed = ep != self._state.options.ep
        dtype = None if ep_changed else self.dtype.currentData()
        self._state.update_options(
            ep=ep,
            dtype=dtype,
            graph_capture=self.capture.currentData(),
            weight_bits=self.weight_bits.currentData(),
            embedding_bits=self.embedding_bits.currentData(),
            block_size=self.block_size.currentData(),
            max_buffer_size=limit,
            max_length=self.max_length.value() or None,
            attention=self.attention.currentData(),
            random_weights=self.random_weights.isChecked() and not self._state.source.is_preset,
        )

    def _custom_limit(self) -> int | bool | None:
        """The custom limit in bytes, None for the EP default, False when the text is bad."""
        custom = self.limit_mode.currentData() == "custom"
        self.limit.setEnabled(custom)
        if not custom:
            self.limit.setStyleSheet("")
            return None
        text = self.limit.text().strip()
        if not text:
            caps = get_caps(self.ep.currentData())
            text = format_bytes(caps.max_buffer_size or 1024**3).replace(" ", "")
            self.limit.setText(text)
        try:
            value = parse_bytes(text)
            if value < 1024**2:
                raise ValueError("the buffer limit must be at least 1 MiB")
        except ValueError as exc:
            self.limit.setStyleSheet(INVALID_STYLE)
            self.limit.setToolTip(f"Not applied: {exc}")
            return False
        self.limit.setStyleSheet("")
        self.limit.setToolTip(f"{value:,} bytes")
        return value

    def _output_edited(self, text: str) -> None:
        self._output_auto = not text.strip()
        self._state.set_output(text.strip())

    def _overwrite_toggled(self, checked: bool) -> None:
        self._state.overwrite = checked

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Parent folder of the package")
        if folder:
            name = Path(self._state.output).name or "package"
            self._output_auto = False
            self._state.set_output(str(Path(folder) / name))


def _combo(*items: tuple[str, Any]) -> QComboBox:
    combo = QComboBox()
    for label, data in items:
        combo.addItem(label, data)
    return combo


def _select(combo: QComboBox, data: Any) -> None:
    index = combo.findData(data)
    combo.setCurrentIndex(index if index >= 0 else 0)


def _row(*widgets: QWidget) -> QWidget:
    box = QWidget()
    layout = QHBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        layout.addWidget(w, 1 if isinstance(w, QLineEdit) else 0)
    return box
