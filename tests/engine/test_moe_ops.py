"""What com.microsoft MoE / QMoE compute on onnxruntime 1.32's CPU EP, measured against
numpy: the facts behind the gather-based lowering of engine/models/gemma4/moe.py.

Gemma 4's experts are ``down(gelu_tanh(gate) * up)`` with the gate and up rows fused in one
[E, 2I, H] tensor ([gate | up]), routed by softmax -> top-k -> renormalize -> times a
per-expert scale. The CPU kernels route the same way (``router_probs`` are logits they
softmax, ``normalize_routing_weights=1`` renormalizes the top k) and their ``gelu`` is
the tanh approximation, but they cannot gate: ``geglu`` is refused and a separate gate
(FC3) is not implemented. So neither kernel can run Gemma's experts; if a release adds
gated GELU, the refusal tests below fail and the lowering should be revisited.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.quantize import dequantize, quantize

TOKENS, HIDDEN, WIDTH, EXPERTS, TOP_K, BLOCK = 5, 32, 16, 4, 2, 16


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((TOKENS, HIDDEN)).astype(np.float32),
        "logits": rng.standard_normal((TOKENS, EXPERTS)).astype(np.float32),
        "fc1": (0.2 * rng.standard_normal((EXPERTS, WIDTH, HIDDEN))).astype(np.float32),
        "fc2": (0.2 * rng.standard_normal((EXPERTS, HIDDEN, WIDTH))).astype(np.float32),
    }


def gelu_tanh(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))


def gelu_erf(v: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


def routed(data: dict[str, np.ndarray], act, renormalize: bool, fc1=None, fc2=None) -> np.ndarray:
    """softmax -> top-k (-> renormalize) routing of ungated experts fc2(act(fc1 x))."""
    fc1 = data["fc1"] if fc1 is None else fc1
    fc2 = data["fc2"] if fc2 is None else fc2
    out = np.zeros((TOKENS, HIDDEN), np.float64)
    for t in range(TOKENS):
        p = np.exp(data["logits"][t] - data["logits"][t].max())
        p /= p.sum()
        chosen = np.argsort(-p)[:TOP_K]
        weights = p[chosen] / (p[chosen].sum() if renormalize else 1.0)
        for e, w in zip(chosen, weights, strict=True):
            out[t] += w * (fc2[e] @ act(fc1[e] @ data["x"][t]))
    return out.astype(np.float32)


def run_op(op: str, attrs: dict, inputs: list[tuple[str, np.ndarray | None]], x, logits):
    """One com.microsoft MoE / QMoE node on the CPU EP; inputs after the router in order
    (None leaves an optional input out)."""
    names = ["x", "r"] + [name if array is not None else "" for name, array in inputs]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node],
        "moe",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, list(logits.shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in inputs if a is not None],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "r": logits})[0]


def moe(data, **attrs) -> np.ndarray:
    inputs = [("fc1", data["fc1"]), ("b1", None), ("fc2", data["fc2"])]
    return run_op("MoE", {"k": TOP_K, **attrs}, inputs, data["x"], data["logits"])


@pytest.mark.parametrize("renormalize", [0, 1])
def test_cpu_moe_routes_like_gemma(data, renormalize: int):
    """router_probs are logits it softmaxes; normalize_routing_weights renormalizes the top k."""
    out = moe(data, activation_type="identity", normalize_routing_weights=renormalize)
    expected = routed(data, lambda v: v, renormalize=bool(renormalize))
    wrong = routed(data, lambda v: v, renormalize=not renormalize)
    assert np.abs(out - expected).max() <= 1e-5
    assert np.abs(out - wrong).max() > 1e-2


def test_cpu_moe_gelu_is_the_tanh_approximation(data):
    out = moe(data, activation_type="gelu", normalize_routing_weights=1)
    assert np.abs(out - routed(data, gelu_tanh, True)).max() <= 1e-5
    assert np.abs(out - routed(data, gelu_erf, True)).max() > 1e-4


def test_cpu_moe_cannot_gate(data):
    fused = np.concatenate([data["fc1"], data["fc1"]], axis=1)  # [gate | up]
    for fusion in (1, 2):
        with pytest.raises(Exception, match="Unsupported MoE activation type: geglu"):
            run_op(
                "MoE",
                {"k": TOP_K, "activation_type": "geglu", "swiglu_fusion": fusion},
                [("fc1", fused), ("b1", None), ("fc2", data["fc2"])],
                data["x"],
                data["logits"],
            )
    with pytest.raises(Exception, match="FC3 is not implemented for CPU MoE"):
        run_op(
            "MoE",
            {"k": TOP_K, "activation_type": "gelu"},
            [
                ("fc1", data["fc1"]),
                ("b1", None),
                ("fc2", data["fc2"]),
                ("b2", None),
                ("fc3", data["fc1"]),
            ],
            data["x"],
            data["logits"],
        )


def _qmoe_inputs(data, bits: int, gate: np.ndarray | None = None):
    """QMoE inputs from our quantizer's bytes: qweight [E, N, K*bits/8], scales [E, N, K/bs],
    zero points [E, N, ceil(K/bs*bits/8)] (weights_prepacked=0), and the dequantized weights."""
    packed, restored = {}, {}
    named = {"fc1": data["fc1"], "fc2": data["fc2"]} | ({"fc3": gate} if gate is not None else {})
    for name, weight in named.items():
        blocks = [quantize(w, bits=bits, block_size=BLOCK) for w in weight]
        packed[name] = tuple(
            np.stack([getattr(b, part) for b in blocks])
            for part in ("qweight", "scales", "zero_points")
        )
        restored[name] = np.stack([dequantize(b, bits=bits, block_size=BLOCK) for b in blocks])
    order = [
        ("q1", packed["fc1"][0]),
        ("s1", packed["fc1"][1]),
        ("b1", None),
        ("q2", packed["fc2"][0]),
        ("s2", packed["fc2"][1]),
        ("b2", None),
        ("q3", packed["fc3"][0] if gate is not None else None),
        ("s3", packed["fc3"][1] if gate is not None else None),
        ("b3", None),
        ("z1", packed["fc1"][2]),
        ("z2", packed["fc2"][2]),
        ("z3", packed["fc3"][2] if gate is not None else None),
    ]
    return order, restored


def test_cpu_qmoe_reads_our_4bit_expert_bytes(data):
    """With 4-bit blocks and accuracy level 0, QMoE over the bytes our quantizer writes (the
    MatMulNBits layout per expert) equals routing over the dequantized experts."""
    inputs, restored = _qmoe_inputs(data, 4)
    attrs = dict(
        k=TOP_K,
        activation_type="gelu",
        normalize_routing_weights=1,
        expert_weight_bits=4,
        block_size=BLOCK,
        weights_prepacked=0,
        accuracy_level=0,
    )
    out = run_op("QMoE", attrs, inputs, data["x"], data["logits"])
    expected = routed(data, gelu_tanh, True, fc1=restored["fc1"], fc2=restored["fc2"])
    assert np.abs(out - expected).max() <= 1e-5


@pytest.mark.parametrize("bits", [4, 8])
def test_cpu_qmoe_cannot_gate(data, bits: int):
    attrs = dict(k=TOP_K, normalize_routing_weights=1, expert_weight_bits=bits, block_size=BLOCK)
    inputs, _ = _qmoe_inputs(data, bits, gate=data["fc1"])
    with pytest.raises(Exception, match="FC3 gating is not yet implemented on CPU for QMoE"):
        run_op("QMoE", {**attrs, "activation_type": "gelu"}, inputs, data["x"], data["logits"])
    fused = {**data, "fc1": np.concatenate([data["fc1"], data["fc1"]], axis=1)}  # [gate | up]
    fused_inputs, _ = _qmoe_inputs(fused, bits)
    with pytest.raises(Exception, match="Unsupported MoE activation type: geglu"):
        run_op(
            "QMoE",
            {**attrs, "activation_type": "geglu", "swiglu_fusion": 2},
            fused_inputs,
            data["x"],
            data["logits"],
        )
