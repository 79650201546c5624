"""The float decoder calibration runs a few layers at a time (engine.float_runner), against
the whole float model in one onnxruntime session: the same activations, resumable, a
segment's weights at a time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from engine import calibration, float_runner
from engine.errors import CancelledError
from engine.progress import CancelToken
from tests._support.tiny_gemma import make_checkpoint


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Gemma 4 (per-layer inputs, KV sharing, double-wide MLPs, a tied head), its
    float model's linear inputs and calibration windows."""
    root = tmp_path_factory.mktemp("float-runner")
    make_checkpoint(root / "checkpoint")
    decoder = float_runner.FloatDecoder.from_checkpoint(root / "checkpoint", CancelToken())
    inputs = calibration._linear_inputs(decoder.proto)
    names = sorted(set(inputs.values()))
    ids = np.random.default_rng(0).integers(4, 320, 700)
    windows = calibration._windows(ids, bos=2)
    return root, decoder, names, windows


def _whole_model(root: Path, names: list[str], windows: list[np.ndarray]) -> list[dict]:
    """Every name for every window from the float package in one session."""
    import onnx
    import onnxruntime as ort

    work = Path(tempfile.mkdtemp(dir=root))
    model_file = calibration.float_model(root / "checkpoint", work, CancelToken())
    proto = onnx.load(str(model_file), load_external_data=False)
    for name in names:
        proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    probe = model_file.parent / "probe.onnx"
    onnx.save(proto, str(probe))
    session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    return [
        dict(zip(names, session.run(names, float_runner.prefill_feeds(inputs, seq)), strict=True))
        for seq in windows
    ]


def _collect(run: float_runner.SegmentedRun, names: list[str]) -> dict[str, list[np.ndarray]]:
    got: dict[str, list[np.ndarray]] = {}
    run.measure(names, lambda name, value: got.setdefault(name, []).append(value), _quiet)
    return got


def _quiet(fraction: float, message: str) -> None:
    pass


def test_segments_compute_what_the_whole_float_model_does(gemma, monkeypatch):
    """Cut into segments of a few weights each, with the token and per-layer tables
    looked up in numpy, the run gives every linear input of every window as the whole
    float model does; no segment holds more weights than its budget (or one node's)."""
    root, decoder, names, windows = gemma
    monkeypatch.setattr(float_runner, "TABLE_BYTES", 1024)  # the tiny tables count as large
    budget = sum(decoder.nbytes(n) for n in decoder.tensors) // 12
    run = float_runner.SegmentedRun(decoder, windows, names, CancelToken(), segment_bytes=budget)
    try:
        tables = [s for s in run.segments if s.table is not None]
        assert {s.table for s in tables} >= {"embed_tokens.weight"}, [s.table for s in tables]
        assert len(run.segments) - len(tables) > 6
        for segment in run.segments:
            held = sum(decoder.nbytes(w) for w in segment.weights)
            assert held <= budget or len(segment.nodes) == 1, (held, budget)
        got = _collect(run, names)
        assert run.restarts == 0
    finally:
        run.close()
    whole = _whole_model(root, names, windows)
    assert len(names) > 20
    for name in names:
        for window, expected in enumerate(whole):
            np.testing.assert_allclose(got[name][window], expected[name], rtol=1e-5, atol=1e-6)


def test_a_run_goes_on_from_where_it_stopped(gemma):
    """Values asked for in the model's order cost one run; asking for one the run has
    passed starts it again, with the same values."""
    _, decoder, names, windows = gemma
    order = float_runner.computed_order(decoder.proto, names)
    early, late = (
        sorted(names, key=order.__getitem__)[:3],
        sorted(names, key=order.__getitem__)[-3:],
    )
    run = float_runner.SegmentedRun(
        decoder, windows, names, CancelToken(), cuts_after=[early[-1]], segment_bytes=1
    )
    try:
        first = _collect(run, early)
        then = _collect(run, late)
        assert run.restarts == 0 and then.keys() == set(late)
        again = _collect(run, early)
        assert run.restarts == 1
        for name in early:
            for a, b in zip(first[name], again[name], strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        run.close()
    assert not run._work.exists()


def test_a_cancelled_run_stops_between_segments(gemma):
    _, decoder, names, windows = gemma
    cancel = CancelToken()
    run = float_runner.SegmentedRun(decoder, windows, names, cancel, segment_bytes=1)
    seen: list[str] = []

    def progress(fraction: float, message: str) -> None:
        seen.append(message)
        cancel.cancel()

    try:
        with pytest.raises(CancelledError):
            run.measure(names, lambda name, value: None, progress)
        assert run.position < len(run.segments) - 1, run.position
        assert seen and seen[0].startswith("calibration: layers 1/"), seen[:2]
    finally:
        run.close()


def test_full_size_e2b_is_cut_between_layers_and_its_tables_never_reach_a_session():
    """Gemma 4 E2B's float decoder (~20 GB in fp32) at its real sizes: no session holds
    more than a segment's weights (about one double-wide layer), its token and per-layer
    tables (1.6 and 9.4 GB) are looked up in numpy, and the cuts fall where one residual
    stream value crosses (a layer's input, or its stream after the MLP's residual add, before
    the per-layer input gate: each layer's last add waits for the next layer's norm) beside
    what every layer reads (per-layer inputs, masks, rotary tables, shared keys and values)."""
    from engine.presets import load_preset
    from engine.weights.sources import RandomSource

    decoder = float_runner.FloatDecoder(
        load_preset("gemma4-e2b"), lambda plan: RandomSource(0), CancelToken()
    )
    names = sorted(set(calibration._linear_inputs(decoder.proto).values()))
    run = float_runner.SegmentedRun(decoder, [np.arange(256)], names, CancelToken())
    try:
        sessions = [s for s in run.segments if s.table is None]
        tables = {s.table: decoder.nbytes(s.table or "") for s in run.segments if s.table}
        assert sorted(tables.values())[-2:] == [262144 * 1536 * 4, 262144 * 35 * 256 * 4]
        held = [sum(decoder.nbytes(w) for w in s.weights) for s in sessions]
        assert max(held) <= float_runner.SEGMENT_BYTES, max(held)
        assert sum(held) > 6 * 1024**3  # every linear is run (the tables apart)
        # about one per layer and a prologue (three of the narrow first 15 fit in two)
        assert 30 <= len(sessions) <= 40, len(sessions)
        crossing = [len(s.inputs) for s in sessions]
        # a segment over parts of three narrow layers reads each one's per-layer input,
        # rotary table and mask
        assert max(crossing) <= 14, crossing
    finally:
        run.close()


def test_the_lower_half_gram_summed_over_batches_is_x_transposed_x(monkeypatch):
    """Calibration sums only the blocks of ``x^T x`` on and below the diagonal, then
    mirrors them: the whole product, for a width that is not whole blocks, in float64 and
    float32 sums alike."""
    monkeypatch.setattr(calibration, "GRAM_BLOCK", 48)
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal((n, 200)).astype(np.float32) for n in (64, 30, 100)]
    for dtype in (np.float64, np.float32):
        total = np.zeros((200, 200), dtype)
        for x in batches:
            calibration._add_lower_gram(total, x)
        calibration._mirror_lower(total)
        x = np.concatenate(batches).astype(np.float64)
        np.testing.assert_allclose(total, x.T @ x, rtol=1e-5, atol=1e-3)
        assert np.array_equal(total, total.T)
