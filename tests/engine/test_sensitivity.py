"""Mixed precision by measured sensitivity (``size_budget`` / ``target_kld``): each 4-bit
weight's cost is the KL divergence of the float model with only that weight in INT4, and
the INT8 weights are picked for a size or a quality."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine import sensitivity
from engine.errors import OptionsError
from engine.models import load_spec
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from tests._support.cli import cli
from tests._support.tiny_llama import make_checkpoint

BASE = dict(ep="cpu", dtype="fp32", weight_bits=4, embedding_bits=4, block_size=16)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-shaped, tied head (its table is one of the choices), hidden 80."""
    root = tmp_path_factory.mktemp("sensitivity")
    make_checkpoint(root / "checkpoint", "qwen2")
    return root / "checkpoint"


@pytest.fixture(scope="module")
def all_int4(qwen2: Path):
    return plan(load_spec(qwen2), ExportOptions(**BASE, accuracy_level=0))


def test_a_weights_cost_is_the_kld_of_a_package_with_only_it_in_int4(qwen2, all_int4, tmp_path):
    """The override of one initializer in the float model measures what a real package
    with that weight alone in INT4 (MatMulNBits, the rest float) loses."""
    import onnxruntime as ort

    from engine.calibration import _windows, calibration_tokens

    name = "layers.1.mlp.down_proj.weight"
    (weight,) = [wp for wp in all_int4.decoder.weights if wp.name == name]
    measured = sensitivity.measure(qwen2, all_int4, [weight])[name]
    assert measured > 0

    others = [wp.name for wp in sensitivity.candidates(all_int4) if wp.name != name]
    alone = ExportOptions(**BASE, accuracy_level=0, keep_float=tuple(others))
    export(tmp_path / "alone", model_dir=qwen2, options=alone)
    export(tmp_path / "float", model_dir=qwen2, options=ExportOptions(ep="cpu", dtype="fp32"))
    ids = calibration_tokens(qwen2, None, all_int4.spec.vocab_size)
    windows = _windows(ids, all_int4.spec.bos_token_id)[: sensitivity.WINDOWS]

    def run(folder: Path) -> list[np.ndarray]:
        session = ort.InferenceSession(str(folder / "model.onnx"))
        return sensitivity._run(session, windows)

    package = sensitivity._kld(run(tmp_path / "float"), run(tmp_path / "alone"))
    assert package == pytest.approx(measured, rel=1e-3)


def test_a_size_budget_picks_int8_weights_within_it(qwen2, all_int4, tmp_path):
    budget = int(all_int4.nbytes * 1.08)
    options = ExportOptions(**BASE, accuracy_level=0, size_budget=budget)
    result = export(tmp_path / "pkg", model_dir=qwen2, options=options)
    int8 = [wp.name for wp in result.plan.decoder.weights if wp.quantized and wp.bits == 8]
    assert int8 and all_int4.nbytes < result.plan.nbytes <= budget
    note = next(n for n in result.notes if n.startswith("mixed precision by measured"))
    assert f"{len(int8)} of {len(sensitivity.candidates(all_int4))} 4-bit weights" in note
    # The choice, as the plan predicts it: fewer bytes than the budget, less KLD than INT4.
    spec = load_spec(qwen2)
    choice = sensitivity.choose(qwen2, plan(spec, options), lambda o: plan(spec, o))
    assert sorted(choice.int8) == sorted(int8)
    assert choice.predicted_kld < choice.all_int4_kld and choice.nbytes == result.plan.nbytes
    # nothing left out would still have fitted: the budget is used up
    left = budget - choice.nbytes
    assert all(c.bytes8 - c.bytes4 > left for c in choice.costs if c.name not in int8)


def test_a_target_kld_takes_the_fewest_int8_weights(qwen2, all_int4):
    spec = load_spec(qwen2)
    base = ExportOptions(**BASE, accuracy_level=0)

    def choose(target: float):
        options = replace(base, target_kld=target)
        return sensitivity.choose(qwen2, plan(spec, options), lambda o: plan(spec, o))

    loose = choose(1e9)
    assert loose.int8 == () and loose.nbytes == all_int4.nbytes
    half = choose(loose.all_int4_kld / 2)
    assert half.int8 and half.predicted_kld <= loose.all_int4_kld / 2
    assert len(half.int8) < len(half.costs)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(size_budget=1000, target_kld=0.1), "not both"),
        (dict(weight_bits=8, embedding_bits=None, size_budget=10**6), "choose INT8 for some 4-bit"),
        (dict(target_kld=-1.0), "of 0 or more"),
    ],
)
def test_bad_requests_are_refused_up_front(changes, message):
    with pytest.raises(OptionsError, match=message):
        ExportOptions(**{**BASE, **changes}).resolve()


def test_what_cannot_be_measured_is_refused(qwen2, all_int4, tmp_path):
    small = ExportOptions(**BASE, size_budget=all_int4.nbytes - 1)
    with pytest.raises(OptionsError, match="below the all-INT4 package's"):
        export(tmp_path / "a", model_dir=qwen2, options=small)
    random = ExportOptions(**BASE, size_budget=10**9, random_weights=True)
    with pytest.raises(OptionsError, match="a preset has no weights"):
        export(tmp_path / "b", preset="qwen3-0.6b", options=random)
    with pytest.raises(OptionsError, match="random weights have none"):
        export(tmp_path / "c", model_dir=qwen2, options=random)
    assert not any((tmp_path / name).exists() for name in "abc")


def test_plan_shows_the_choice_per_tensor(qwen2, all_int4):
    budget = int(all_int4.nbytes * 1.08)
    shown = cli(
        "plan",
        "--model",
        str(qwen2),
        "--weight-bits",
        "4",
        "--embedding-bits",
        "4",
        "--block-size",
        "16",
        "--size-budget",
        str(budget),
        "--top",
        "100",
    )
    assert shown.returncode == 0, shown.stderr
    assert "note: mixed precision by measured sensitivity" in shown.stdout
    assert "int8 b16" in shown.stdout and "int4 b16" in shown.stdout


def test_the_pick_meets_a_target_with_the_fewest_bytes_and_a_budget_with_the_least_kld():
    """One large sensitive weight against two small ones: a target two small ones reach
    takes them (20 B), not the large one (1000 B); a budget that fits only the small ones
    takes them; one that fits the large one alone takes whichever predicts less."""
    from engine.sensitivity import INT8_RATIO, WeightCost, pick

    costs = [
        WeightCost("large", 1.0, 1000, 2000),
        WeightCost("b", 0.6, 10, 20),
        WeightCost("c", 0.35, 10, 20),
    ]
    total, base = 1.95, 1020
    names, predicted, nbytes = pick(costs, ExportOptions(target_kld=1.2), base)
    assert sorted(names) == ["b", "c"] and nbytes == base + 20
    assert predicted == pytest.approx(total - 0.95 * (1 - INT8_RATIO))
    names, _, nbytes = pick(costs, ExportOptions(size_budget=base + 25), base)
    assert sorted(names) == ["b", "c"] and nbytes == base + 20
    names, predicted, _ = pick(costs, ExportOptions(size_budget=base + 1000), base)
    assert names == ["large"]  # 1.0 of KLD bought against the small pair's 0.95
    names, predicted, nbytes = pick(costs, ExportOptions(target_kld=10.0), base)
    assert (names, nbytes) == ([], base) and predicted == pytest.approx(total)


def test_the_tradeoff_predicts_what_each_choice_exports(qwen2, all_int4, tmp_path):
    """From all-INT4 to float: bytes grow and predicted KLD falls; each mix's size budget
    exports exactly its bytes, and what the packages really lose is what was predicted
    (the costs add: 0.85-0.98x of the prediction on this model)."""
    import onnxruntime as ort

    from engine.calibration import _windows, calibration_tokens

    spec = load_spec(qwen2)
    tradeoff = sensitivity.tradeoff(qwen2, all_int4, lambda o: plan(spec, o))
    points = tradeoff.points
    assert [p.label for p in points][:2] == ["all INT4", "INT4 + INT8, +5% bytes"]
    assert points[0].nbytes == all_int4.nbytes and points[0].size_budget is None
    assert points[-1].float_choice and points[-1].label == "float (fp32)"
    float_plan = plan(spec, ExportOptions(ep="cpu", dtype="fp32"))
    assert points[-1].nbytes == float_plan.nbytes
    sizes = [p.nbytes for p in points]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    klds = [p.predicted_kld for p in points]
    assert klds == sorted(klds, reverse=True) and klds[-1] == 0.0
    assert points[-2].int8 == len(tradeoff.costs) == len(sensitivity.candidates(all_int4))
    assert all(p.size_budget is None or p.nbytes <= p.size_budget for p in points)

    ids = calibration_tokens(qwen2, None, spec.vocab_size)
    windows = _windows(ids, spec.bos_token_id)[: sensitivity.WINDOWS]

    def loss(folder: Path) -> float:
        session = ort.InferenceSession(str(folder / "model.onnx"))
        return sensitivity._kld(reference, sensitivity._run(session, windows))

    export(tmp_path / "float", model_dir=qwen2, options=ExportOptions(ep="cpu", dtype="fp32"))
    session = ort.InferenceSession(str(tmp_path / "float" / "model.onnx"))
    reference = sensitivity._run(session, windows)
    export(tmp_path / "int4", model_dir=qwen2, options=ExportOptions(**BASE, accuracy_level=0))
    assert loss(tmp_path / "int4") == pytest.approx(points[0].predicted_kld, rel=0.3)
    mix = next(p for p in points if p.label == "INT4 + INT8, +20% bytes")
    options = ExportOptions(**BASE, accuracy_level=0, size_budget=mix.size_budget)
    assert export(tmp_path / "mix", model_dir=qwen2, options=options).plan.nbytes == mix.nbytes
    assert loss(tmp_path / "mix") == pytest.approx(mix.predicted_kld, rel=0.3)


def test_a_budget_predicts_what_the_tradeoff_line_of_that_budget_does(qwen2, all_int4):
    """At +5% the tied table's INT8 form does not fit, yet it stays INT4 and costs the most:
    the build's choice counts it (it was left unmeasured, and the prediction was a tenth)."""
    spec = load_spec(qwen2)
    tradeoff = sensitivity.tradeoff(qwen2, all_int4, lambda o: plan(spec, o))
    point = next(p for p in tradeoff.points if p.label == "INT4 + INT8, +5% bytes")
    table = next(c for c in tradeoff.costs if c.name.startswith("embed_tokens"))
    assert all_int4.nbytes + table.bytes8 - table.bytes4 > point.size_budget  # does not fit
    options = replace(all_int4.options, size_budget=point.size_budget)
    choice = sensitivity.choose(qwen2, plan(spec, options), lambda o: plan(spec, o))
    assert len(choice.costs) == len(tradeoff.costs) and table.name not in choice.int8
    assert choice.all_int4_kld == pytest.approx(tradeoff.points[0].predicted_kld, rel=1e-6)
    assert choice.predicted_kld == pytest.approx(point.predicted_kld, rel=1e-6)
    assert choice.nbytes == point.nbytes


def test_plan_lists_the_tradeoff(qwen2, tmp_path):
    bits = ["--weight-bits", "4", "--embedding-bits", "4", "--block-size", "16"]
    shown = cli("plan", "--model", str(qwen2), *bits, "--tradeoff")
    assert shown.returncode == 0, shown.stderr
    assert "size against quality" in shown.stdout
    for label in ("all INT4", "INT4 + INT8, +10% bytes", "4-bit weights in INT8", "float (fp32)"):
        assert label in shown.stdout
    budget = cli("plan", "--model", str(qwen2), *bits, "--tradeoff", "--size-budget", "1MB")
    assert budget.returncode != 0 and "drop --size-budget / --target-kld" in budget.stderr
    preset = cli("plan", "--preset", "qwen3-0.6b", *bits, "--tradeoff")
    assert preset.returncode != 0 and "a preset has no weights" in preset.stderr
    float_only = cli("plan", "--model", str(qwen2), "--tradeoff")
    assert float_only.returncode != 0 and "no 4-bit weight" in float_only.stderr
    # the user's own text, whatever the quantizer: other costs
    text = tmp_path / "mine.txt"
    text.write_text("def spam(eggs):\n    return [egg * 2 for egg in eggs]\n" * 400)
    mine = cli("plan", "--model", str(qwen2), *bits, "--calibration", str(text), "--tradeoff")
    assert mine.returncode == 0, mine.stderr
    assert (
        mine.stdout.split("size against quality")[1]
        != shown.stdout.split("size against quality")[1]
    )
    # GPTQ's costs are measured by round to nearest; the float line quantizes nothing
    gptq = cli("plan", "--model", str(qwen2), *bits, "--quant-method", "gptq", "--tradeoff")
    assert gptq.returncode == 0, gptq.stderr
    assert "float (fp32)" in gptq.stdout
    # the user's own INT8 weights stay, and the first line says so
    kept = cli("plan", "--model", str(qwen2), *bits, "--keep-int8", "layers.0.*", "--tradeoff")
    assert kept.returncode == 0, kept.stderr
    first = kept.stdout.split("size against quality")[1].splitlines()[1]
    assert "kept in INT8" in first and "+0.0%" in first
