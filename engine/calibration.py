"""Calibration for GPTQ and AWQ (``quant_method`` ``gptq``, ``awq``, ``awq-gptq``): each
linear's input statistics from the float model running real text.

The checkpoint's fp32 text decoder runs a few layers at a time, its weights produced from
the checkpoint as each segment runs and never written (:mod:`engine.float_runner`);
token sequences of the calibration text (the user's file, or a built-in sample:
documentation strings of the Python standard library, which every machine has) go
through it one prefill each, and ``H = sum x x^T`` is accumulated per input of every
MatMul over a checkpoint linear. Linears that read the same input (q/k/v, gate/up) share
one :class:`~engine.quantize.gptq.Feedback`. AWQ searches each foldable input's scales on
those statistics and the float model's own weights (:mod:`engine.quantize.awq`,
:mod:`engine.activation_scaling`); GPTQ after AWQ takes the statistics of the scaled
inputs.

GPTQ alone never keeps every input's statistics at once: the inputs are grouped in the
order the model computes them (the export writes their weights in that order), within
:data:`GROUP_BYTES` each, and each group is measured when the export first asks for one
of its weights, by running the model on from where the previous group stopped
(:class:`StreamedFeedback`): one run of the model in all, whatever its size; memory is
one segment's weights and two groups' statistics. AWQ searches on every input's
statistics together, so it keeps them all and stays within :data:`MAX_STATISTICS_BYTES`.
"""

from __future__ import annotations

import ast
import sysconfig
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.activation_scaling import Fold, Scaling, find_folds
from engine.errors import OptionsError, option
from engine.float_runner import (
    FLOAT_OPTIONS,
    SEQUENCE_LENGTH,
    FloatDecoder,
    SegmentedRun,
    computed_order,
)
from engine.options import AWQ_METHODS, GPTQ_METHODS
from engine.plan_model import ExportPlan
from engine.progress import CancelToken, Progress, no_progress
from engine.quantize.awq import InputScales, search_scales
from engine.quantize.gptq import TABLE_LOOKUP, WIDE_INPUT, Feedback

MAX_TOKENS = 16_384
"""Calibration tokens used at most (the first ones of the text)."""
MAX_STATISTICS_BYTES = 4 * 1024**3
"""Most bytes of statistics kept in memory at once: AWQ's ``[K, K]`` sums of every input;
GPTQ takes inputs whose :func:`group_bytes` is at most half of it (two groups are kept)."""
GROUP_BYTES = 256 * 1024**2
"""Most bytes of statistics (:func:`group_bytes`) in one GPTQ group; a wider input is a
group alone. Smaller groups cost nothing more (the model runs on from where the last one
stopped), so they are kept small: two are kept at once."""


def group_bytes(width: int) -> int:
    """What one input of a GPTQ group costs while it is measured and kept: the float64 sum,
    then the float64 factor and the float32 ``H`` its :class:`Feedback` keeps; for inputs
    wider than :data:`~engine.quantize.gptq.WIDE_INPUT` the float32 sum, its float32
    copy and factor while it is factorised."""
    return (12 if width > WIDE_INPUT else 20) * width * width


def sum_bytes(width: int) -> int:
    """One input's ``[K, K]`` sum: float64, float32 where wider than ``WIDE_INPUT``."""
    return (4 if width > WIDE_INPUT else 8) * width * width


SAMPLE_MODULES = (
    "argparse",
    "textwrap",
    "difflib",
    "pathlib",
    "collections/__init__",
    "functools",
    "inspect",
    "dataclasses",
    "json/__init__",
    "logging/__init__",
)
"""Standard-library modules whose documentation strings make the built-in sample."""


def sample_text() -> str:
    """The built-in calibration text: docstrings of :data:`SAMPLE_MODULES` (English prose
    about code, present on every Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in SAMPLE_MODULES:
        try:
            tree = ast.parse((root / f"{name}.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    if not parts:
        raise OptionsError(
            f"no built-in calibration text in {root} (no standard library source here); "
            f"give your own with {option('calibration')}"
        )
    return "\n\n".join(parts)


def calibration_tokens(model_dir: Path, text_file: str | None, vocab_size: int) -> np.ndarray:
    """The calibration text's token ids (at most :data:`MAX_TOKENS`), by the checkpoint's
    own tokenizer."""
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise OptionsError(
            "calibration (GPTQ, AWQ, a size budget) tokenizes its text with the "
            f"checkpoint's tokenizer.json, which {model_dir} lacks; use "
            f"{option('quant_method', 'rtn')} without a budget, or add the tokenizer"
        )
    if text_file is not None:
        try:
            text = Path(text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise OptionsError(
                f"cannot read the calibration text {text_file}: {exc}; give a UTF-8 text file"
            ) from exc
    else:
        text = sample_text()
    from tokenizers import Tokenizer

    ids = np.asarray(Tokenizer.from_file(str(tokenizer_file)).encode(text).ids, dtype=np.int64)
    ids = ids[(ids >= 0) & (ids < vocab_size)][:MAX_TOKENS]
    if len(ids) < SEQUENCE_LENGTH:
        raise OptionsError(
            f"the calibration text has {len(ids)} tokens; calibration needs at least "
            f"{SEQUENCE_LENGTH} (a few pages of text)"
        )
    return ids


_GROUPS = {
    "q_proj": "attention input",
    "k_proj": "attention input",
    "v_proj": "attention input",
    "qkv_proj": "attention input",
    "gate_proj": "mlp input",
    "up_proj": "mlp input",
    "gate_up_proj": "mlp input",
}
"""Linears that read one input (their statistics are one ``[K, K]`` array)."""


def _input_widths(export_plan: ExportPlan) -> dict[tuple[str, str], int]:
    """The width ``K`` of each distinct input of the plan's quantized linears."""
    inputs: dict[tuple[str, str], int] = {}
    for wp in export_plan.decoder.weights:
        if wp.storage != "matmulnbits" or len(wp.weight.shape) != 2:
            continue
        parent, _, leaf = wp.name.removesuffix(".weight").rpartition(".")
        inputs[parent, _GROUPS.get(leaf, leaf)] = wp.weight.shape[1]
    return inputs


def statistics_bytes(export_plan: ExportPlan) -> int:
    """Every input's statistics at once (what AWQ keeps): one ``[K, K]`` sum each."""
    return sum(sum_bytes(k) for k in _input_widths(export_plan).values())


def prepare(model_dir: Path, export_plan: ExportPlan) -> np.ndarray:
    """Everything GPTQ / AWQ can refuse, checked before any expensive work: the tokenizer,
    the calibration text, the memory its statistics take. Returns the token ids."""
    method = export_plan.options.quant_method
    need = statistics_bytes(export_plan)
    if method in AWQ_METHODS and need > MAX_STATISTICS_BYTES:
        raise OptionsError(
            f"AWQ searches on every linear input's statistics at once, {need / 2**30:.1f} GiB "
            f"for this model, more than the {MAX_STATISTICS_BYTES / 2**30:.0f} GiB calibration "
            f"keeps; use {option('quant_method', 'gptq')} (it measures a few inputs at a time)"
        )
    widest = max(_input_widths(export_plan).values(), default=0)
    if group_bytes(widest) > MAX_STATISTICS_BYTES // 2:
        raise OptionsError(
            f"one linear input of this model is {widest:,} wide: its GPTQ statistics alone "
            f"take more than {MAX_STATISTICS_BYTES / 2**31:.0f} GiB; use "
            f"{option('quant_method', 'rtn')} or {option('quant_method', 'search')}"
        )
    spec = export_plan.spec
    return calibration_tokens(model_dir, export_plan.options.calibration, spec.vocab_size)


@dataclass(frozen=True)
class Calibration:
    """What calibration found: GPTQ's feedback per linear weight name (empty unless GPTQ),
    and AWQ's input scaling (None unless AWQ)."""

    feedback: Mapping[str, Feedback]
    """A dict, or GPTQ's :class:`StreamedFeedback` (measured as the export asks)."""
    scaling: Scaling | None = None
    scaled: tuple[InputScales, ...] = ()
    """AWQ's search result of each input it scaled."""
    searched: int = 0
    """Inputs AWQ searched scales for (those it could fold; the others keep ``s = 1``)."""
    awq: bool = False
    """The method asked for AWQ."""

    def close(self) -> None:
        """Remove the float model a streamed feedback still measures with."""
        if isinstance(self.feedback, StreamedFeedback):
            self.feedback.close()

    def written_last(self) -> set[str]:
        """Weights the export should write after the others: tied tables, whose feedback
        is the LM head's input, the last thing the float model computes."""
        if not isinstance(self.feedback, StreamedFeedback):
            return set()
        return self.feedback.tables

    def writers(self, threads: int) -> None:
        """The export writes with ``threads`` threads: a streamed feedback keeps that many
        groups (one thread asks for the next group only when it is done with the last)."""
        if isinstance(self.feedback, StreamedFeedback):
            self.feedback.behind = max(0, threads - 1)

    def report(self, status: Callable[[str], None]) -> None:
        """Where a streamed feedback's later passes say how far they are (the export's
        progress at its current fraction)."""
        if isinstance(self.feedback, StreamedFeedback):
            self.feedback.status = status

    def notes(self) -> list[str]:
        """The export summary's line about AWQ, if it was asked for, or about GPTQ's
        passes when it took more than one."""
        if isinstance(self.feedback, StreamedFeedback) and len(self.feedback.groups) > 1:
            runs = self.feedback.run.restarts + 1
            return [
                f"GPTQ: statistics measured in {len(self.feedback.groups)} groups of inputs, "
                f"layer by layer in {runs} run{'s' * (runs > 1)} of the float model over the "
                "calibration text"
            ]
        if not self.awq:
            return []
        if not self.searched:
            return [
                "AWQ: no quantized linear's input could take its scales (no norm or up "
                "projection to fold them into); round to nearest throughout"
            ]
        if not self.scaled:
            return [
                f"AWQ: round to nearest was best for all {self.searched} inputs searched; "
                "no input is scaled"
            ]
        alphas = sorted(r.alpha for r in self.scaled)
        gain = float(np.exp(np.mean([np.log(r.gain) for r in self.scaled])))
        return [
            f"AWQ: {len(self.scaled)} of {self.searched} inputs scaled (alpha "
            f"{alphas[0]:.2f}-{alphas[-1]:.2f}), their linears' output error on the "
            f"calibration text {1 / gain:.2f}x round to nearest's"
        ]


def calibrate(
    model_dir: str | Path,
    ids: np.ndarray,
    export_plan: ExportPlan,
    *,
    progress: Progress = no_progress,
    cancel: CancelToken | None = None,
) -> Calibration:
    """Run the calibration tokens ``ids`` through the checkpoint's float model and derive
    what ``export_plan``'s quantization method needs: AWQ's scales (``awq``,
    ``awq-gptq``), then GPTQ's feedback from the inputs as scaled (``gptq``,
    ``awq-gptq``). GPTQ alone measures its first group of inputs here and the others when
    the export asks (:class:`StreamedFeedback`): :meth:`Calibration.close` when done."""
    method = export_plan.options.quant_method
    cancel = cancel or CancelToken()
    progress(0.0, "calibration: the float model")
    decoder = FloatDecoder.from_checkpoint(Path(model_dir), cancel)
    proto = decoder.proto
    inputs = _linear_inputs(proto)
    tables = _looked_up(proto) & inputs.keys()
    windows = _windows(ids, export_plan.spec.bos_token_id)
    names = sorted(set(inputs.values()))
    groups = _groups(export_plan, inputs, proto, computed_order(proto, names))
    ends = [max(group, key=computed_order(proto, group).__getitem__) for group in groups]
    run = SegmentedRun(decoder, windows, names, cancel, cuts_after=ends)
    try:
        if method not in AWQ_METHODS:
            streamed = StreamedFeedback(run, windows, inputs, groups, tables)
            streamed.measure_first(progress)
            return Calibration(streamed)
        folds = find_folds(proto, inputs)
        sums = _accumulate(run, names, progress)
        run.close()
        scaling: Scaling | None = None
        scaled: tuple[InputScales, ...] = ()
        searched = 0
        if folds:
            progress(0.9, "calibration: activation-aware scales")
            scaling, scaled, searched = _awq(decoder, export_plan, inputs, folds, sums, cancel)
            if method in GPTQ_METHODS:  # in place: a copy would double the statistics
                for name, h in sums.items():
                    _scale_statistics(name, h, inputs, scaling)
        feedback: dict[str, Feedback] = {}
        if method in GPTQ_METHODS:
            progress(0.95, "calibration: feedback per input")
            feedback = _feedback(sums, inputs, tables, _token_count(windows))
        return Calibration(feedback, scaling, scaled, searched, awq=True)
    except BaseException:
        run.close()
        raise


def _feedback(
    sums: dict[str, np.ndarray], inputs: Mapping[str, str], tables: set[str], tokens: int
) -> dict[str, Feedback]:
    """GPTQ's feedback of every weight whose input is in ``sums`` (one factorisation per
    input; ``tokens``: the calibration tokens they were summed over); a tied head's table
    (in ``tables``) with its lookup term. ``sums`` is emptied as it goes: each sum's
    memory is its factorisation's."""
    looked: dict[str, Feedback] = {}
    for table in tables & inputs.keys():  # first: the head's factorisation takes the sum
        if inputs[table] in sums:
            looked_up = Feedback.from_hessian(
                sums[inputs[table]], act_order=True, lookup=TABLE_LOOKUP, tokens=tokens
            )
            looked[table] = replace(looked_up, source=f"{inputs[table]} (looked up)")
    read = {value for w, value in inputs.items() if w not in tables}  # by a linear
    per_input = {}
    for name in list(sums):
        h = sums.pop(name)
        if name in read:
            made = Feedback.from_hessian(h, act_order=True, tokens=tokens, overwrite=True)
            per_input[name] = replace(made, source=name)
        del h
    return {**{w: per_input[v] for w, v in inputs.items() if v in per_input}, **looked}


def _groups(
    export_plan: ExportPlan,
    inputs: Mapping[str, str],
    proto: Any,
    position: Mapping[str, int],
) -> list[list[str]]:
    """The float model's inputs of the plan's quantized weights in the order the model
    computes them (``position``: of the node that makes each; the export writes their
    weights in that order, a tied table last: :meth:`Calibration.written_last`), cut into
    groups whose statistics take at most :data:`GROUP_BYTES` each."""
    widths = _widths(proto, inputs)
    order: list[str] = []
    for wp in export_plan.decoder.weights:
        if wp.shares or not wp.quantized:
            continue
        for part in wp.weight.parts or (wp.weight,):
            value = inputs.get(part.name)
            if value is not None and value not in order:
                order.append(value)
    order.sort(key=position.__getitem__)
    budget = GROUP_BYTES
    groups: list[list[str]] = []
    used = budget
    for value in order:
        cost = group_bytes(widths[value])
        if used + cost > budget:
            groups.append([])
            used = 0
        groups[-1].append(value)
        used += cost
    return groups


def _widths(proto: Any, inputs: Mapping[str, str]) -> dict[str, int]:
    """Each input's width ``K``, from the weights that read it: ``x @ W`` with ``W`` stored
    ``[K, N]``, a tied head's ``E @ x^T`` with ``E`` ``[V, K]``."""
    dims = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    as_stored = {n.input[1] for n in proto.graph.node if n.op_type == "MatMul"}
    return {
        value: int(dims[weight][0] if weight in as_stored else dims[weight][1])
        for weight, value in inputs.items()
    }


class StreamedFeedback(Mapping[str, Feedback]):
    """GPTQ's feedback per weight name, measured a group of inputs at a time: the first
    time a weight's feedback is asked for, its group's statistics are accumulated by running
    the float model on to the group's last input (:class:`~engine.float_runner.SegmentedRun`,
    from where the previous group stopped), factorised and kept; the latest group stays
    while the next is measured. Thread-safe (the writer quantizes on several threads); the
    export asks for a group's weights together and in the model's order, so each group is
    measured once and the model runs once in all (parts of up to 256 bytes, toy models'
    scales, stay in the model file and are produced apart, which can measure a group
    again)."""

    def __init__(
        self,
        run: SegmentedRun,
        windows: list[np.ndarray],
        inputs: Mapping[str, str],
        groups: list[list[str]],
        tables: set[str],
    ) -> None:
        self.groups = groups
        self.passes = 0
        """Groups measured so far."""
        self.run = run
        self._tokens, self.tables = _token_count(windows), set(tables)
        self.status: Callable[[str], None] = lambda message: None
        """Told how a group measured while the export writes is going."""
        group_of = {value: index for index, group in enumerate(groups) for value in group}
        self._group = {w: group_of[v] for w, v in inputs.items() if v in group_of}
        self._inputs = dict(inputs)
        self._kept: dict[int, dict[str, Feedback]] = {}
        self._next = 0
        """The first group not measured yet."""
        self.behind = 1
        """Groups kept before the one measured last: one per writer thread but the one that
        asked (:meth:`Calibration.writers`); a group asked for again once dropped is
        measured again, from the model's start."""
        self._lock = threading.Lock()

    def measure_first(self, progress: Progress) -> None:
        """Measure the first group now (with progress: the export's calibration step)."""
        if self.groups:
            with self._lock:
                self._measure(0, progress)

    def __getitem__(self, weight: str) -> Feedback:
        index = self._group[weight]  # KeyError: no feedback for this weight
        with self._lock:
            if index not in self._kept:

                def say(fraction: float, message: str) -> None:
                    self.status(
                        f"calibration, group {index + 1} of {len(self.groups)}: "
                        + message.removeprefix("calibration: ")
                    )

                self._measure(index, say)
            return self._kept[index][weight]

    def __iter__(self) -> Iterator[str]:
        return iter(self._group)

    def __len__(self) -> int:
        return len(self._group)

    def _measure(self, index: int, progress: Progress) -> None:
        """Measure group ``index``, and the groups before it not measured yet on the way
        (a writer thread can ask for a later group first: the run would pass theirs)."""
        first = self._next if index >= self._next else index
        for kept in [i for i in self._kept if i < index - self.behind]:  # every writer is past
            del self._kept[kept]
        names = [name for i in range(first, index + 1) for name in self.groups[i]]
        sums = _accumulate(self.run, names, progress)
        for i in range(first, index + 1):
            group = {name: sums.pop(name) for name in self.groups[i]}
            inputs = {w: v for w, v in self._inputs.items() if v in group}
            self._kept[i] = _feedback(group, inputs, self.tables, self._tokens)
        self._next = max(self._next, index + 1)
        self.passes += index + 1 - first

    def close(self) -> None:
        """Drop what is kept and the float model's work folder."""
        self._kept.clear()
        self.run.close()


def _awq(
    decoder: FloatDecoder,
    export_plan: ExportPlan,
    inputs: Mapping[str, str],
    folds: Mapping[str, Fold],
    sums: Mapping[str, np.ndarray],
    cancel: CancelToken,
) -> tuple[Scaling, tuple[InputScales, ...], int]:
    """Search each foldable input's scales on the float model's own weights, for the bits
    and block size the package quantizes its linears with; inputs whose linears (or whose
    fold target) the package does not hold under the same names keep ``s = 1``."""
    proto = decoder.proto
    planned = {
        part.name: wp
        for wp in export_plan.decoder.weights
        if not wp.shares
        for part in (wp.weight.parts or (wp.weight,))
    }
    # a head's W @ x^T holds W as the checkpoint does ([out, in]); x @ W^T holds [in, out]
    as_stored = {n.input[0] for n in proto.graph.node if n.op_type == "MatMul"}
    scaling = Scaling()
    found = []
    searched = 0
    for activation, fold in sorted(folds.items()):
        cancel.raise_if_cancelled()
        linears = sorted(w for w, a in inputs.items() if a == activation)
        plans = [planned.get(w) for w in linears]
        quantized = [p for p in plans if p is not None and p.storage == "matmulnbits"]
        if not quantized or None in plans or fold.weight not in planned:
            continue
        weights = []
        for name in linears:
            array = decoder.weight(name)
            weights.append(array if name in as_stored else array.T)
        searched += 1
        bits = min(p.bits or 8 for p in quantized)
        block = min(p.block_size or 32 for p in quantized)
        result = search_scales(
            weights,
            sums[activation],
            bits=bits,
            block_size=block,
            symmetric=quantized[0].symmetric,
        )
        if result.alpha == 0:
            continue  # round to nearest was best: nothing to fold
        scaling.add(linears, fold, result.scales, int(weights[0].shape[1]))
        found.append(result)
    return scaling, tuple(found), searched


def _scale_statistics(
    activation: str, h: np.ndarray, inputs: Mapping[str, str], scaling: Scaling
) -> None:
    """Turn ``H`` into the input's as the package's scaled linears see it (``x / s``), in
    place."""
    for weight, value in inputs.items():
        if value == activation and weight in scaling.columns:
            inverse = 1.0 / scaling.columns[weight].astype(np.float64)
            h *= inverse[:, None]
            h *= inverse[None, :]
            return


def float_model(model_dir: Path, work: Path, cancel: CancelToken) -> Path:
    """The checkpoint's float decoder (:data:`~engine.float_runner.FLOAT_OPTIONS`) written
    as a CPU package under ``work``, for what runs it whole (the sensitivity measurement);
    returns its model file."""
    from engine.pipeline import export

    result = export(work / "float", model_dir=model_dir, options=FLOAT_OPTIONS, cancel=cancel)
    return work / "float" / result.plan.decoder.filename


def _windows(ids: np.ndarray, bos: int | None) -> list[np.ndarray]:
    """Prefills of :data:`SEQUENCE_LENGTH` tokens, each starting with BOS where the model
    has one (what a prompt looks like; Gemma's activations differ a lot without it)."""
    body = SEQUENCE_LENGTH - (bos is not None)
    out = []
    for start in range(0, max(1, len(ids) - body + 1), body):
        piece = ids[start : start + body]
        out.append(np.concatenate([[bos], piece]).astype(np.int64) if bos is not None else piece)
    return out


def _linear_inputs(proto: Any) -> dict[str, str]:
    """Checkpoint weight -> the activation its MatMul multiplies: ``x @ W^T`` as MatMul
    with the stored ``[in, out]`` weight second, or a tied head's ``E @ x^T`` (the
    embedding table first, the transposed hidden states second: their input is the head's)."""
    weights = {t.name for t in proto.graph.initializer}
    transposed = {
        node.output[0]: node.input[0] for node in proto.graph.node if node.op_type == "Transpose"
    }
    found = {}
    for node in proto.graph.node:
        if node.op_type != "MatMul":
            continue
        first, second = node.input[0], node.input[1]
        if second in weights and second.endswith(".weight"):
            found[second] = first
        elif first in weights and first.endswith(".weight") and second in transposed:
            found[first] = transposed[second]
    return found


def _token_count(windows: list[np.ndarray]) -> int:
    """The calibration tokens the statistics are summed over."""
    return sum(int(w.size) for w in windows)


def _looked_up(proto: Any) -> set[str]:
    """The weights a Gather reads (token tables), of the float model ``proto``."""
    return {node.input[0] for node in proto.graph.node if node.op_type == "Gather"}


GRAM_TOKENS = 2048
"""Tokens whose ``x^T x`` is one product (eight windows): a 256-token window's is a third
slower per token on this project's 2-core machine, and fewer products mean fewer passes
over a wide input's ``[K, K]`` sum."""


GRAM_BLOCK = 1024
"""Rows of ``x^T x`` computed per product: only the blocks on and below the diagonal are
computed, then mirrored once (a 12,288-wide input's sum over 2,048 tokens: 4.1 s -> 1.5 s
on this project's 2 cores, and a 50 MB product at a time instead of a 600 MB one)."""


def _add_lower_gram(total: np.ndarray, x: np.ndarray) -> None:
    """``total += x^T x`` on and below the diagonal blocks (:func:`_mirror_lower` fills the
    rest)."""
    k = x.shape[1]
    for first in range(0, k, GRAM_BLOCK):
        last = min(first + GRAM_BLOCK, k)
        total[first:last, :last] += x[:, first:last].T @ x[:, :last]


def _mirror_lower(total: np.ndarray) -> None:
    """Fill the blocks above the diagonal of a sum :func:`_add_lower_gram` built."""
    for first in range(GRAM_BLOCK, total.shape[0], GRAM_BLOCK):
        last = min(first + GRAM_BLOCK, total.shape[0])
        total[:first, first:last] = total[first:last, :first].T


def _accumulate(run: SegmentedRun, names: list[str], progress: Progress) -> dict[str, np.ndarray]:
    """``H = sum x x^T`` of each input in ``names`` over every calibration window."""
    sums: dict[str, np.ndarray] = {}
    pending: dict[str, list[np.ndarray]] = {}

    def flush(name: str) -> None:
        # x^T x in float32 (a few thousand tokens lose nothing there; half the time of
        # float64), summed over batches in float64 (float32 for wide inputs).
        x = np.concatenate(pending.pop(name))
        if name not in sums:
            k = x.shape[1]
            sums[name] = np.zeros((k, k), np.float32 if k > WIDE_INPUT else np.float64)
        _add_lower_gram(sums[name], x)

    def add(name: str, value: np.ndarray) -> None:
        batch = pending.setdefault(name, [])
        batch.append(np.asarray(value, dtype=np.float32).reshape(-1, value.shape[-1]))
        if sum(len(x) for x in batch) >= GRAM_TOKENS:
            flush(name)

    run.measure(names, add, lambda f, m: progress(0.1 + 0.8 * f, m))
    for name in list(pending):
        flush(name)
    for total in sums.values():
        _mirror_lower(total)
    return sums


def describe(
    applied: set[str], inputs: Sequence[Feedback], fallbacks: set[str] | None = None
) -> str:
    """A note for the export summary: the weights GPTQ quantized (``applied``), over how
    many distinct inputs (their feedback) and with what damping, and those that fell back
    to round to nearest."""
    from engine.quantize import gptq

    tables = sorted(name for name in applied if name.startswith("embed_tokens"))
    note = f"GPTQ (act order): {len(applied)} weights calibrated over {len(inputs)} inputs"
    if tables:
        note += " (the token table too, for the tied head that reads it)"
    tokens = max((f.tokens or 0 for f in inputs), default=0)
    if tokens:
        low, high = min(f.damping for f in inputs), max(f.damping for f in inputs)
        note += f"; {tokens:,} calibration tokens, damping {low:.2g}"
        note += f"-{high:.2g}" if high > low else ""
        most = gptq.MAX_DAMPING
        capped = sum(f.damping >= most for f in inputs)
        if capped and tokens < MAX_TOKENS:
            note += (
                f" (at most {1 / most:.0f} tokens per column for {capped} of them: "
                f"a longer calibration text, up to {MAX_TOKENS:,} tokens, fits them closer)"
            )
    if fallbacks:
        note += f"; {len(fallbacks)} kept round-to-nearest (width not whole blocks): " + ", ".join(
            sorted(fallbacks)[:3]
        )
    return note
