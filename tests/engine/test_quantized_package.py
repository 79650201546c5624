"""Quantized tiny Gemma 4 packages run, compute exactly their quantized weights, and stay close
to the float package.

Method: export one tiny checkpoint as float32 and quantized, generate 64 greedy tokens with the
float package, then teacher-force the float run's tokens through every package (prefill, then
one token per step through the KV cache) and compare the 65 next-token logit rows (the prompt's
last position plus 64 decode steps): top-1 agreement, logits cosine, max abs error.

Block size 16 throughout: ``per_layer_projection`` has K = ``hidden_size_per_layer_input`` = 16,
so 16 is the only block size that fits every linear of the tiny models.

Two facts about the tiny random models shape the thresholds (numbers from
``benchmarks/quantized_accuracy.py``):

* The raw fixture checkpoints are chaotic. Gemma 4 scales attention by 1.0 and relies on the
  q/k RMSNorm weights for the temperature; the fixtures draw those around 1.0, so attention
  logits have a standard deviation of about sqrt(head_dim) = 4-6 and attention is nearly hard.
  A 0.4 % relative weight error (INT8, block 16) then costs 2.6 % logits cosine and flips a
  third of the top-1 tokens, and Gaussian noise of the same size does as much damage (cosine
  0.967 vs INT8's 0.974), so this is the network amplifying any error, not the quantizer.
  INT8 cannot look "near-lossless" on them (top-1 0.69, cosine 0.974) and INT4 is close to
  noise (cosine 0.44).
* The "calm" variants below are the same checkpoints with the q/k norm weights multiplied by
  0.25 (attention logits' standard deviation about 0.3, as with the usual 1/sqrt(d) scaling),
  everything else unchanged. There the error behaves as it should: INT8 is near-lossless
  (cosine 0.9994-0.9997) and its logits MSE is 150-285x below INT4's, near the (255/15)^2 = 289
  that the step sizes predict. The accuracy thresholds are asserted on the calm variants; the
  raw ones are checked for exact agreement with their dequantized weights (which does not
  depend on conditioning) and with a loose measured INT8 floor.

Logit margins are small on random models (median top-1/top-2 gap about 0.1 with logits of
standard deviation 0.5), so top-1 agreement is a harsh metric here; cosine is the steadier one.

Accuracy level: the EP capabilities give MatMulNBits ``accuracy_level`` 4 by default, which on
the CPU quantizes activations to int8 per block. The exactness tests use 0 (the package must
then equal transformers running the dequantized weights, to float rounding); the accuracy table
measures both 0 and 4 for INT8 (4 adds about as much error again as INT8 weights do) and uses 0
for the INT4 and method comparisons so that they measure the weights alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest

from engine.options import ExportOptions
from engine.plan import ExportPlan
from tests._support.quantized import (
    BLOCK,
    PROMPT,
    STEPS,
    Packages,
    compare,
    dequantized_model,
    hf_forced_logits,
    quant_options,
    reconstruction_errors,
    stored_bytes,
    total_mse,
)


@pytest.fixture(scope="module")
def packages(tiny_models: Any, tmp_path_factory: pytest.TempPathFactory) -> Packages:
    return Packages(tiny_models, tmp_path_factory.mktemp("quantized_packages"))


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(
    "model, options",
    [
        ("all_features", quant_options(8, 8)),
        ("all_features", quant_options(4, 4)),
        # sym MatMulNBits without zero points, the search method, a 4-bit decoder with an
        # 8-bit tied head (the head takes the embedding's bits)
        ("all_features", quant_options(4, 8, symmetric=True, method="search")),
        ("untied", quant_options(4, 4)),  # lm_head as its own MatMulNBits weight
        ("untied", quant_options(8, 4, quantize_lm_head=False)),  # float lm_head
    ],
    ids=["w8e8", "w4e4", "w4e8-sym-search", "untied-w4e4", "untied-w8e4-float-head"],
)
def test_package_computes_its_dequantized_weights(packages: Packages, model: str, options):
    """With accuracy level 0 a quantized package equals transformers running the package's own
    weights dequantized: the graph (MatMulNBits, GatherBlockQuantized, the tied head's view of
    the embedding bytes) adds nothing but float rounding. Measured 3.3e-5 to 5.5e-5 on these raw
    fixtures (the calm ones: 3e-6); 1e-4 is the float parity tests' tolerance. With accuracy
    level 4 the same comparison gives 0.07-1.0 (int8 activations), hence level 0 here."""
    _, hf = packages.model(model)
    result = packages.export(model, options)
    tokens = packages.tokens(model)
    ours = packages.logits(model, options)
    theirs = hf_forced_logits(dequantized_model(hf, result), PROMPT, tokens)
    diff = float(np.abs(ours - theirs).max())
    print(f"{model} w{options.weight_bits}e{options.embedding_bits}: vs dequantized {diff:.2e}")
    assert diff <= 1e-4, f"max abs logit difference vs the dequantized model: {diff}"
    # The package really is quantized: its logits moved away from the float package's.
    assert compare(ours, packages.reference(model)).max_abs > 1e-3


# --------------------------------------------------------------------------- accuracy


@dataclass(frozen=True)
class Case:
    model: str
    options: ExportOptions
    min_top1: float
    min_cos: float
    measured: str
    """What benchmarks/quantized_accuracy.py measured (top-1, mean cosine)."""


# Thresholds sit below the measurement by a margin: cosine error (1 - cos) allowed about
# 1.5-3x the measured one, top-1 a few tokens out of 65. The calm INT8 floors (0.92, 0.999)
# are the "near-lossless" claim; the brief's example 0.95 top-1 is met by every INT8 run
# (0.953-0.985) but with one token of margin at worst, too little for a floor.
CASES = [
    Case("calm/all_features", quant_options(8, 8), 0.92, 0.999, "0.969, 0.99970"),
    Case("calm/all_features", quant_options(8, 8, symmetric=True), 0.92, 0.999, "0.969, 0.99957"),
    Case("calm/all_features", quant_options(8, 8, accuracy_level=4), 0.90, 0.998, "0.969, 0.99940"),
    Case("calm/untied", quant_options(8, 8), 0.92, 0.999, "0.985, 0.99936"),
    Case("calm/untied", quant_options(8, 8, symmetric=True), 0.92, 0.999, "0.954, 0.99942"),
    Case("calm/untied", quant_options(8, 8, accuracy_level=4), 0.90, 0.998, "0.954, 0.99902"),
    # INT4 (block 16): 4-bit weights and tables move the logits ~17x more than INT8; on random
    # models with small logit margins that flips about half the top-1 tokens.
    Case("calm/all_features", quant_options(4, 4), 0.30, 0.88, "0.385, 0.91375"),
    Case("calm/all_features", quant_options(4, 4, symmetric=True), 0.30, 0.87, "0.385, 0.90306"),
    Case("calm/all_features", quant_options(4, 4, method="search"), 0.40, 0.90, "0.538, 0.93379"),
    Case("calm/all_features", quant_options(4, 8), 0.35, 0.89, "0.462, 0.92583"),
    Case("calm/untied", quant_options(4, 4), 0.35, 0.87, "0.446, 0.90564"),
    Case("calm/untied", quant_options(4, 4, symmetric=True), 0.35, 0.83, "0.462, 0.86646"),
    # The raw fixture (see the module docstring): INT8 is bounded, not near-lossless.
    Case("all_features", quant_options(8, 8), 0.55, 0.95, "0.692, 0.97398"),
]


def _case_id(case: Case) -> str:
    o = case.options
    parts = [case.model.replace("/", "-"), f"w{o.weight_bits}e{o.embedding_bits}"]
    if o.symmetric:
        parts.append("sym")
    if o.quant_method != "rtn":
        parts.append(o.quant_method)
    parts.append(f"acc{o.accuracy_level}")
    return "-".join(parts)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_quantized_package_stays_close_to_float(packages: Packages, case: Case):
    metrics = packages.metrics(case.model, case.options)
    print(f"{_case_id(case)}: {metrics} (measured top1, cos: {case.measured})")
    assert len(packages.reference(case.model)) == STEPS + 1
    assert metrics.top1 >= case.min_top1, str(metrics)
    assert metrics.cos_mean >= case.min_cos, str(metrics)


@pytest.mark.parametrize("model", ["calm/all_features", "calm/untied"])
def test_int8_error_is_far_below_int4(packages: Packages, model: str):
    """Logit error follows the quantization step: INT8's is (255/15)^2 ~ 289x below INT4's in
    theory; measured 285x and 149x. At least 50x is asserted."""
    int8 = packages.metrics(model, quant_options(8, 8)).mse
    int4 = packages.metrics(model, quant_options(4, 4)).mse
    print(f"{model}: logits mse int8 {int8:.3e} int4 {int4:.3e} ratio {int4 / int8:.0f}")
    assert int8 * 50 <= int4


def test_accuracy_level_4_reaches_the_kernel_and_is_the_default(packages: Packages):
    """The EP default (4: int8 activations on the CPU) lands on every MatMulNBits node, and
    the kernel honours it: its logits differ from level 0's, which match the dequantized
    model; level 4 adds error of the same order as INT8 weights (against the float package,
    logits mse 2.8e-4 at level 4 vs 1.4e-4 at level 0)."""
    model = "calm/all_features"
    default = ExportOptions(ep="cpu", dtype="fp32", weight_bits=8, embedding_bits=8, block_size=16)
    result = packages.export(model, default)
    graph = onnx.load(str(result.output / "model.onnx"), load_external_data=False).graph
    levels = {
        attr.i
        for node in graph.node
        if node.op_type == "MatMulNBits"
        for attr in node.attribute
        if attr.name == "accuracy_level"
    }
    assert levels == {result.plan.caps.int4_accuracy_level} == {4}
    level4 = packages.logits(model, default)
    level0 = packages.logits(model, quant_options(8, 8))
    assert float(np.abs(level4 - level0).max()) > 1e-3
    reference = packages.reference(model)
    assert compare(level4, reference).mse > compare(level0, reference).mse


# --------------------------------------------------------------------------- methods


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
def test_search_lowers_reconstruction_error_of_exported_weights(
    packages: Packages, bits: int, symmetric: bool
):
    """Every weight the package stores, dequantized from its initializers, is at least as
    close to the checkpoint with the search method as with round-to-nearest, and clearly
    closer overall. Measured totals on the raw fixture (random normal blocks of 16, few
    outliers to clip): search/RTN 0.913 (4-bit asym), 0.916 (8-bit asym), 0.895 (4-bit sym),
    0.927 (8-bit sym); at most 0.95 is asserted."""
    model = "all_features"
    model_dir, _ = packages.model(model)
    rtn = reconstruction_errors(
        packages.export(model, quant_options(bits, bits, symmetric=symmetric)), model_dir
    )
    search = reconstruction_errors(
        packages.export(model, quant_options(bits, bits, symmetric=symmetric, method="search")),
        model_dir,
    )
    assert rtn.keys() == search.keys() and len(rtn) > 50
    worse = [name for name in rtn if search[name][0] > rtn[name][0] * (1 + 1e-6)]
    assert not worse, f"search is worse than RTN on {worse}"
    ratio = total_mse(search) / total_mse(rtn)
    print(f"{bits}-bit {'sym' if symmetric else 'asym'}: search/rtn reconstruction mse {ratio:.3f}")
    assert ratio <= 0.95


@pytest.mark.parametrize("model", ["calm/all_features", "calm/untied"])
def test_search_lowers_logits_error(packages: Packages, model: str):
    """INT4 asymmetric (the default): search's logits error against the float package is below
    RTN's (mse measured 3.12e-2 vs 4.02e-2 and 3.49e-2 vs 4.12e-2). Not asserted for symmetric:
    on calm/untied search's lower weight error still gave a higher logits error (6.11e-2 vs
    5.79e-2); a model this small and random does not turn every weight improvement into a logits
    one. The reconstruction test above holds for both."""
    rtn = packages.metrics(model, quant_options(4, 4))
    search = packages.metrics(model, quant_options(4, 4, method="search"))
    print(f"{model}: rtn {rtn}; search {search}")
    assert search.mse < rtn.mse
    assert search.cos_mean > rtn.cos_mean


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_vs_asymmetric(packages: Packages, bits: int):
    """Asymmetric blocks use the whole code range: lower reconstruction error (measured
    sym/asym 1.19x at 4 bits, 1.30x at 8 bits; at least 1.1x asserted). Symmetric MatMulNBits
    weights drop their zero points (GatherBlockQuantized tables keep them), which is exactly
    the size difference."""
    model = "all_features"
    model_dir, _ = packages.model(model)
    asym = packages.export(model, quant_options(bits, bits))
    sym = packages.export(model, quant_options(bits, bits, symmetric=True))
    ratio = total_mse(reconstruction_errors(sym, model_dir)) / total_mse(
        reconstruction_errors(asym, model_dir)
    )
    print(f"{bits}-bit: sym/asym reconstruction mse {ratio:.3f}")
    assert ratio >= 1.1

    def zero_point_bytes(plan: ExportPlan, storage: str) -> int:
        return sum(
            t.nbytes
            for w in plan.decoder.weights
            if w.storage == storage and not w.shares
            for t in w.tensors()
            if t.part == "zero_points"
        )

    assert zero_point_bytes(sym.plan, "matmulnbits") == 0
    assert zero_point_bytes(sym.plan, "gbq") == zero_point_bytes(asym.plan, "gbq") > 0
    saved = zero_point_bytes(asym.plan, "matmulnbits")
    assert saved > 0
    assert asym.plan.nbytes - sym.plan.nbytes == saved
    assert sum(stored_bytes(asym).values()) - sum(stored_bytes(sym).values()) == saved


# --------------------------------------------------------------------------- tied head


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize(
    "weight_bits, embedding_bits, symmetric",
    [(4, 4, False), (4, 8, False), (8, 4, False), (4, 4, True)],
)
def test_tied_head_reuses_the_quantized_embedding_bytes(
    packages: Packages, weight_bits: int, embedding_bits: int, symmetric: bool
):
    """No lm_head initializer: the head's MatMulNBits reads embed_tokens.weight.qweight through
    a Reshape (and its scales and zero points directly), with the embedding's bits and block
    size whatever the decoder's weight bits; the table is stored once. A symmetric table keeps
    its zero points for GatherBlockQuantized, but the head leaves them out (MatMulNBits'
    default is the same 2**(bits-1); onnxruntime's CUDA kernel without them is faster)."""
    model = "all_features"
    options = quant_options(weight_bits, embedding_bits, symmetric=symmetric)
    result = packages.export(model, options)
    graph = onnx.load(str(result.output / "model.onnx"), load_external_data=False).graph
    names = {t.name for t in graph.initializer}
    assert not [n for n in names if n.startswith("lm_head")]
    table = "embed_tokens.weight"
    assert {f"{table}.qweight", f"{table}.scales", f"{table}.zero_points"} <= names
    assert table not in names  # no float copy either

    producers = _producers(graph)
    gathers = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert any(n.input[0] == f"{table}.qweight" for n in gathers)
    heads = []
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        source = producers.get(node.input[1])
        if source is not None and source.op_type == "Reshape":
            assert source.input[0] == f"{table}.qweight"
            heads.append(node)
    assert len(heads) == 1
    head = heads[0]
    expected = [f"{table}.scales"] if symmetric else [f"{table}.scales", f"{table}.zero_points"]
    assert list(head.input[2:]) == expected
    table_gathers = [n for n in gathers if n.input[0].startswith(table)]
    assert all(n.input[3] == f"{table}.zero_points" for n in table_gathers)
    vocab, hidden = result.plan.spec.vocab_size, result.plan.spec.hidden_size
    assert _attrs(head) | {"accuracy_level": 0} == {
        "K": hidden,
        "N": vocab,
        "bits": embedding_bits,
        "block_size": BLOCK,
        "accuracy_level": 0,
    }
    assert head.output[0] in {i for n in graph.node for i in n.input}  # feeds the softcap

    lm_head = result.plan.decoder.weight("lm_head.weight")
    assert lm_head.shares == table and lm_head.nbytes == 0
    # Nothing beyond the plan is stored, and the plan counts the table once.
    stored = stored_bytes(result)
    assert sum(stored[t.name] for t in result.plan.decoder.tensors()) == result.plan.nbytes
    planned = {t.name for t in result.plan.decoder.tensors()}
    extra = {name: n for name, n in stored.items() if name not in planned}
    smallest_part = min(t.nbytes for t in result.plan.decoder.weight(table).tensors())
    assert max(extra.values()) < smallest_part, f"unplanned initializers: {extra}"


def test_tied_head_with_float_embeddings_stays_float(packages: Packages):
    """Weight bits without embedding bits: the tied head multiplies by the float table itself
    (quantizing it would store the table twice), still with no lm_head initializer."""
    result = packages.export("all_features", quant_options(4, None))
    graph = onnx.load(str(result.output / "model.onnx"), load_external_data=False).graph
    names = {t.name for t in graph.initializer}
    assert not [n for n in names if n.startswith("lm_head")]
    assert "embed_tokens.weight" in names
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    assert [n.input[0] for n in matmuls] == ["embed_tokens.weight"]
    assert result.plan.decoder.weight("lm_head.weight").storage == "float"
