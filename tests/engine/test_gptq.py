"""GPTQ (``quant_method="gptq"``): error feedback from each linear's calibration inputs,
written as plain MatMulNBits bytes.

Checked against what it claims: the layer's output error (not the weights') is lower than
round-to-nearest's on inputs with outlier channels; the package computes exactly its own
dequantized weights in transformers (a tied head's token table too); act order with static
blocks keeps round to nearest's scales and beats natural order; bad requests are refused up
front. The gain on a trained model: benchmarks/trained_reference.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.errors import OptionsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.quantize import dequantize, gptq, quantize
from engine.quantize.gptq import TABLE_LOOKUP, Feedback, gptq_quantize
from tests._support.quantized import dequantized_model, forced_logits, hf_forced_logits
from tests._support.tiny_gemma import hf_greedy
from tests._support.tiny_llama import make_checkpoint

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]


def _skewed_inputs(rng: np.random.Generator, tokens: int, width: int) -> np.ndarray:
    """Activations with a few outlier channels and correlated columns (as trained models'
    are; plain Gaussian inputs make every method look alike)."""
    x = rng.standard_normal((tokens, width)) * (1 + 5 * (rng.random(width) < 0.05))
    mix = np.eye(width) + 0.3 * rng.standard_normal((width, width)) / np.sqrt(width)
    return (x @ mix).astype(np.float32)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize(("bits", "symmetric"), [(4, False), (4, True), (8, False)])
def test_gptq_lowers_the_layer_output_error(bits: int, symmetric: bool, act_order: bool):
    rng = np.random.default_rng(0)
    x = _skewed_inputs(rng, 2048, 256)
    w = (rng.standard_normal((96, 256)) * 0.05).astype(np.float32)
    feedback = Feedback.from_hessian(x.T.astype(np.float64) @ x, act_order=act_order)
    kwargs = dict(bits=bits, block_size=32, symmetric=symmetric)
    ours = gptq_quantize(w, feedback, scale_dtype=np.dtype(np.float32), **kwargs)
    rtn = quantize(w, scale_dtype=np.float32, **kwargs)

    def output_error(blocks) -> float:
        return float(np.mean(((dequantize(blocks, bits=bits, block_size=32) - w) @ x.T) ** 2))

    assert output_error(ours) < 0.75 * output_error(rtn)
    assert ours.qweight.shape == rtn.qweight.shape and ours.scales.shape == rtn.scales.shape
    assert ours.zero_points.shape == rtn.zero_points.shape


def test_act_order_quantizes_the_strongest_inputs_first_with_static_blocks(monkeypatch):
    """Act order: the columns by H's diagonal, largest first; each block's scale and zero
    point are round to nearest's of the weights before feedback (static groups, before the
    scale refit), so the layout stays plain MatMulNBits; on inputs with outlier channels it
    beats natural order."""
    monkeypatch.setattr(gptq, "REFIT_STEPS", 0)
    rng = np.random.default_rng(3)
    x = _skewed_inputs(rng, 2048, 256)
    h = x.T.astype(np.float64) @ x
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    act = Feedback.from_hessian(h, act_order=True)
    assert act.order is not None and sorted(act.order) == list(range(256))
    assert np.all(np.diff(np.diag(h)[act.order]) <= 1e-9)
    kwargs = dict(bits=4, block_size=32, symmetric=False, scale_dtype=np.dtype(np.float32))
    ordered = gptq_quantize(w, act, **kwargs)
    rtn = quantize(w, bits=4, block_size=32, symmetric=False, scale_dtype=np.float32)
    np.testing.assert_array_equal(ordered.scales, rtn.scales)
    np.testing.assert_array_equal(ordered.zero_points, rtn.zero_points)
    natural = gptq_quantize(w, Feedback.from_hessian(h), **kwargs)

    def output_error(blocks) -> float:
        return float(np.mean(((dequantize(blocks, bits=4, block_size=32) - w) @ x.T) ** 2))

    assert output_error(ordered) < output_error(natural)


def test_the_scale_refit_lowers_the_output_error_and_keeps_the_codes(monkeypatch):
    """After the codes are chosen, each block's scale is refit to the layer's output error
    (codes and zero points unchanged): lower than with round to nearest's scales, and
    further passes change little."""
    rng = np.random.default_rng(5)
    x = _skewed_inputs(rng, 2048, 256)
    h = x.T.astype(np.float64) @ x
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    kwargs = dict(bits=4, block_size=32, symmetric=False, scale_dtype=np.dtype(np.float16))

    def run(steps: int):
        monkeypatch.setattr(gptq, "REFIT_STEPS", steps)
        blocks = gptq_quantize(w, Feedback.from_hessian(h, act_order=True), **kwargs)
        error = dequantize(blocks, bits=4, block_size=32) - w
        return blocks, float(np.mean((error @ x.T) ** 2))

    (plain, before), (refit, after), (_, twice) = run(0), run(1), run(2)
    np.testing.assert_array_equal(plain.qweight, refit.qweight)
    np.testing.assert_array_equal(plain.zero_points, refit.zero_points)
    assert not np.array_equal(plain.scales, refit.scales) and refit.scales.dtype == np.float16
    assert after < 0.98 * before and twice <= after * 1.001


def test_a_looked_up_table_weighs_its_own_error_too():
    """A tied table's objective adds its own squared error (the lookup reads the same
    codes) to the head's output error: its weights land closer to the float table, at a
    small cost in output error that stays well under round to nearest's; ``lookup=0`` is
    the head's objective unchanged."""
    rng = np.random.default_rng(4)
    x = _skewed_inputs(rng, 2048, 256)
    h = x.T.astype(np.float64) @ x
    w = (rng.standard_normal((128, 256)) * 0.05).astype(np.float32)
    kwargs = dict(bits=4, block_size=32, symmetric=False, scale_dtype=np.dtype(np.float32))
    head = gptq_quantize(w, Feedback.from_hessian(h, act_order=True), **kwargs)
    same = gptq_quantize(w, Feedback.from_hessian(h, act_order=True, lookup=0.0), **kwargs)
    np.testing.assert_array_equal(head.qweight, same.qweight)
    table = gptq_quantize(
        w, Feedback.from_hessian(h, act_order=True, lookup=TABLE_LOOKUP), **kwargs
    )
    rtn = quantize(w, bits=4, block_size=32, symmetric=False, scale_dtype=np.float32)

    def errors(blocks) -> tuple[float, float]:
        delta = dequantize(blocks, bits=4, block_size=32) - w
        return float(np.mean(delta**2)), float(np.mean((delta @ x.T) ** 2))

    (head_weight, head_output), (table_weight, table_output) = errors(head), errors(table)
    _, rtn_output = errors(rtn)
    assert table_weight < 0.9 * head_weight
    assert head_output <= table_output < 0.75 * rtn_output


def test_damping_grows_where_there_are_few_tokens_per_column():
    """At least :data:`~engine.quantize.gptq.DAMPING`, columns / tokens in between, at
    most :data:`~engine.quantize.gptq.MAX_DAMPING`; no token count: the least."""
    assert gptq.damping(128, 16_384) == gptq.DAMPING
    assert gptq.damping(512, 16_384) == pytest.approx(512 / 16_384)
    assert gptq.damping(6_144, 16_384) == gptq.MAX_DAMPING
    assert gptq.damping(6_144, None) == gptq.DAMPING


def test_damping_by_tokens_per_column_lowers_the_error_on_unseen_inputs():
    """With two calibration tokens per column GPTQ fits the calibration inputs' own noise:
    the damping :func:`~engine.quantize.gptq.damping` gives there costs a little of the
    error on the calibration inputs and lowers it on fresh inputs of the same kind (what
    the trained reference's held-out text shows, benchmarks/trained_reference.py)."""
    rng = np.random.default_rng(0)
    x = _skewed_inputs(rng, 512 + 8192, 256)
    seen, unseen = x[:512], x[512:]
    w = (rng.standard_normal((96, 256)) * 0.05).astype(np.float32)
    h = seen.T.astype(np.float64) @ seen

    def errors(tokens: int | None) -> tuple[float, float]:
        feedback = Feedback.from_hessian(h, act_order=True, tokens=tokens)
        blocks = gptq_quantize(
            w, feedback, bits=4, block_size=32, symmetric=False, scale_dtype=np.dtype(np.float32)
        )
        e = dequantize(blocks, bits=4, block_size=32) - w
        return float(np.mean((e @ seen.T) ** 2)), float(np.mean((e @ unseen.T) ** 2))

    (seen_least, unseen_least), (seen_damped, unseen_damped) = errors(None), errors(512)
    assert gptq.damping(256, 512) == gptq.MAX_DAMPING
    assert seen_damped > seen_least
    assert unseen_damped < 0.92 * unseen_least  # 0.84-0.85x over seeds 0-5


def test_inputs_that_are_always_zero_are_ignored():
    """A dead input channel (H's diagonal 0) does not break the factorisation."""
    rng = np.random.default_rng(1)
    x = _skewed_inputs(rng, 512, 64)
    x[:, 5] = 0
    w = rng.standard_normal((8, 64)).astype(np.float32)
    feedback = Feedback.from_hessian(x.T.astype(np.float64) @ x)
    blocks = gptq_quantize(
        w, feedback, bits=4, block_size=32, symmetric=False, scale_dtype=np.dtype(np.float32)
    )
    assert np.isfinite(dequantize(blocks, bits=4, block_size=32)).all()


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gptq")
    model = make_checkpoint(root / "checkpoint", "qwen2")
    tokens, _ = hf_greedy(model, PROMPT, 16)
    return root, model, tokens


def test_a_gptq_package_is_its_own_dequantized_weights(qwen2, tmp_path):
    """The package computes exactly the weights GPTQ wrote (plain MatMulNBits bytes), and
    they are not round to nearest's. Whether they are closer to the float model is a
    question for a trained model (random weights and a random tokenizer's activations carry
    no structure for the feedback to use): benchmarks/trained_reference.py measures it."""
    root, model, tokens = qwen2
    base = dict(dtype="fp32", weight_bits=4, block_size=16, accuracy_level=0)
    logits = {}
    for method in ("rtn", "gptq"):
        out = tmp_path / method
        result = export(
            out,
            model_dir=root / "checkpoint",
            options=ExportOptions(**base, quant_method=method),
        )
        logits[method] = forced_logits(out, PROMPT, tokens)
        theirs = hf_forced_logits(dequantized_model(model, result), PROMPT, tokens)
        assert float(np.abs(logits[method] - theirs).max()) <= 1e-4, method
        if method == "gptq":
            (note,) = [n for n in result.notes if n.startswith("GPTQ (act order): 18 weights")]
            assert "calibration tokens, damping " in note
    assert float(np.abs(logits["gptq"] - logits["rtn"]).max()) > 1e-3


def test_the_token_table_of_a_tied_head_is_calibrated_as_the_head(qwen2, tmp_path):
    """Qwen2's head reads the token table's bytes: GPTQ quantizes the table with the head's
    input statistics (its rows are the head's outputs), and the package still computes its
    own dequantized weights, table included."""
    root, model, tokens = qwen2
    base = dict(dtype="fp32", weight_bits=4, embedding_bits=4, block_size=16, accuracy_level=0)
    out = tmp_path / "gptq"
    result = export(
        out, model_dir=root / "checkpoint", options=ExportOptions(**base, quant_method="gptq")
    )
    assert any("the token table too" in note for note in result.notes), result.notes
    ours = forced_logits(out, PROMPT, tokens)
    theirs = hf_forced_logits(dequantized_model(model, result), PROMPT, tokens)
    assert float(np.abs(ours - theirs).max()) <= 1e-4
    rtn = tmp_path / "rtn"
    export(rtn, model_dir=root / "checkpoint", options=ExportOptions(**base))

    def table(folder: Path) -> np.ndarray:
        import onnx
        from onnx import numpy_helper

        proto = onnx.load(str(folder / "model.onnx"))
        (found,) = [t for t in proto.graph.initializer if t.name == "embed_tokens.weight.qweight"]
        return numpy_helper.to_array(found)

    assert not np.array_equal(table(out), table(rtn))


def test_only_the_looked_up_table_gets_the_lookup_term(qwen2, monkeypatch):
    """Calibration gives the tied table (and nothing else) the lookup term: with
    :data:`TABLE_LOOKUP` at 0 the table's feedback is the head's input's, and every other
    weight's feedback is the same either way."""
    import engine.calibration as calibration
    from engine.models import load_spec
    from engine.plan import plan

    root, _, _ = qwen2
    options = ExportOptions(weight_bits=4, embedding_bits=4, block_size=16, quant_method="gptq")
    export_plan = plan(load_spec(root / "checkpoint"), options)
    ids = calibration.prepare(root / "checkpoint", export_plan)
    first = calibration.calibrate(root / "checkpoint", ids, export_plan)
    ours = {k: v.factor for k, v in first.feedback.items()}
    first.close()
    monkeypatch.setattr(calibration, "TABLE_LOOKUP", 0.0)
    second = calibration.calibrate(root / "checkpoint", ids, export_plan)
    plain = {k: v.factor for k, v in second.feedback.items()}
    second.close()
    assert ours.keys() == plain.keys() and "embed_tokens.weight" in ours
    changed = {k for k in ours if not np.array_equal(ours[k], plain[k])}
    assert changed == {"embed_tokens.weight"}


def test_the_summary_says_the_damping_and_when_more_text_would_help():
    """The export's GPTQ note names the calibration tokens and the damping range; where
    inputs got the most damping and the text was shorter than calibration reads, it says
    that more text would fit them closer."""
    from engine.calibration import MAX_TOKENS, describe

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 64))

    def feedback(cols: int, tokens: int) -> Feedback:
        return Feedback.from_hessian(x[:, :cols].T @ x[:, :cols], tokens=tokens)

    short = describe({"a", "b"}, [feedback(16, 512), feedback(64, 512)])
    assert "512 calibration tokens, damping 0.031-0.1 (at most 10 tokens per column for 1" in short
    full = describe({"a"}, [feedback(64, MAX_TOKENS), feedback(64, MAX_TOKENS)])
    assert f"{MAX_TOKENS:,} calibration tokens, damping 0.01" in full
    assert "longer calibration text" not in full
    assert "calibration tokens" not in describe({"a"}, [Feedback.from_hessian(x.T @ x)])
    # what the export keeps for this note holds no arrays (E2B's factors add up to GBs)
    kept = replace(feedback(64, 512), source="x").stripped()
    assert (kept.source, kept.tokens, kept.damping) == ("x", 512, feedback(64, 512).damping)
    assert kept.factor.size == kept.dead.size == 0 and kept.hessian is None
    assert describe({"a", "b"}, [feedback(16, 512).stripped(), kept]) == short


def test_the_factor_of_the_inverse_is_the_textbook_one_and_wide_inputs_take_float32(
    monkeypatch,
):
    """One Cholesky factorisation and one triangular inverse give the upper factor of
    ``H^-1`` the direct way does (inverse, then its Cholesky) to rounding; inputs wider
    than WIDE_INPUT keep it in float32 (and no H for the refit)."""
    rng = np.random.default_rng(3)
    for cols in (40, 700):
        x = rng.standard_normal((2 * cols, cols)) * np.exp(rng.standard_normal(cols))
        h = x.T @ x + 0.01 * np.eye(cols) * np.mean(np.diag(x.T @ x))
        inverse = np.linalg.inv(np.linalg.cholesky(h))
        direct = np.linalg.cholesky(inverse.T @ inverse).T
        ours = gptq._upper_factor_of_inverse(np.ascontiguousarray(h[::-1, ::-1]))
        assert np.abs(ours - direct).max() <= 1e-12 * np.abs(direct).max()
        assert np.array_equal(ours, np.triu(ours))
    wide = rng.standard_normal((600, 300))
    small = Feedback.from_hessian(wide.T @ wide, act_order=True)
    monkeypatch.setattr(gptq, "WIDE_INPUT", 200)
    big = Feedback.from_hessian(wide.T @ wide, act_order=True)
    assert small.factor.dtype == np.float64 and small.hessian is not None
    assert big.factor.dtype == np.float32 and big.hessian is None
    np.testing.assert_allclose(
        big.factor, small.factor, rtol=0, atol=1e-5 * np.abs(small.factor).max()
    )


def _textbook_gptq(w: np.ndarray, feedback: Feedback, bits: int, block: int) -> np.ndarray:
    """GPTQ's codes one column at a time as the paper writes it (no lazy batches, no
    transposed copy): each column rounded with its block's parameters (act order: round to
    nearest's of the weights before feedback; natural order: of the weights as fed back
    when the block is reached), its error spread over every later column at once."""
    from engine.quantize.rtn import as_float32, encode, reciprocal, rtn_params

    rows, cols = w.shape
    order = np.arange(cols) if feedback.order is None else feedback.order
    u = feedback.factor
    work = w.astype(np.float64)[:, order]
    codes = np.empty((rows, cols), dtype=np.uint8)

    def params(values: np.ndarray) -> tuple[np.ndarray, ...]:
        scale, zp = rtn_params(
            values.min(axis=1), values.max(axis=1), bits, False, np.dtype(np.float16), None
        )
        return reciprocal(scale), zp.astype(np.float32), as_float32(scale)

    static = [params(w[:, b : b + block]) for b in range(0, cols, block)]
    current: tuple[np.ndarray, ...] = ()
    for j in range(cols):
        b = order[j] // block
        if feedback.order is None and j % block == 0:
            current = params(work[:, j : j + block].astype(np.float32))
        inv, zf, sf = current if feedback.order is None else static[b]
        q = encode(work[:, j].astype(np.float32), inv, zf, bits)
        error = (work[:, j] - (q - zf) * sf) / u[j, j]
        work[:, j + 1 :] -= np.outer(error, u[j, j + 1 :])
        codes[:, order[j]] = q
    return codes


@pytest.mark.parametrize("act_order", [False, True])
def test_the_batched_column_loop_is_the_textbook_one(monkeypatch, act_order: bool):
    """The lazy batches, spans and transposed layout that make GPTQ fast at E2B's widths
    choose the codes the one-column-at-a-time algorithm does (to rounding: a sum taken in
    another order may move a value across a rounding boundary)."""
    monkeypatch.setattr(gptq, "REFIT_STEPS", 0)
    monkeypatch.setattr(gptq, "_SPAN", 256)  # several spans and lazy batches in 640 columns
    rng = np.random.default_rng(11)
    x = _skewed_inputs(rng, 2048, 640)
    w = (rng.standard_normal((48, 640)) * 0.05).astype(np.float32)
    feedback = Feedback.from_hessian(x.T.astype(np.float64) @ x, act_order=act_order)
    ours = gptq_quantize(
        w, feedback, bits=4, block_size=32, symmetric=False, scale_dtype=np.dtype(np.float16)
    )
    codes = np.stack([ours.qweight & 15, ours.qweight >> 4], axis=-1).reshape(48, 640)
    textbook = _textbook_gptq(w, feedback, 4, 32)
    assert np.mean(codes == textbook) >= 0.999
    assert np.abs(codes.astype(int) - textbook).max() <= 1


def test_calibration_damps_by_the_tokens_it_measured(qwen2, monkeypatch):
    """Every input's feedback is damped for the calibration tokens its statistics were
    summed over (every window's)."""
    import engine.calibration as calibration
    from engine.models import load_spec
    from engine.plan import plan

    root, _, _ = qwen2
    options = ExportOptions(weight_bits=4, embedding_bits=4, block_size=16, quant_method="gptq")
    export_plan = plan(load_spec(root / "checkpoint"), options)
    ids = calibration.prepare(root / "checkpoint", export_plan)
    seen: list[int | None] = []
    made = Feedback.from_hessian.__func__  # type: ignore[attr-defined]

    def recording(cls, hessian, **kwargs):
        seen.append(kwargs.get("tokens"))
        return made(cls, hessian, **kwargs)

    monkeypatch.setattr(calibration.Feedback, "from_hessian", classmethod(recording))
    result = calibration.calibrate(root / "checkpoint", ids, export_plan)
    try:
        measured = {name: result.feedback[name] for name in result.feedback}  # every group
        assert "embed_tokens.weight" in measured and len(measured) > 10
    finally:
        result.close()
    windows = calibration._windows(ids, export_plan.spec.bos_token_id)
    assert seen and set(seen) == {sum(w.size for w in windows)}


def test_statistics_measured_a_few_inputs_at_a_time_give_the_same_package(tmp_path, monkeypatch):
    """GPTQ alone measures its inputs in groups, in the order the float model computes
    them and the export writes their weights (a tied table last): with room for only a
    few inputs at a time the package is byte for byte the one measured in one group, each
    group measured once in one run of the model, and its work folder is gone afterwards."""
    import tempfile

    import engine.calibration as calibration

    # Wide enough that every quantized part is over 256 bytes: smaller ones stay inside
    # model.onnx, produced apart from the data file's pass (toy models only).
    checkpoint = tmp_path / "checkpoint"
    make_checkpoint(
        checkpoint,
        "qwen2",
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=192,
    )
    options = ExportOptions(weight_bits=4, embedding_bits=4, block_size=16, quant_method="gptq")
    whole = export(tmp_path / "whole", model_dir=checkpoint, options=options)
    assert not any("groups of inputs" in note for note in whole.notes), whole.notes
    monkeypatch.setattr(calibration, "GROUP_BYTES", 1_000_000)  # ~2 inputs each
    before = set(Path(tempfile.gettempdir()).glob("es-float-run-*"))
    measured: list[int] = []
    measure = calibration.StreamedFeedback._measure
    monkeypatch.setattr(
        calibration.StreamedFeedback,
        "_measure",
        lambda self, index, progress: (measured.append(index), measure(self, index, progress)),
    )
    messages: list[str] = []
    streamed = export(
        tmp_path / "streamed",
        model_dir=checkpoint,
        options=options,
        progress=lambda _, message: messages.append(message),
    )
    assert any(m.startswith("calibration, group 2 of ") for m in messages), messages[:40]
    assert set(Path(tempfile.gettempdir()).glob("es-float-run-*")) == before
    (note,) = [n for n in streamed.notes if "groups of inputs" in n]
    groups, runs = (int(w) for w in note.split() if w.isdigit())
    assert groups > 3 and runs == 1, note
    assert measured == list(range(groups)), measured
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "whole" / name).read_bytes() == (
            tmp_path / "streamed" / name
        ).read_bytes()


def test_groups_asked_for_out_of_order_are_measured_in_one_run(qwen2, monkeypatch):
    """Writer threads can ask for a later group first: the groups before it are measured
    on the way (the run never starts again), with the same statistics as in order."""
    import engine.calibration as calibration
    from engine.models import load_spec
    from engine.plan import plan

    root, _, _ = qwen2
    monkeypatch.setattr(calibration, "GROUP_BYTES", 100_000)
    options = ExportOptions(weight_bits=4, embedding_bits=4, block_size=16, quant_method="gptq")
    export_plan = plan(load_spec(root / "checkpoint"), options)
    ids = calibration.prepare(root / "checkpoint", export_plan)

    def weights_by_group(feedback) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in feedback.groups]
        for weight, index in feedback._group.items():
            out[index].append(weight)
        return out

    in_order = calibration.calibrate(root / "checkpoint", ids, export_plan)
    shuffled = calibration.calibrate(root / "checkpoint", ids, export_plan)
    try:
        streamed = shuffled.feedback
        assert isinstance(streamed, calibration.StreamedFeedback) and len(streamed.groups) > 4
        groups = weights_by_group(streamed)
        asked = [groups[3][0], groups[1][0], groups[2][0], groups[4][0]]
        factors = {w: streamed[w].factor for w in asked}
        assert streamed.run.restarts == 0 and streamed.passes == 5
        for weight in asked:
            np.testing.assert_array_equal(factors[weight], in_order.feedback[weight].factor)
    finally:
        in_order.close()
        shuffled.close()


def test_gptq_takes_the_users_calibration_text(qwen2, tmp_path):
    root, _, _ = qwen2
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(f"t{i % 300}" for i in range(2000)), encoding="utf-8")
    options = ExportOptions(
        weight_bits=4, block_size=16, quant_method="gptq", calibration=str(text)
    )
    export(tmp_path / "pkg", model_dir=root / "checkpoint", options=options)
    assert (tmp_path / "pkg" / "model.onnx").is_file()
    short = tmp_path / "short.txt"
    short.write_text("t1 t2 t3", encoding="utf-8")
    with pytest.raises(OptionsError, match="needs at least 256"):
        export(
            tmp_path / "short",
            model_dir=root / "checkpoint",
            options=ExportOptions(
                weight_bits=4, block_size=16, quant_method="gptq", calibration=str(short)
            ),
        )
    assert not (tmp_path / "short").exists()


def test_bad_gptq_requests_are_refused_up_front(qwen2, tmp_path: Path):
    root, _, _ = qwen2
    with pytest.raises(OptionsError, match="quantizes linear weights"):
        ExportOptions(quant_method="gptq").resolve()
    with pytest.raises(OptionsError, match=r"read by .*gptq and by .*size-budget"):
        ExportOptions(weight_bits=4, calibration="x.txt").resolve()
    with pytest.raises(OptionsError, match="random weights have none"):
        export(
            tmp_path / "random",
            preset="gemma4-tiny",
            options=ExportOptions(weight_bits=4, quant_method="gptq", random_weights=True),
        )
    bare = tmp_path / "bare"
    bare.mkdir()
    for item in (root / "checkpoint").iterdir():
        if not item.name.startswith("tokenizer"):
            (bare / item.name).symlink_to(item)
    with pytest.raises(OptionsError, match="lacks"):
        export(
            tmp_path / "pkg",
            model_dir=bare,
            options=ExportOptions(weight_bits=4, block_size=16, quant_method="gptq"),
        )
    assert not (tmp_path / "pkg").exists() and not (tmp_path / "random").exists()


def test_fused_projections_of_the_webgpu_lowering_are_calibrated_too(qwen2, tmp_path: Path):
    """On WebGPU q/k/v (and gate/up) are one fused MatMulNBits each: its parts read one input,
    so the fused weight is GPTQ-quantized with that input's statistics, and the package still
    computes exactly its own dequantized weights."""
    root, model, tokens = qwen2
    options = ExportOptions(
        ep="webgpu",
        dtype="fp32",
        weight_bits=4,
        block_size=16,
        accuracy_level=0,
        quant_method="gptq",
    )
    result = export(tmp_path / "pkg", model_dir=root / "checkpoint", options=options)
    fused = [wp for wp in result.plan.decoder.weights if wp.quantized and wp.weight.parts]
    assert fused, "the WebGPU lowering fuses projections"
    assert any(note.startswith("GPTQ (act order): ") for note in result.notes)
    ours = forced_logits(tmp_path / "pkg", PROMPT, tokens)
    theirs = hf_forced_logits(dequantized_model(model, result), PROMPT, tokens)
    assert float(np.abs(ours - theirs).max()) <= 1e-4
    # ... and the fused weights really took GPTQ's codes, not RTN's.
    import onnx
    from onnx import numpy_helper

    rtn = replace(options, quant_method="rtn")
    export(tmp_path / "rtn", model_dir=root / "checkpoint", options=rtn)

    def fused_codes(folder: Path) -> dict[str, np.ndarray]:
        proto = onnx.load(str(folder / "model.onnx"))
        names = {f"{wp.name}.qweight" for wp in fused}
        return {
            t.name: numpy_helper.to_array(t) for t in proto.graph.initializer if t.name in names
        }

    gptq_codes, rtn_codes = fused_codes(tmp_path / "pkg"), fused_codes(tmp_path / "rtn")
    assert gptq_codes and gptq_codes.keys() == rtn_codes.keys()
    assert all(not np.array_equal(gptq_codes[k], rtn_codes[k]) for k in gptq_codes)


def test_what_calibration_cannot_do_is_refused_before_the_float_model_runs(tmp_path: Path):
    """From the plan, in one line, before the float model runs: AWQ over the statistics it
    keeps at once (Gemma 3 1B), GPTQ over an input whose statistics alone take more than
    half of what calibration keeps (Llama 3.1 8B's 14,336-wide MLP output); Gemma 4 E2B
    (12,288 wide, its float model ~20 GB: run a few layers at a time) and Gemma 3 1B get as
    far as the missing tokenizer. Calibration windows start with BOS."""
    from engine.calibration import MAX_STATISTICS_BYTES, _windows, prepare, statistics_bytes
    from engine.plan import plan
    from engine.presets import load_preset

    gptq = ExportOptions(weight_bits=4, quant_method="gptq")
    with pytest.raises(OptionsError, match="14,336 wide"):
        prepare(tmp_path, plan(load_preset("llama3.1-8b"), gptq))
    one_b = plan(load_preset("gemma3-1b"), gptq)
    assert statistics_bytes(one_b) > MAX_STATISTICS_BYTES
    with pytest.raises(OptionsError, match="AWQ searches on every linear input"):
        prepare(tmp_path, plan(load_preset("gemma3-1b"), replace(gptq, quant_method="awq")))
    for name in ("gemma3-1b", "gemma4-e2b"):
        with pytest.raises(OptionsError, match="lacks"):
            prepare(tmp_path, plan(load_preset(name), gptq))  # past the sizes: the tokenizer
    windows = _windows(np.arange(10, 1000), bos=2)
    assert all(w[0] == 2 and len(w) == 256 for w in windows) and len(windows) == 3
