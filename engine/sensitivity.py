"""Mixed precision chosen by measured sensitivity: ``size_budget`` (the most bytes the
package may take) or ``target_kld`` (the most mean KL divergence it may lose).

Each 4-bit weight's sensitivity is measured, not guessed: the checkpoint's float model
(an fp32 CPU package of the text decoder in a temp folder) runs the calibration text with
only that weight replaced by its 4-bit round trip (the export's own quantizer; an
onnxruntime session whose initializer is overridden, nothing re-exported), and the mean
``KL(float || that)`` of the next-token distributions is the weight's cost in INT4. Its
cost in INT8 is taken as ``(15 / 255) ** 2`` of that (the squared step ratio; all-INT8
measures about 1/250 of all-INT4 on the trained reference; the INT8 weight's blocks of 128,
:func:`engine.plan.int8_block`, make its steps a little coarser than that, still far below
any INT4 weight's), and the costs of different weights are taken to add, as they do for small
errors.

The choice is then a knapsack solved greedily: from all-INT4, the weight that buys the
most KLD per extra byte goes to INT8, then the next, while the budget holds (or until the
predicted KLD reaches the target). The result is an ordinary ``keep_int8`` list of weight
names, so the plan shows each tensor's storage and the package's bytes like any other.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.dtypes import numpy_dtype
from engine.errors import OptionsError, option
from engine.options import ExportOptions
from engine.plan_model import ExportPlan, WeightPlan
from engine.progress import CancelToken, Progress, no_progress
from engine.spec import ModelSpec

WINDOWS = 4
"""Calibration windows (of :data:`engine.calibration.SEQUENCE_LENGTH` tokens) scored per
weight."""
INT8_RATIO = (15 / 255) ** 2
"""A weight's KLD in INT8 relative to INT4 (the ratio of their squared quantization steps)."""
MAX_FLOAT_BYTES = 2 * 1024**3
"""Largest float32 decoder measured (one onnxruntime session per weight): ~0.5 B parameters."""


@dataclass(frozen=True)
class WeightCost:
    """One 4-bit weight: what INT4 costs in KLD on the text, and its bytes either way."""

    name: str
    kld4: float
    bytes4: int
    bytes8: int

    @property
    def gain_per_byte(self) -> float:
        """KLD saved per extra byte by storing it in INT8."""
        extra = max(self.bytes8 - self.bytes4, 1)
        return self.kld4 * (1 - INT8_RATIO) / extra


@dataclass(frozen=True)
class PrecisionChoice:
    """Which weights go to INT8, and what that is predicted to cost."""

    int8: tuple[str, ...]
    predicted_kld: float
    """Sum of the INT4 weights' costs and the INT8 ones' :data:`INT8_RATIO` of theirs."""
    all_int4_kld: float
    nbytes: int
    """The package's bytes with the choice."""
    all_int4_bytes: int
    costs: tuple[WeightCost, ...]
    """Every measured weight, most sensitive (per byte) first."""
    target_kld: float | None = None

    def note(self) -> str:
        note = (
            f"mixed precision by measured sensitivity: {len(self.int8)} of {len(self.costs)} "
            f"4-bit weights in INT8, predicted mean KLD {self.predicted_kld:.3g} (all-INT4 "
            f"{self.all_int4_kld:.3g}), {self.nbytes:,} B (all-INT4 {self.all_int4_bytes:,} B)"
        )
        if not self.costs:
            note += "; no 4-bit weight's INT8 form fits the budget, nothing was measured"
        if self.target_kld is not None and self.predicted_kld > self.target_kld:
            note += (
                f"; the target {self.target_kld:g} is out of reach even with every measured "
                "weight in INT8 (8-bit weights everywhere, or float ones, lose less)"
            )
        return note

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "costs": [asdict(c) for c in self.costs]}

    @classmethod
    def from_costs(
        cls, costs: list[WeightCost], options: ExportOptions, base: int
    ) -> PrecisionChoice:
        """The choice :func:`pick` makes from measured ``costs`` for the options' budget or
        target, from the all-INT4 bytes ``base``."""
        chosen, predicted, nbytes = pick(costs, options, base)
        total = sum(c.kld4 for c in costs)
        return cls(tuple(chosen), predicted, total, nbytes, base, tuple(costs), options.target_kld)

    def applied_to(self, options: ExportOptions) -> ExportOptions:
        """``options`` with the chosen weights in INT8."""
        return replace(options, keep_int8=(*options.keep_int8, *self.int8))


def wanted(options: ExportOptions) -> bool:
    """The options ask for mixed precision by measured sensitivity."""
    return options.size_budget is not None or options.target_kld is not None


def apply(
    model_dir: str | os.PathLike[str] | None,
    spec: ModelSpec,
    export_plan: ExportPlan,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> tuple[ExportPlan, str]:
    """The plan with the INT8 weights :func:`choose` picks for its options, and a note
    that says what was chosen and what it is predicted to cost.

    Raises:
        OptionsError: No checkpoint (a preset, random weights), or what :func:`choose`
            refuses.
    """
    from engine.plan import plan

    options = export_plan.options
    flags = f"{option('size_budget')} / {option('target_kld')} measure"
    folder = _checkpoint(
        model_dir, options, flags, f", or choose by name with {option('keep_int8')}"
    )
    progress(0.0, "measuring each weight's sensitivity")
    choice = choose(folder, export_plan, lambda changed: plan(spec, changed), progress, cancel)
    return plan(spec, choice.applied_to(options)), choice.note()


def _checkpoint(
    model_dir: str | os.PathLike[str] | None, options: ExportOptions, what: str, more: str = ""
) -> Path:
    """The checkpoint folder whose float model is measured.

    Raises:
        OptionsError: A preset or random weights: nothing to measure.
    """
    if model_dir is None or options.random_weights:
        none = "a preset has no weights" if model_dir is None else "random weights have none"
        raise OptionsError(
            f"{what} each weight on the checkpoint's float model, and {none}: give the "
            f"checkpoint folder{more}"
        )
    return Path(model_dir)


def candidates(export_plan: ExportPlan) -> list[WeightPlan]:
    """The decoder's 4-bit weights that hold their own bytes (a tied head's table once);
    expert tables ``[E, N, K]`` keep the chosen bits."""
    return [
        wp
        for wp in export_plan.decoder.weights
        if wp.quantized and wp.bits == 4 and not wp.shares and len(wp.weight.shape) == 2
    ]


def choose(
    model_dir: Path,
    export_plan: ExportPlan,
    replan: Any,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> PrecisionChoice:
    """Measure every 4-bit weight's sensitivity and pick the INT8 ones for the plan's
    ``size_budget`` or ``target_kld``; ``replan(options)`` plans other options of the
    same model (the bytes of each weight in INT8).

    Raises:
        OptionsError: Nothing to choose, a model too large to measure here, a budget below
            the all-INT4 package or no tokenizer for the calibration text.
    """
    options = export_plan.options
    base = export_plan.nbytes
    weights = _measurable(export_plan, _flag(options))
    problem = budget_problem(options, base)
    if problem:
        raise OptionsError(problem)
    room = None if options.size_budget is None else options.size_budget - base
    costs = _costs(model_dir, export_plan, weights, replan, progress, cancel, room=room)
    if not costs:
        return PrecisionChoice((), 0.0, 0.0, base, base, ())
    return PrecisionChoice.from_costs(costs, options, base)


def budget_problem(options: ExportOptions, base: int) -> str | None:
    """Why the options' size budget cannot be met from the all-INT4 package's ``base``
    bytes (None: it can, or there is no budget)."""
    if options.size_budget is not None and options.size_budget < base:
        return (
            f"{_flag(options)} is below the all-INT4 package's {base:,} B; give at least that "
            "(INT8 weights only add bytes)"
        )
    return None


def _measurable(export_plan: ExportPlan, flag: str) -> list[WeightPlan]:
    """The plan's candidates, when there are some and the float model is small enough to
    measure here.

    Raises:
        OptionsError: No 4-bit weight, or a float model over :data:`MAX_FLOAT_BYTES`.
    """
    weights = candidates(export_plan)
    if not weights:
        raise OptionsError(
            f"{flag} chooses between INT4 and INT8 per weight, but this plan has no 4-bit "
            f"weight: add {option('weight_bits', 4)} (and / or {option('embedding_bits', 4)})"
        )
    floats = sum(4 * int(np.prod(wp.weight.shape)) for wp in export_plan.decoder.weights)
    if floats > MAX_FLOAT_BYTES:
        raise OptionsError(
            f"{flag} measures each weight on the float model, {floats / 2**30:.1f} GiB for this "
            f"one, more than the {MAX_FLOAT_BYTES / 2**30:.0f} GiB it measures (models up to "
            f"about 0.5 B parameters for now); choose by name with {option('keep_int8')}"
        )
    return weights


def _costs(
    model_dir: Path,
    export_plan: ExportPlan,
    weights: list[WeightPlan],
    replan: Any,
    progress: Progress,
    cancel: CancelToken | None,
    *,
    room: int | None = None,
    calibration: str | os.PathLike[str] | None = None,
) -> list[WeightCost]:
    """The measured cost of each of ``weights`` on ``calibration`` (default: the options'
    text), most KLD saved per byte first; none where no INT8 form adds at most ``room``
    bytes (nothing to choose). A weight too large for the room is measured all the same:
    it stays INT4, and its cost is part of what the choice predicts (left out, a +5%
    budget of a tied table predicted a tenth of the loss its package had)."""
    options = export_plan.options
    names = [wp.name for wp in weights]
    upgraded = replan(replace(options, keep_int8=(*options.keep_int8, *names)))
    bytes8 = {wp.name: wp.nbytes for wp in upgraded.decoder.weights}
    if room is not None and all(bytes8[wp.name] - wp.nbytes > room for wp in weights):
        return []
    klds = measure(model_dir, export_plan, weights, progress, cancel, calibration=calibration)
    return sorted(
        (WeightCost(wp.name, klds[wp.name], wp.nbytes, bytes8[wp.name]) for wp in weights),
        key=lambda c: c.gain_per_byte,
        reverse=True,
    )


TRADEOFF_EXTRA = (0.05, 0.10, 0.20, 0.50)
"""The mixes :func:`tradeoff` predicts: the all-INT4 package's bytes plus these shares of
them, spent on INT8 weights."""


@dataclass(frozen=True)
class TradeoffPoint:
    """One quantization choice: its bytes and predicted loss, and how to export it."""

    label: str
    nbytes: int
    predicted_kld: float
    """Mean KL divergence from the float32 model (0 for the float package: the reference)."""
    int8: int
    """How many of the measured 4-bit weights it stores in INT8."""
    size_budget: int | None
    """The ``size_budget`` that exports this choice (None: no budget)."""
    float_choice: bool = False
    """The float package (no 4-bit weights): the reference the others are measured against."""


@dataclass(frozen=True)
class Tradeoff:
    """Size against predicted quality for the choices between float and all-INT4."""

    points: tuple[TradeoffPoint, ...]
    """The base plan first (all-INT4, or INT4 with the user's own INT8 weights), the
    float package last, bytes growing and predicted KLD falling between."""
    costs: tuple[WeightCost, ...]
    dtype: str
    method: str = "rtn"
    """The quantizer the costs were measured with (GPTQ's are measured by round to nearest:
    a GPTQ export loses less than predicted)."""

    def kld_text(self, point: TradeoffPoint) -> str:
        """A point's predicted KLD in words; the float package is the reference only in
        fp32 (fp16 / bf16 rounding is not measured)."""
        if not point.float_choice:
            return f"{point.predicted_kld:.3g}"
        return "0 (the reference)" if self.dtype == "fp32" else f"~0 ({self.dtype}: not measured)"

    def lines(self) -> list[str]:
        """One line per choice, for the command line and the studio's log."""
        base = self.points[0].nbytes
        return [
            f"{p.label:<28} {p.nbytes:>15,} B  {p.nbytes / base - 1:>+7.1%}  KLD {self.kld_text(p)}"
            for p in self.points
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "method": self.method,
            "points": [asdict(p) for p in self.points],
            "costs": [asdict(c) for c in self.costs],
        }


def tradeoff(
    model_dir: str | os.PathLike[str] | None,
    export_plan: ExportPlan,
    replan: Any,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
    *,
    calibration: str | os.PathLike[str] | None = None,
) -> Tradeoff:
    """Predicted size and quality of the choices between the float package and all-INT4,
    from one measurement of every 4-bit weight (:func:`measure`): all-INT4, the mixes that
    spend :data:`TRADEOFF_EXTRA` more bytes on the INT8 weights that save the most, every
    4-bit weight in INT8, and the float package. ``export_plan`` is the all-INT4 plan
    (its own ``size_budget`` / ``target_kld`` are set aside); ``replan(options)`` plans
    other options of the same model; ``calibration``: the text measured on (default: the
    options' own, else the built-in sample).

    Raises:
        OptionsError: No checkpoint (a preset, random weights), no 4-bit weight, a model
            too large to measure here or no tokenizer for the calibration text.
    """
    options = replace(export_plan.options, size_budget=None, target_kld=None)
    flag = option("tradeoff")
    folder = _checkpoint(model_dir, options, f"{flag} measures")
    weights = _measurable(export_plan, flag)
    progress(0.0, "measuring each weight's sensitivity")
    costs = _costs(folder, export_plan, weights, replan, progress, cancel, calibration=calibration)
    base = export_plan.nbytes
    total = sum(c.kld4 for c in costs)
    kept = sum(wp.quantized and wp.bits == 8 for wp in export_plan.decoder.weights)
    if kept:
        label = f"as chosen, {kept} kept in INT8"
    elif options.weight_bits == options.embedding_bits == 4:
        label = "all INT4"
    else:  # 4-bit weights with float or INT8 tables, or the other way round
        label = "as chosen"
    points = [TradeoffPoint(label, base, total, 0, None)]
    all_int8 = base + sum(c.bytes8 - c.bytes4 for c in costs)
    for extra in TRADEOFF_EXTRA:
        budget = int(base * (1 + extra))
        if budget >= all_int8:
            break
        chosen, predicted, nbytes = pick(costs, replace(options, size_budget=budget), base)
        if nbytes > points[-1].nbytes:  # a budget that buys nothing more is not a choice
            label = f"INT4 + INT8, +{extra:.0%} bytes"
            points.append(TradeoffPoint(label, nbytes, predicted, len(chosen), budget))
    label = "4-bit weights in INT8"
    points.append(TradeoffPoint(label, all_int8, total * INT8_RATIO, len(costs), all_int8))
    floats = replan(
        replace(
            options,
            weight_bits=None,
            embedding_bits=None,
            keep_int8=(),
            quant_method="rtn",  # the float package quantizes nothing
            calibration=None,
        )
    )
    dtype = floats.options.dtype
    points.append(TradeoffPoint(f"float ({dtype})", floats.nbytes, 0.0, 0, None, True))
    return Tradeoff(tuple(points), tuple(costs), dtype, options.block_quantizer)


def pick(
    costs: list[WeightCost], options: ExportOptions, base: int
) -> tuple[list[str], float, int]:
    """``(INT8 names, predicted KLD, bytes)`` for the options' budget or target, from the
    measured costs and the all-INT4 bytes ``base``. Greedy by KLD per byte, and by KLD
    alone (one large sensitive weight can beat many small ones under a budget): for a
    target, the fewer bytes of the two that reach it; for a budget, the less KLD."""
    total = sum(c.kld4 for c in costs)
    by_ratio = sorted(costs, key=lambda c: c.gain_per_byte, reverse=True)
    by_gain = sorted(costs, key=lambda c: c.kld4, reverse=True)
    picks = [_fill(order, options, total, base) for order in (by_ratio, by_gain)]
    target = options.target_kld
    reached = [p for p in picks if target is not None and p[1] <= target]
    if reached:
        return min(reached, key=lambda p: (p[2], p[1]))
    return min(picks, key=lambda p: (p[1], p[2]))


def _fill(
    order: list[WeightCost], options: ExportOptions, total: float, base: int
) -> tuple[list[str], float, int]:
    """Take weights to INT8 in ``order`` while the budget holds or until the target is
    reached: ``(names, predicted KLD, bytes)``."""
    predicted, nbytes, chosen = total, base, []
    for cost in order:
        if options.target_kld is not None and predicted <= options.target_kld:
            break
        extra = cost.bytes8 - cost.bytes4
        if options.size_budget is not None and nbytes + extra > options.size_budget:
            continue  # a smaller weight further down may still fit
        chosen.append(cost.name)
        nbytes += extra
        predicted -= cost.kld4 * (1 - INT8_RATIO)
    return chosen, predicted, nbytes


def _flag(options: ExportOptions) -> str:
    if options.size_budget is not None:
        return option("size_budget", f"{options.size_budget:,}")
    return option("target_kld", options.target_kld)


def measure(
    model_dir: Path,
    export_plan: ExportPlan,
    weights: list[WeightPlan],
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
    *,
    calibration: str | os.PathLike[str] | None = None,
) -> dict[str, float]:
    """Weight name -> mean KL divergence on the calibration text (``calibration``, else
    the options') with only that weight in 4 bits (its round trip through the export's
    quantizer), the rest float."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from engine.calibration import _windows, calibration_tokens, float_model

    cancel = cancel or CancelToken()
    options, spec = export_plan.options, export_plan.spec
    method = options.block_quantizer
    text = str(calibration) if calibration is not None else options.calibration
    ids = calibration_tokens(model_dir, text, spec.vocab_size)
    windows = _windows(ids, spec.bos_token_id)[:WINDOWS]
    with tempfile.TemporaryDirectory(prefix="es-sensitivity-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        progress(0.0, "sensitivity: the float model")
        model_file = float_model(model_dir, work, cancel)
        graph = onnx.load(str(model_file), load_external_data=False).graph
        stored = {t.name: t for t in graph.initializer}
        cpu = ["CPUExecutionProvider"]
        reference = _run(ort.InferenceSession(str(model_file), providers=cpu), windows)
        out: dict[str, float] = {}
        for index, wp in enumerate(weights):
            cancel.raise_if_cancelled()
            overrides = {}
            for part in wp.weight.parts or (wp.weight,):
                if part.name not in stored:
                    raise OptionsError(f"sensitivity: {part.name} is not in the float model")
                values = numpy_helper.to_array(stored[part.name], base_dir=str(model_file.parent))
                overrides[part.name] = _round_trip(
                    values, wp, method, transposed=wp.weight.role == "linear"
                )
            session_options = ort.SessionOptions()
            kept = {}
            for name, array in overrides.items():
                kept[name] = ort.OrtValue.ortvalue_from_numpy(array)
                session_options.add_initializer(name, kept[name])
            session = ort.InferenceSession(str(model_file), session_options, providers=cpu)
            try:
                out[wp.name] = _kld(reference, _run(session, windows))
            finally:
                del session, kept  # before the temp folder goes (Windows keeps open files)
            progress((index + 1) / len(weights), f"sensitivity: {index + 1}/{len(weights)}")
    return out


def _round_trip(values: np.ndarray, wp: WeightPlan, method: str, *, transposed: bool) -> np.ndarray:
    """``values`` (as the float package stores them) through ``method``'s 4-bit blocks and
    back, blocks along the input axis and scales in the dtype of the package's."""
    from engine.quantize import dequantize, quantize

    assert wp.bits is not None and wp.block_size is not None
    rows = values.T if transposed else values
    blocks = quantize(
        np.ascontiguousarray(rows, dtype=np.float32),
        bits=wp.bits,
        block_size=wp.block_size,
        symmetric=wp.symmetric,
        scale_dtype=numpy_dtype(wp.dtype),
        method=method,
        name=wp.name,
    )
    back = dequantize(blocks, bits=wp.bits, block_size=wp.block_size)[:, : rows.shape[1]]
    back = back.astype(np.float32)
    return np.ascontiguousarray(back.T if transposed else back)


def _run(session: Any, windows: list[np.ndarray]) -> list[np.ndarray]:
    """Log-probabilities [S, V] of every position of each window, one prefill each."""
    from engine.float_runner import prefill_feeds
    from engine.runtime.quality import log_softmax

    inputs = {i.name: i for i in session.get_inputs()}
    return [
        log_softmax(session.run(["logits"], prefill_feeds(inputs, seq))[0][0]) for seq in windows
    ]


def _kld(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    total = sum(float((np.exp(p) * (p - q)).sum()) for p, q in zip(reference, other, strict=True))
    return total / sum(len(p) for p in reference)
