"""The checkpoint's float text decoder for calibration, run a segment of layers at a time.

Calibration needs each quantized linear's input on real text, as the float model computes
it. Exporting that model first (fp32: ~20 GB for Gemma 4 E2B) and running it in one
onnxruntime session would hold every weight in memory at once. Here the fp32 CPU decoder
is built in memory with lazy weights (:class:`~engine.weights.factory.TensorFactory`, the
export's own graph and rewrites) and never written: its graph is cut into segments of about
:data:`SEGMENT_BYTES` of weights each, at the places where the fewest activations cross
(between layers), and every calibration window goes through one segment before the next
one's weights are produced. What crosses a cut is kept per window in a work folder (one
``.npy`` file each: the page cache, not the process, holds them). A Gather over a table of
more than :data:`TABLE_BYTES` (token and per-layer tables) runs in numpy on the rows the
windows look up, read in one pass over the table's rows.

:class:`SegmentedRun` is resumable: :meth:`SegmentedRun.measure` runs on from where the
previous call stopped to the segment that produces the values asked for, so inputs asked
for in the forward's order cost one pass over the model in all.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.options import ExportOptions
from engine.plan import plan
from engine.plan_model import ExportPlan
from engine.progress import CancelToken, Progress
from engine.spec import ModelSpec
from engine.weights.sources import WeightSource

SEGMENT_BYTES = 256 * 1024**2
"""Float weights one segment's session holds (about one Gemma 4 E2B layer in fp32)."""
TABLE_BYTES = 64 * 1024**2
"""Gathers over larger tables run in numpy on the rows looked up."""
INLINE_BYTES = 1024**2
"""Initializers up to this size go inside a segment's model (shape inference reads the
constants of Reshape and the like there); larger ones are handed to onnxruntime as
arrays."""
SEQUENCE_LENGTH = 256
"""Tokens per calibration prefill: the float model's context."""

FLOAT_OPTIONS = ExportOptions(
    ep="cpu",
    dtype="fp32",
    attention="standard",
    modalities=("text",),
    max_length=SEQUENCE_LENGTH,
)
"""The float model calibration runs: the text decoder, fp32 on CPU."""
Accumulate = Callable[[str, np.ndarray], None]
"""Told every captured value of every window (its name, the array)."""


class FloatDecoder:
    """The checkpoint's text decoder as an fp32 CPU graph (standard attention, a
    :data:`SEQUENCE_LENGTH` context) whose weights are produced only when a segment runs."""

    def __init__(
        self,
        spec: ModelSpec,
        source: Callable[[ExportPlan], WeightSource],
        cancel: CancelToken,
    ) -> None:
        """``source``: the weights of the float model's plan (a checkpoint's, or random
        ones for a preset: :meth:`from_checkpoint` for the first)."""
        import onnx_ir as ir

        from engine.models import build_session
        from engine.rewrites import apply_rewrites
        from engine.weights.factory import TensorFactory

        export_plan = plan(spec, FLOAT_OPTIONS)
        factory = TensorFactory(export_plan, source(export_plan), cancel)
        model = build_session(export_plan, "decoder", factory)
        apply_rewrites(model, export_plan.caps)
        self.tensors: dict[str, Any] = {}
        """Initializer name -> its (lazy) tensor."""
        values = [v for g in model.graphs() for v in g.initializers.values()]
        for value in values:
            if value.const_value is not None:
                self.tensors[value.name or ""] = value.const_value
                # A reference to no file: the structure is serialized without the bytes.
                value.const_value = ir.ExternalTensor(
                    "(produced when run)",
                    0,
                    value.const_value.nbytes,
                    value.const_value.dtype,
                    shape=value.const_value.shape,  # type: ignore[arg-type]
                    name=value.name or "",
                )
        self.proto = ir.serde.serialize_model(model)
        """The graph, every initializer an external reference to nothing."""
        for value in values:
            if value.name in self.tensors:
                value.const_value = self.tensors[value.name]

    @classmethod
    def from_checkpoint(cls, model_dir: Path, cancel: CancelToken) -> FloatDecoder:
        """The float decoder of a checkpoint folder (its tensors checked first)."""
        from engine.models import family_for, load_spec
        from engine.weights.sources import CheckpointSource

        spec = load_spec(model_dir)
        family = family_for(spec.source_model_type)

        def checkpoint(export_plan: ExportPlan) -> WeightSource:
            source = CheckpointSource(
                model_dir,
                (wp.weight for s in export_plan.sessions for wp in s.weights if not wp.shares),
                lambda key: family.ignorable(spec, export_plan.options, key),
            )
            source.validate()
            return source

        return cls(spec, checkpoint, cancel)

    def weight(self, name: str) -> np.ndarray:
        """One initializer, whole, as the float model holds it."""
        array = np.asarray(self.tensors[name].numpy())
        return array if array.flags.c_contiguous else np.ascontiguousarray(array)

    def nbytes(self, name: str) -> int:
        tensor = self.tensors.get(name)
        return int(tensor.nbytes) if tensor is not None else 0

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (sorted, distinct) of a table, from one pass over its rows as
        produced (never the whole table in memory)."""
        from engine.weights.factory import PieceTensor

        tensor = self.tensors[name]
        if not isinstance(tensor, PieceTensor):
            return np.ascontiguousarray(tensor.numpy()[ids])
        shape = tuple(tensor.planned.shape)
        out: np.ndarray | None = None
        begin = 0
        for chunk in tensor.chunks():
            part = np.asarray(chunk[tensor.planned.part]).reshape(-1, *shape[1:])
            if out is None:
                out = np.empty((len(ids), *shape[1:]), dtype=part.dtype)
            end = begin + part.shape[0]
            first, last = np.searchsorted(ids, [begin, end])
            out[first:last] = part[ids[first:last] - begin]
            begin = end
        if out is None or begin != shape[0]:
            raise AssertionError(f"{name}: produced {begin} rows, planned {shape[0]}")
        return out


@dataclass(frozen=True)
class _Segment:
    nodes: tuple[Any, ...]
    """NodeProtos, in graph order; one Gather over a large table for a numpy segment."""
    inputs: tuple[str, ...]
    """Activations it reads that earlier segments or the graph's inputs made."""
    weights: tuple[str, ...]
    produced: frozenset[str]
    table: str | None = None
    """The table a numpy Gather segment reads."""


class SegmentedRun:
    """The float decoder run over calibration windows a segment at a time, resumable."""

    def __init__(
        self,
        decoder: FloatDecoder,
        windows: list[np.ndarray],
        wanted: Collection[str],
        cancel: CancelToken,
        *,
        cuts_after: Collection[str] = (),
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        """``wanted``: every activation any call may ask for (the graph is cut after the
        last of them); ``cuts_after``: activations a segment ends with (where one call's
        values end and the next call's begin: the next call runs on from there)."""
        self.decoder, self.windows, self.cancel = decoder, windows, cancel
        graph = decoder.proto.graph
        self._graph_inputs = {i.name: i for i in graph.input}
        nodes = _needed(graph, wanted)
        forced = {i for i, node in enumerate(nodes) if set(node.output) & set(cuts_after)}
        self.segments = _cut(nodes, decoder, segment_bytes, forced)
        self._segment_of = {
            name: index for index, seg in enumerate(self.segments) for name in seg.produced
        }
        missing = set(wanted) - self._segment_of.keys()
        if missing:
            raise KeyError(f"the float model computes no {sorted(missing)[:3]}")
        self._last_read: dict[str, int] = {}
        for index, seg in enumerate(self.segments):
            for name in seg.inputs:
                self._last_read[name] = index
        self.position = 0
        """The next segment to run."""
        self.restarts = 0
        """Times a call asked for values already passed (and the run began again)."""
        self._work = Path(tempfile.mkdtemp(prefix="es-float-run-"))

    def measure(self, names: Collection[str], accumulate: Accumulate, progress: Progress) -> None:
        """Run on to the segment that makes the last of ``names``, telling ``accumulate``
        each of them for every window (from the start again if one was made before the
        run's position)."""
        where = {name: self._segment_of[name] for name in names}
        if any(index < self.position for index in where.values()):
            self.restarts += 1
            self._clear()
            self.position = 0
        stop = max(where.values(), default=-1) + 1
        total = max(1, stop - self.position)
        first = self.position
        while self.position < stop:
            self.cancel.raise_if_cancelled()
            index = self.position
            segment = self.segments[index]
            captured = [n for n in names if where[n] == index]

            def say(window: int, index: int = index) -> None:
                done = (index - first + window / len(self.windows)) / total
                progress(
                    done,
                    f"calibration: layers {index + 1}/{len(self.segments)}, "
                    f"window {window}/{len(self.windows)}",
                )

            if segment.table is not None:
                self._gather(index, segment, captured, accumulate)
            else:
                self._run(index, segment, captured, accumulate, say)
            self._forget(index)
            self.position += 1

    def segment_of(self, name: str) -> int:
        """The segment that computes activation ``name``."""
        return self._segment_of[name]

    def close(self) -> None:
        """Remove the work folder (what crossed the segments)."""
        shutil.rmtree(self._work, ignore_errors=True)

    # -- the segments -------------------------------------------------------------------

    def _feeds(self, seq: np.ndarray) -> dict[str, np.ndarray]:
        return prefill_feeds({name: _Shape(info) for name, info in self._graph_inputs.items()}, seq)

    def _stored(self, index: int, segment: _Segment) -> list[str]:
        """What segment ``index`` makes that a later one reads."""
        return [n for n in segment.produced if self._last_read.get(n, -1) > index]

    def _inputs(self, window: int, seq: np.ndarray, segment: _Segment) -> dict[str, np.ndarray]:
        feeds = {}
        graph_feeds: dict[str, np.ndarray] | None = None
        for name in segment.inputs:
            if name in self._graph_inputs:
                graph_feeds = graph_feeds or self._feeds(seq)
                feeds[name] = graph_feeds[name]
            else:
                feeds[name] = np.load(self._file(name, window))
        return feeds

    def _run(
        self,
        index: int,
        segment: _Segment,
        captured: list[str],
        accumulate: Accumulate,
        say: Callable[[int], None],
    ) -> None:
        import onnxruntime as ort

        stored = self._stored(index, segment)
        outputs = list(dict.fromkeys([*stored, *captured]))
        first = self._inputs(0, self.windows[0], segment)
        proto = self._proto(segment, first, outputs)
        options = ort.SessionOptions()
        large = [w for w in segment.weights if self.decoder.nbytes(w) > INLINE_BYTES]
        values = [ort.OrtValue.ortvalue_from_numpy(self.decoder.weight(w)) for w in large]
        if values:
            options.add_external_initializers(large, values)
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        del values  # onnxruntime holds what it needs
        try:
            for window, seq in enumerate(self.windows):
                self.cancel.raise_if_cancelled()
                feeds = first if window == 0 else self._inputs(window, seq, segment)
                results = dict(zip(outputs, session.run(outputs, feeds), strict=True))
                for name in stored:
                    np.save(self._file(name, window), results[name])
                for name in captured:
                    accumulate(name, results[name])
                say(window + 1)
        finally:
            del session

    def _gather(
        self, index: int, segment: _Segment, captured: list[str], accumulate: Accumulate
    ) -> None:
        (node,) = segment.nodes
        (out,) = node.output
        indices = [
            self._inputs(w, seq, segment)[node.input[1]] for w, seq in enumerate(self.windows)
        ]
        ids = np.unique(np.concatenate([i.reshape(-1) for i in indices]))
        rows = self.decoder.rows(node.input[0], ids)
        for window, found in enumerate(indices):
            value = rows[np.searchsorted(ids, found)]
            if out in self._stored(index, segment):
                np.save(self._file(out, window), value)
            if out in captured:
                accumulate(out, value)

    def _proto(self, segment: _Segment, feeds: Mapping[str, np.ndarray], outputs: list[str]) -> Any:
        from onnx import helper, numpy_helper

        source = self.decoder.proto
        inputs = [
            self._graph_inputs[name]
            if name in self._graph_inputs
            else helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(feeds[name].dtype), feeds[name].shape
            )
            for name in segment.inputs
        ]
        tensors = {t.name: t for t in source.graph.initializer}
        initializers = [
            tensors[w]
            if self.decoder.nbytes(w) > INLINE_BYTES
            else numpy_helper.from_array(self.decoder.weight(w), w)
            for w in segment.weights
        ]
        graph = helper.make_graph(
            list(segment.nodes),
            "segment",
            inputs,
            [helper.make_empty_tensor_value_info(name) for name in outputs],
            initializers,
        )
        model = helper.make_model(graph, opset_imports=list(source.opset_import))
        model.ir_version = source.ir_version
        return model

    def _file(self, name: str, window: int) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        return self._work / f"{safe}-{abs(hash(name)) % 10**8}-{window}.npy"

    def _forget(self, index: int) -> None:
        """Remove what no segment after ``index`` reads."""
        for name, last in self._last_read.items():
            if last == index and name not in self._graph_inputs:
                for window in range(len(self.windows)):
                    self._file(name, window).unlink(missing_ok=True)

    def _clear(self) -> None:
        for path in self._work.glob("*.npy"):
            path.unlink()


def prefill_feeds(inputs: Mapping[str, Any], seq: np.ndarray) -> dict[str, np.ndarray]:
    """One prefill of the float model (``inputs``: its session's inputs by name): the
    tokens, a mask of ones and empty fp32 past keys and values."""
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.asarray(seq, dtype=np.int64)[None],
        "attention_mask": np.ones((1, len(seq)), np.int64),
    }
    for name, info in inputs.items():
        if name.startswith("past_key_values"):
            feeds[name] = np.zeros((1, info.shape[1], 0, info.shape[3]), np.float32)
    return feeds


class _Shape:
    """A graph input's dims as ``prefill_feeds`` reads them (``shape[1]``, ``shape[3]``)."""

    def __init__(self, info: Any) -> None:
        self.shape = [
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in info.type.tensor_type.shape.dim
        ]


def _needed(graph: Any, wanted: Collection[str]) -> list[Any]:
    """The graph's nodes that ``wanted`` depends on, in graph order."""
    made = {out: index for index, node in enumerate(graph.node) for out in node.output}
    keep: set[int] = set()
    stack = list(wanted)
    while stack:
        index = made.get(stack.pop())
        if index is None or index in keep:
            continue
        keep.add(index)
        stack.extend(graph.node[index].input)
    return [node for index, node in enumerate(graph.node) if index in keep]


def computed_order(proto: Any, names: Collection[str]) -> dict[str, int]:
    """Each of ``names`` by the position of the node that computes it in ``proto``'s
    graph (the order a run makes them)."""
    wanted = set(names)
    return {
        out: index
        for index, node in enumerate(proto.graph.node)
        for out in node.output
        if out in wanted
    }


def _cut(nodes: list[Any], decoder: FloatDecoder, budget: int, forced: set[int]) -> list[_Segment]:
    """Segments of at most ``budget`` weight bytes (or one node's), each ending where the
    fewest activations are live within its span, or after a node of ``forced`` (by
    index); a Gather over a table of more than :data:`TABLE_BYTES` is a segment of its
    own."""
    if any(a.type == a.GRAPH for n in nodes for a in n.attribute):
        return [_segment(nodes, decoder)]  # subgraphs read outer values unseen here
    last_read: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            last_read[name] = index
    live: list[int] = []  # activations live before each node
    alive: set[str] = set()
    for index, node in enumerate(nodes):
        alive = {name for name in alive if last_read.get(name, -1) >= index}
        live.append(len(alive))
        alive.update(node.output)

    def table(node: Any) -> bool:
        return node.op_type == "Gather" and decoder.nbytes(node.input[0]) > TABLE_BYTES

    segments: list[_Segment] = []
    start = 0
    while start < len(nodes):
        if table(nodes[start]):
            segments.append(_segment(nodes[start : start + 1], decoder, table=True))
            start += 1
            continue
        used: set[str] = set()
        total, end, full = 0, start, False
        while end < len(nodes) and not table(nodes[end]):
            new = {n for n in nodes[end].input if n in decoder.tensors and n not in used}
            cost = sum(decoder.nbytes(n) for n in new)
            if total + cost > budget and end > start:
                full = True
                break
            used |= new
            total += cost
            end += 1
            if end - 1 in forced:
                break
        if full and end - start > 1:
            # end where the fewest activations cross (ties: the latest such place), in
            # the span's second half (fewer are live early on, before each layer's inputs)
            end = min(range((start + end) // 2 + 1, end + 1), key=lambda i: (live[i], -i))
        segments.append(_segment(nodes[start:end], decoder))
        start = end
    return segments


def _segment(nodes: list[Any], decoder: FloatDecoder, *, table: bool = False) -> _Segment:
    produced = {out for node in nodes for out in node.output if out}
    read = [name for node in nodes for name in node.input if name]
    weights = tuple(dict.fromkeys(n for n in read if n in decoder.tensors))
    inputs = tuple(dict.fromkeys(n for n in read if n not in produced and n not in decoder.tensors))
    if table:
        weights = ()
    return _Segment(
        tuple(nodes), inputs, weights, frozenset(produced), nodes[0].input[0] if table else None
    )
