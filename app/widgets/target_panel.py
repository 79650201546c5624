"""Target: EP, dtype, graph capture, quantization, buffer limit and the output folder.

Every control is built from :data:`app.wording.CONTROLS` (label with its mnemonic, tooltip,
choices). Values that cannot work for the current EP or model are offered disabled, with
the reason as the item's tooltip; when the state moves an option onto an allowed value,
the note under the form says what changed and why.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.choices import Constraints
from app.state import ModelSource, StudioState
from app.widgets.controls import checkbox, combo, described, find_data, offer
from app.widgets.messages import MessageLabel
from app.wording import CONTROLS, ep_summary
from engine.caps import get_caps, list_eps
from engine.options import (
    QUANTIZATION_ONLY,
    WEIGHT_ONLY,
    ExportOptions,
    unused_quantization,
)
from engine.units import exact_size, format_bytes, parse_bytes

INVALID_STYLE = "QLineEdit { border: 1px solid #c62828; }"
NOTE_MARK = "ℹ"
"""Leads the note under the form: U+2139, which DejaVu Sans (a Linux desktop's usual UI
font) has; U+24D8 "ⓘ" it has not, and Qt drew a box (tests/app/test_glyphs.py)."""
CONSTRAINED = ("graph_capture", "weight_bits", "embedding_bits", "block_size", "attention")


_BITS = f"“{CONTROLS['weight_bits'].name}”", f"“{CONTROLS['embedding_bits'].name}”"
_LIMIT = f"“{CONTROLS['max_buffer_size'].name}”"
UNQUANTIZED = (
    f"Used only when weights or embeddings are quantized: choose 4 or 8 bits in {_BITS[0]} "
    f"or {_BITS[1]} above."
)
FLOAT_EMBEDDINGS = (
    f"Used only when the embedding tables are quantized: choose 4 or 8 bits in {_BITS[1]} above."
)
FLOAT_WEIGHTS = f"Used only when the weights are quantized: choose 4 or 8 bits in {_BITS[0]} above."
DEFAULT_LIMIT = (
    f"Used only with a custom buffer limit: choose “custom” for {_LIMIT} (the EP's default "
    "limit applies now)."
)
"""Why a control is disabled, and what enables it: the start of its tooltip then."""

MIN_CUSTOM_LIMIT = 1024**2
"""Least custom buffer limit the form takes."""


def _size_problem(text: str, least: int = 0) -> str:
    """Why ``text`` is not a size of at least ``least`` bytes ("" when it is, or empty)."""
    text = text.strip()
    if not text:
        return ""
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        return str(exc)
    if value < least:
        return f"it must be at least {format_bytes(least)}"
    return ""


class TargetPanel(QGroupBox):
    """Edits ``state.options``, ``state.output`` and ``state.overwrite``; a bad custom limit
    is refused inline."""

    def __init__(self, state: StudioState, parent: Any = None) -> None:
        super().__init__("2  Target", parent)
        self._state = state
        self._syncing = False
        self.ep = combo("ep", [(get_caps(name).display_name, name) for name in list_eps()])
        for i, name in enumerate(list_eps()):
            self.ep.setItemData(i, ep_summary(get_caps(name)), Qt.ItemDataRole.ToolTipRole)
        self.modalities = combo("modalities")
        self.dtype = combo("dtype", [])
        self.capture = combo("graph_capture")
        self.weight_bits = combo("weight_bits")
        self.embedding_bits = combo("embedding_bits")
        self.block_size = combo("block_size")
        self.limit_mode = combo("max_buffer_size")
        self.limit = described(QLineEdit(), "max_buffer_size", " (custom value)")
        self.limit.setPlaceholderText("e.g. 1GiB")
        self.limit.setMaximumWidth(80)
        self.force = checkbox("force")
        self.keep_float = described(QLineEdit(), "keep_float")
        self.keep_float.setPlaceholderText("none")
        self.keep_int8 = described(QLineEdit(), "keep_int8")
        self.keep_int8.setPlaceholderText("none")
        self.size_budget = described(QLineEdit(), "size_budget")
        self.size_budget.setPlaceholderText("none (e.g. 2.5GB)")
        self.estimate = described(QPushButton(CONTROLS["tradeoff"].label), "tradeoff")
        self.quality_dialog: Any = None
        self._measuring = False
        self.max_length = described(QSpinBox(), "max_length")
        self.max_length.setRange(0, 1 << 20)
        self.max_length.setSpecialValueText("model's maximum")
        self.max_length.setSingleStep(1024)
        self.attention = combo("attention")
        self.embedding_block_size = combo("embedding_block_size")
        self.symmetric = checkbox("symmetric")
        self.quant_method = combo("quant_method")
        self.quantize_lm_head = checkbox("quantize_lm_head")
        self.accuracy_level = combo("accuracy_level")
        self.seed = described(QSpinBox(), "seed")
        self.seed.setRange(0, 2**31 - 1)
        self.random_weights = checkbox("random_weights")
        self.output = described(QLineEdit(), "output")
        self.browse = described(QPushButton("Browse…"), "output", " (choose the parent folder)")
        self.overwrite = checkbox("overwrite")
        self.note = MessageLabel()
        self.note.setObjectName("adjustmentNote")
        self.note.setAccessibleName("What was adjusted")
        self.advanced_button = QToolButton()
        self.advanced_button.setText("Advanced &quantization")
        self.advanced_button.setCheckable(True)
        self.advanced_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_button.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_button.setToolTip("Show or hide the quantizer's finer options")
        self.advanced_button.setAccessibleName("Advanced quantization")

        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for key, field in (
            ("ep", self.ep),
            ("modalities", self.modalities),
            ("dtype", self.dtype),
            ("graph_capture", self.capture),
            ("weight_bits", self.weight_bits),
            ("embedding_bits", self.embedding_bits),
            ("block_size", self.block_size),
            ("max_buffer_size", _row(self.limit_mode, self.limit)),
            ("force", self.force),
            ("max_length", self.max_length),
            ("attention", self.attention),
        ):
            if key == "force":  # a checkbox under the limit, labelled by itself
                form.addRow("", field)
                continue
            form.addRow(CONTROLS[key].label, field)
            if key == "max_buffer_size":  # the buddy of a row of two is its first control
                label = form.labelForField(field)
                if isinstance(label, QLabel):
                    label.setBuddy(self.limit_mode)
        self.advanced = QWidget()
        advanced = QFormLayout(self.advanced)
        advanced.setContentsMargins(12, 0, 0, 0)
        for key, field in (
            ("embedding_block_size", self.embedding_block_size),
            ("quant_method", self.quant_method),
            ("accuracy_level", self.accuracy_level),
            ("seed", self.seed),
            ("keep_float", self.keep_float),
            ("keep_int8", self.keep_int8),
            ("size_budget", self.size_budget),
        ):
            advanced.addRow(CONTROLS[key].label, field)
        # under the budget it sets, not beside it (beside, the budget's box kept ~30 px:
        # "5KiB" of 99.45KiB)
        advanced.addRow("", self.estimate)
        advanced.addRow(self.symmetric)
        advanced.addRow(self.quantize_lm_head)
        self.advanced.setVisible(False)
        output_label = QLabel(CONTROLS["output"].label)  # above its field: paths are long
        output_label.setBuddy(self.output)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.advanced_button)
        layout.addWidget(self.advanced)
        layout.addWidget(self.random_weights)
        layout.addWidget(output_label)
        layout.addWidget(_row(self.output, self.browse))
        layout.addWidget(self.overwrite)
        layout.addWidget(self.note)

        for widget in (
            self.ep,
            self.modalities,
            self.dtype,
            self.capture,
            self.weight_bits,
            self.embedding_bits,
            self.block_size,
            self.limit_mode,
            self.attention,
            self.embedding_block_size,
            self.quant_method,
            self.accuracy_level,
        ):
            widget.currentIndexChanged.connect(self._apply)
        for box in (self.symmetric, self.quantize_lm_head, self.random_weights, self.force):
            box.toggled.connect(self._apply)
        self.limit.editingFinished.connect(self._apply)
        self.keep_float.editingFinished.connect(self._apply)
        self.keep_int8.editingFinished.connect(self._apply)
        self.size_budget.editingFinished.connect(self._apply)
        for box in (self.limit, self.size_budget):
            box.textEdited.connect(self._recheck_fields)
        self.max_length.valueChanged.connect(self._apply)
        self.seed.valueChanged.connect(self._apply)
        self.output.textEdited.connect(lambda text: state.set_output(text.strip()))
        self.overwrite.toggled.connect(state.set_overwrite)
        self.browse.clicked.connect(self._browse)
        self.estimate.clicked.connect(self.estimate_quality)
        self.advanced_button.toggled.connect(self._show_advanced)
        state.optionsChanged.connect(self._sync)
        state.constraintsChanged.connect(self._show_constraints)
        state.sourceChanged.connect(self._source_changed)
        state.outputChanged.connect(self._sync_output)
        state.overwriteChanged.connect(self._sync_output)
        state.adjusted.connect(self._show_note)
        self._source_changed(state.source)
        self._sync_output()
        self._show_note(state.adjustment)

    # state -> widgets
    def _sync(self, options: ExportOptions) -> None:
        self._syncing = True
        caps = get_caps(options.ep)
        self.ep.setCurrentIndex(max(self.ep.findData(caps.name), 0))
        self.dtype.clear()
        self.dtype.addItem(f"EP default ({caps.default_dtype})", None)
        for dtype in caps.float_dtypes:
            self.dtype.addItem(dtype, dtype)
        for widget, value in (
            (self.dtype, options.dtype),
            (self.capture, options.graph_capture),
            (self.weight_bits, options.weight_bits),
            (self.embedding_bits, options.embedding_bits),
            (self.block_size, options.block_size),
            (self.attention, options.attention),
            (self.embedding_block_size, options.embedding_block_size),
            (self.quant_method, options.quant_method),
            (self.accuracy_level, options.accuracy_level),
            (self.modalities, options.modalities),
        ):
            _select(widget, value)
        quantized = options.weight_bits is not None or options.embedding_bits is not None
        # greyed exactly where the command line refuses the flag (unused_quantization)
        unused = unused_quantization(options)
        for key in QUANTIZATION_ONLY:  # each control is the attribute named as its option
            offer(getattr(self, key), key, _unused_reason(key) if key in unused else None)
        for key, control in (("keep_float", self.keep_float), ("keep_int8", self.keep_int8)):
            offer(control, key, None if quantized else UNQUANTIZED)
        self.symmetric.setChecked(options.symmetric)
        self.quantize_lm_head.setChecked(options.quantize_lm_head)
        self.seed.setValue(options.seed)
        limit = caps.max_buffer_size
        default = format_bytes(limit, compact=True) if limit else "no limit"
        self.limit_mode.setItemText(0, f"EP default ({default})")
        custom = options.max_buffer_size is not None
        self.limit_mode.setCurrentIndex(1 if custom else 0)
        offer(self.limit, "max_buffer_size", None if custom else DEFAULT_LIMIT)
        if custom:
            self.limit.setToolTip(_limit_tip(options.max_buffer_size or 0))
        # only a limit the user chose refuses an export
        offer(self.force, "force", None if custom else DEFAULT_LIMIT)
        self.force.setChecked(options.force)
        self.keep_float.setText(", ".join(options.keep_float))
        if quantized:  # without quantization the patterns wait, as typed, for it to return
            self.keep_int8.setText(", ".join(options.keep_int8))
        budget = options.size_budget
        why = self._budget_unavailable(
            options.weight_bits, options.embedding_bits, options.random_weights
        )
        # the options' budget keeps its text while that reads back as its bytes; a budget the
        # choices leave out waits in the box, as typed, for ones it applies to (the note says)
        if budget is not None and self._typed_budget() != budget:
            self.size_budget.setText(exact_size(budget))
        elif budget is None and why is None:
            self.size_budget.setText("")
        self.size_budget.setStyleSheet("")
        self.size_budget.setEnabled(why is None)
        self.size_budget.setToolTip(
            CONTROLS["size_budget"].help if why is None else f"Not available: {why}."
        )
        self.estimate.setEnabled(why is None and not self._measuring)
        if not self._measuring:
            self.estimate.setToolTip(
                CONTROLS["tradeoff"].help if why is None else f"Not available: {why}."
            )
        if custom:
            self.limit.setText(format_bytes(options.max_buffer_size or 0).replace(" ", ""))
        self.limit.setStyleSheet("")
        self.max_length.setValue(options.max_length or 0)
        self.random_weights.setChecked(options.random_weights or self._state.source.is_preset)
        self._show_constraints(self._state.constraints)
        self._show_note()
        self._syncing = False
        self._state.set_form_problem("")  # the fields show the options again

    def _show_constraints(self, constraints: Constraints) -> None:
        """Disable the choices that cannot work, with the reason as their tooltip."""
        for key, widget in (
            ("graph_capture", self.capture),
            ("weight_bits", self.weight_bits),
            ("embedding_bits", self.embedding_bits),
            ("block_size", self.block_size),
            ("embedding_block_size", self.embedding_block_size),
            ("attention", self.attention),
            ("modalities", self.modalities),
            ("quant_method", self.quant_method),
        ):
            model = widget.model()
            assert isinstance(model, QStandardItemModel)
            for i in range(widget.count()):
                reason = constraints.reason(key, widget.itemData(i))
                item = model.item(i)
                item.setEnabled(reason is None)
                item.setToolTip(f"Not available: {reason}" if reason else "")

    def _source_changed(self, source: ModelSource) -> None:
        self.random_weights.setEnabled(not source.is_preset)
        self.random_weights.setToolTip(
            "Presets carry no weights: their packages always use random ones."
            if source.is_preset
            else CONTROLS["random_weights"].help
        )
        waiting = self.size_budget.text()
        self._sync(self._state.options)
        if self._state.options.size_budget is not None and not self._budget_applies():
            self._state.update_options(size_budget=None)  # it waits in the box, as typed
        elif self._state.options.size_budget is None and waiting.strip():
            self.size_budget.setText(waiting)  # a budget that waited applies again (or waits)
            if self._budget_applies():
                self._apply()
            self._show_note()

    def _sync_output(self, *_: Any) -> None:
        if self.output.text() != self._state.output:
            self.output.setText(self._state.output)
        if self.overwrite.isChecked() != self._state.overwrite:
            self.overwrite.setChecked(self._state.overwrite)

    def _show_note(self, *_: Any) -> None:
        """What the state adjusted, a size budget in the box that the choices leave unused,
        and an EP whose packages never ran on its hardware."""
        untested = get_caps(self._state.options.ep).untested_note()
        parts = (self._state.adjustment, self._unused_budget(), f"{untested}." if untested else "")
        text = " ".join(n for n in parts if n)
        self.note.setText(f"{NOTE_MARK} {text}" if text else "")
        self.note.setVisible(bool(text))

    def _unused_budget(self) -> str:
        """Why the size budget in the box is not applied ("" when it is, or there is none)."""
        text = self.size_budget.text().strip()
        options = self._state.options
        why = self._budget_unavailable(
            options.weight_bits, options.embedding_bits, options.random_weights
        )
        if not text or why is None:
            return ""
        return f"{CONTROLS['size_budget'].name} {text} is not applied: {why}."

    def _show_advanced(self, shown: bool) -> None:
        self.advanced.setVisible(shown)
        self.advanced_button.setArrowType(
            Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        )

    # widgets -> state
    def _apply(self, *_: Any) -> None:
        if self._syncing:
            return
        limit = self._custom_limit()
        budget = self._size_budget()
        applies = self._budget_applies()
        # Export waits for a value it can read: the options (and the preview) keep the last
        # good one, which is not what the field shows.
        problem = self._unread_fields()
        self._state.set_form_problem(problem)
        if problem:
            return
        ep = self.ep.currentData()
        quantized = any(
            box.currentData() is not None for box in (self.weight_bits, self.embedding_bits)
        )
        self._state.update_options(
            ep=ep,
            # an explicit dtype the new EP does not run is reset by the state, with a note
            dtype=self.dtype.currentData(),
            graph_capture=self.capture.currentData(),
            weight_bits=self.weight_bits.currentData(),
            embedding_bits=self.embedding_bits.currentData(),
            block_size=self.block_size.currentData(),
            embedding_block_size=self.embedding_block_size.currentData(),
            symmetric=self.symmetric.isChecked(),
            quant_method=self.quant_method.currentData(),
            quantize_lm_head=self.quantize_lm_head.isChecked(),
            accuracy_level=self.accuracy_level.currentData(),
            max_buffer_size=limit,
            max_length=self.max_length.value() or None,
            attention=self.attention.currentData(),
            random_weights=self.random_weights.isChecked() and not self._state.source.is_preset,
            seed=self.seed.value(),
            modalities=self.modalities.currentData(),
            force=self.force.isChecked() and limit is not None,
            keep_float=_patterns(self.keep_float),
            keep_int8=_patterns(self.keep_int8) if quantized else (),
            size_budget=budget if applies and budget is not False else None,
        )

    def estimate_quality(self) -> Any:
        """Open the size-against-quality dialog for the checkpoint and the options now
        chosen; the line the user picks becomes the size budget."""
        from app.widgets.quality_dialog import QualityDialog

        if self.quality_dialog is not None:  # closed, and its measurement has stopped
            self.quality_dialog.deleteLater()
        source, options = self._state.source, self._state.options
        dialog = QualityDialog(
            Path(source.value),
            options,
            self._use_budget,
            self,
            measured=self._state.tradeoff_for(source, options),  # reopened: shown at once
            current=options.size_budget,
        )
        self.quality_dialog = dialog
        if dialog.worker is not None:
            # one measurement at a time: a closed dialog's child stops at its next weight
            self._measuring = True
            self.estimate.setEnabled(False)
            self.estimate.setToolTip("Not available: the last measurement is still stopping.")
            # kept in the state: the dialog reopens on it and the preview shows its mix
            dialog.worker.signals.returned.connect(
                partial(self._state.set_tradeoff, source, options)
            )
            dialog.worker.signals.finished.connect(self._measured)
        # back where the user was, the budget box first (Space must not tick a neighbour)
        dialog.finished.connect(lambda _: self._focus_after_dialog())
        dialog.open()
        return dialog

    def _measured(self) -> None:
        self._measuring = False
        self._sync(self._state.options)

    def _focus_after_dialog(self) -> None:
        target = self.size_budget if self.size_budget.isEnabled() else self.estimate
        target.setFocus(Qt.FocusReason.OtherFocusReason)

    def _use_budget(self, text: str) -> None:
        """The budget the dialog chose, as it reads back ("" for none)."""
        self.size_budget.setText(text)
        self._apply()

    def _budget_unavailable(
        self, weight_bits: int | None, embedding_bits: int | None, random_weights: bool
    ) -> str | None:
        """Why the size budget cannot apply to these choices, or None."""
        keep = CONTROLS["keep_int8"].name
        if self._state.source.is_preset:
            return f"a preset has no weights to measure; choose by name with “{keep}”"
        if random_weights:
            return f"random weights leave nothing to measure; choose by name with “{keep}”"
        if 4 not in (weight_bits, embedding_bits):
            return "it picks INT8 for some 4-bit weights; choose 4 weight or embedding bits"
        return None

    def _unread_fields(self) -> str:
        """Why a size field's text (a custom buffer limit, a size budget that applies) is
        not applied, in a clause for the Export blocker; empty when both read."""
        custom = self.limit_mode.currentData() == "custom"
        problems = []
        for key, box, least, applies in (
            ("max_buffer_size", self.limit, MIN_CUSTOM_LIMIT, custom),
            ("size_budget", self.size_budget, 0, self._budget_applies()),
        ):
            why = _size_problem(box.text(), least) if applies else ""
            if why:
                problems.append(f"the {CONTROLS[key].name.lower()} is not applied: {why}")
        return "; ".join(problems)

    def _recheck_fields(self, *_: Any) -> None:
        """As the user types: a field corrected clears the blocker before Enter or Tab
        (a disabled Export takes no click, so its focus change would never come)."""
        if not self._syncing and self._state.form_problem:
            self._state.set_form_problem(self._unread_fields())

    def _budget_applies(self) -> bool:
        """The budget box's value applies to the choices now in the widgets."""
        random = self.random_weights.isChecked() and not self._state.source.is_preset
        bits = (self.weight_bits.currentData(), self.embedding_bits.currentData())
        return self._budget_unavailable(*bits, random) is None

    def _typed_budget(self) -> int | None:
        """The bytes the budget box's text reads as, None for none or a bad text."""
        text = self.size_budget.text().strip()
        try:
            return parse_bytes(text) if text else None
        except ValueError:
            return None

    def _size_budget(self) -> int | bool | None:
        """The size budget in bytes, None for none, False when the text is bad."""
        text = self.size_budget.text().strip()
        if not text:
            self.size_budget.setStyleSheet("")
            return None
        why = _size_problem(text)
        if why:
            self.size_budget.setStyleSheet(INVALID_STYLE)
            self.size_budget.setToolTip(f"Not applied: {why}")
            return False
        self.size_budget.setStyleSheet("")
        return parse_bytes(text)

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
        why = _size_problem(text, least=MIN_CUSTOM_LIMIT)
        if why:
            self.limit.setStyleSheet(INVALID_STYLE)
            self.limit.setToolTip(f"Not applied: {why}")
            return False
        value = parse_bytes(text)
        self.limit.setStyleSheet("")
        self.limit.setToolTip(_limit_tip(value))
        return value

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Parent folder of the package")
        if folder:
            name = Path(self._state.output).name or "package"
            self._state.set_output(str(Path(folder) / name))


def _select(combo: QComboBox, data: Any) -> None:
    index = find_data(combo, data)
    combo.setCurrentIndex(index if index >= 0 else 0)


def _unused_reason(key: str) -> str:
    """Why quantization option ``key`` (one :func:`unused_quantization` names) applies to
    nothing now, and the choice that would make it count."""
    if key in WEIGHT_ONLY:
        return FLOAT_WEIGHTS
    return FLOAT_EMBEDDINGS if key == "embedding_block_size" else UNQUANTIZED


def _limit_tip(value: int) -> str:
    return f"{CONTROLS['max_buffer_size'].help}\n\nNow: {value:,} bytes"


def _row(*widgets: QWidget) -> QWidget:
    box = QWidget()
    layout = QHBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        layout.addWidget(w, 1 if isinstance(w, (QLineEdit, QComboBox)) else 0)
    return box


def _patterns(field: QLineEdit) -> tuple[str, ...]:
    """Comma-separated name patterns of a line edit."""
    return tuple(p.strip() for p in field.text().split(",") if p.strip())
