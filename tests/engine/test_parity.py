"""Exported packages against transformers' own Gemma 4 forward, step by step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_gemma import hf_greedy, make_checkpoint
from tests.conftest import TINY_CONFIGS

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
DECODE_STEPS = 20  # prompt 12 + 20 steps = 32 positions, past every sliding window here


@pytest.mark.parametrize("attention", ["gqa", "standard"])
@pytest.mark.parametrize("config", sorted(TINY_CONFIGS))
def test_fp32_package_matches_transformers_every_step(
    tiny_models, tmp_path: Path, config: str, attention: str
):
    model_dir, model = tiny_models.get(config)
    out = tmp_path / "pkg"
    export(
        out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32", attention=attention)
    )

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)

    assert len(logits) == DECODE_STEPS + 1
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


def test_sliding_window_is_exercised(tiny_models):
    """Guard for the test above: the runs are longer than every tiny sliding window."""
    for name in TINY_CONFIGS:
        _, model = tiny_models.get(name)
        assert len(PROMPT) + DECODE_STEPS > model.config.sliding_window


@pytest.mark.parametrize("config", ["all_features", "k_eq_v", "mqa"])
def test_webgpu_lowering_matches_transformers_on_the_cpu_ep(
    tiny_models, tmp_path: Path, config: str
):
    """The WebGPU package (int32 I/O; K/V written into static buffers, attention explicit
    in fp32 over a sliding layer's window or a full layer's buffer with a position mask)
    computes the same model; run here on the CPU EP. ``mqa`` has one KV head on every
    layer: its scores are the Gemm with the rank-2 mask, sliding and full."""
    model_dir, model = tiny_models.get(config)
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=ExportOptions(ep="webgpu", dtype="fp32"))
    assert result.plan.uses_gqa and result.graph_capture

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    # fp32 rounding, amplified by this random model: its median step is within 8e-6. The
    # CPU EP's SkipSimplifiedLayerNormalization (every residual add fused into the next
    # norm) is within 1.0e-6 of a float64 norm where Add + RMSNormalization is within
    # 6.4e-7, which moved all_features' worst step from 8.8e-5 to 1.1e-4.
    assert max(diffs) <= 1.5e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


def test_webgpu_per_layer_tables_in_uneven_pieces_match_transformers(tiny_models, tmp_path: Path):
    """The per-layer table gathered two layers to a piece, the last piece one layer (the
    buffer limit holds two layers' tables), rows concatenated: the same model as
    transformers, run on the CPU EP."""
    model_dir, model = tiny_models.get("mqa")
    one_layer = 320 * 16 * 4  # the mqa table: 320 rows of 16 fp32 values per layer
    options = ExportOptions(ep="webgpu", dtype="fp32", max_buffer_size=2 * one_layer, force=True)
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=options)
    table = result.plan.decoder.weight("embed_tokens_per_layer.weight")
    assert [(p.stop - p.start) // 16 for p in table.pieces] == [2, 2, 1]

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1.5e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


@pytest.mark.parametrize(
    "options",
    [
        ExportOptions(ep="cpu", dtype="fp32"),
        ExportOptions(ep="webgpu", dtype="fp32"),
        ExportOptions(ep="cuda", dtype="fp32"),
    ],
    ids=["cpu", "webgpu", "cuda"],
)
def test_layer_scalars_far_from_one_and_negative_match_transformers(
    tmp_path: Path, options: ExportOptions
):
    """Each Gemma 4 layer's last residual add goes into the next norm (one
    SkipSimplifiedLayerNormalization) with the layer scalar ``s`` folded into that norm's
    epsilon as ``eps / s^2``; a scalar that is not positive keeps the plain Add, Mul and
    norm. Scalars of 0.002 (``eps / s^2`` = 0.25: a fold that forgot ``s``, or applied
    it the wrong way, changes every norm after it), 40, -0.5, 1 and 0.3."""
    import onnx
    import torch

    scalars = [0.002, 40.0, -0.5, 1.0, 0.3, 0.002]
    model_dir = tmp_path / "ckpt"
    model = make_checkpoint(model_dir, seed=3)
    assert model.config.num_hidden_layers == len(scalars)
    assert model.config.rms_norm_eps == pytest.approx(1e-6)
    with torch.no_grad():
        for layer, value in zip(model.model.layers, scalars, strict=True):
            layer.layer_scalar.fill_(value)
    model.save_pretrained(model_dir)
    out = tmp_path / "pkg"
    export(out, model_dir=model_dir, options=options)

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens

    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    zeros = {o for n in graph.node if n.op_type == "ConstantOfShape" for o in n.output}
    norms = [n for n in graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    skips = [n for n in norms if n.input[1] not in zeros]
    # One before each MLP and one per later layer's input norm, less the one after the
    # layer whose scalar is negative (the final norm keeps the last scalar's Mul).
    assert len(skips) == 2 * len(scalars) - 2
    # CUDA: each layer's three post norms (attention, MLP, per-layer input) and its per-head
    # norms (q, k and v, or q alone where the layer shares KV) take a zero skip.
    zero_skips = len(norms) - len(skips)
    assert zero_skips >= 4 * len(scalars) if options.ep == "cuda" else zero_skips == 0
    folded = sorted({round(a.f, 3) for n in skips for a in n.attribute if a.name == "epsilon"})
    assert folded[-1] == pytest.approx(0.25, rel=1e-3)


E2B_HEADS = dict(  # E2B's head sizes and KV layout at a tiny width
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    sliding_window=8,
    num_hidden_layers=6,
    layer_types=[
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
)


E4B_HEADS = E2B_HEADS | dict(num_attention_heads=4, num_key_value_heads=2)
"""E4B's KV layout (two KV heads, each read by a group of query heads) at a tiny width."""


@pytest.fixture(scope="module")
def e2b_heads(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("e2b_heads") / "ckpt"
    model = make_checkpoint(path, **E2B_HEADS)
    assert model.config.num_kv_shared_layers == 2  # layer 4 reads 3's KV, layer 5 reads 2's
    return path, model


MOE_HEADS = E2B_HEADS | dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    num_global_key_value_heads=2,
    attention_k_eq_v=True,
    num_kv_shared_layers=0,
)
"""26B-A4B's and 31B's attention at a tiny width: full layers with fewer KV heads than the
sliding ones (each read by a group of query heads), keys that are also the values."""


@pytest.fixture(scope="module", params=["e2b", "e4b", "26b"])
def cuda_heads(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """E2B's heads (one KV head), E4B's (two, a group of two query heads each) and the
    26B's (two for the full layers, whose K is also V, four for the sliding ones)."""
    if request.param == "e2b":
        return request.getfixturevalue("e2b_heads")
    path = tmp_path_factory.mktemp(f"{request.param}_heads") / "ckpt"
    model = make_checkpoint(path, **(E4B_HEADS if request.param == "e4b" else MOE_HEADS))
    assert model.config.num_kv_shared_layers == (2 if request.param == "e4b" else 0)
    return path, model


def test_cuda_full_layers_wider_than_gqa_serves_match_transformers(
    cuda_heads, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """CUDA's GroupQueryAttention serves heads up to 256 (flash); a 512-wide layer ran
    cutlass after two Ungroup copies of its whole buffer. Such layers (Gemma 4's full
    layers) write K / V by position into the shared buffers and attend explicitly in fp32;
    the sliding layers keep GQA. fp32 activations through GQA (``--attention gqa``), the
    one dtype whose CPU run is exact: transformers' logits at every step, a KV-shared full
    layer included, and no further from them than the same model's all-GQA CUDA package;
    the runner refuses a growing cache."""
    import dataclasses

    import onnx

    import engine.caps as caps
    from engine.errors import OptionsError
    from engine.runtime.runner import Runner, RunnerOptions

    model_dir, model = cuda_heads
    out = tmp_path / "pkg"
    export(
        out, model_dir=model_dir, options=ExportOptions(ep="cuda", dtype="fp32", attention="gqa")
    )
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    config = model.config
    owners = config.layer_types[: config.num_hidden_layers - config.num_kv_shared_layers]
    assert ops.count("GroupQueryAttention") == 4  # the sliding layers (E2B: one KV-shared)
    assert ops.count("ScatterElements") == 2 * owners.count("full_attention")  # their K, V
    # q (grouped per KV head where there are several) against K as stored: one FusedMatMul
    # (transB) per full layer for the scores, and no Transpose copies a whole buffer. (An
    # Einsum over [B, S, kv, G, D] ran its P @ V as S * kv GEMMs of G rows each: E4B's
    # 1,024-token prefill at half mobius's rate on an H100.)
    assert "Einsum" not in ops
    full = config.layer_types.count("full_attention")
    assert ops.count("FusedMatMul") == full
    scattered = {o for n in graph.node if n.op_type == "ScatterElements" for o in n.output}
    producers = {o: n for n in graph.node for o in n.output}

    def reads_buffer(name: str) -> bool:  # through Reshape / Cast, which copy no layout
        node = producers.get(name)
        while node is not None and node.op_type in ("Reshape", "Cast"):
            if node.input[0] in scattered:
                return True
            node = producers.get(node.input[0])
        return name in scattered

    assert not [n.name for n in graph.node if n.op_type == "Transpose" and reads_buffer(n.input[0])]
    manifest = json.loads((out / "export_studio.json").read_text())
    assert manifest["static_kv_kinds"] == ["full"]

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    tokens, logits = ort_greedy(out, PROMPT, DECODE_STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    # Scale 1.0 over 512-wide normed heads makes these models' scores large and their
    # softmax sharp, so fp32's summation order shows: E2B's heads are at 3.07e-4 (its
    # all-GQA package 3.05e-4), the 26B's at 1.08e-3 (all-GQA 1.08e-3; the CPU package
    # 3.5e-4, the CUDA lowering's other fused norms summing in another order).
    monkeypatch.setitem(
        caps._REGISTRY, "cuda", dataclasses.replace(caps.get_caps("cuda"), gqa_max_head_dim=None)
    )
    plain = tmp_path / "all-gqa"
    export(
        plain, model_dir=model_dir, options=ExportOptions(ep="cuda", dtype="fp32", attention="gqa")
    )
    _, plain_logits = ort_greedy(plain, PROMPT, DECODE_STEPS, forced=ref_tokens)
    plain_diffs = [
        float(np.abs(a - b).max()) for a, b in zip(ref_logits, plain_logits, strict=True)
    ]
    assert max(diffs) <= max(5e-4, 1.1 * max(plain_diffs)), (diffs, plain_diffs)
    assert max(diffs) <= 2e-3, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens
    with pytest.raises(OptionsError, match="static buffers"):
        Runner(out, RunnerOptions(kv_mode="growing"))
    # the studio's load check feeds buffers of max_length slots (empty ones fail the
    # ScatterElements)
    from app.load_check import check_package_loads

    assert check_package_loads(out).logits_shape[-1] == model.config.vocab_size


def _cast_caches(package: Path) -> list[str]:
    """The KV buffers a package's owners read back through a Cast (after writing them)."""
    import onnx

    graph = onnx.load(package / "model.onnx", load_external_data=False).graph
    scattered = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "ScatterElements"}
    return [
        scattered[n.input[0]] for n in graph.node if n.op_type == "Cast" and n.input[0] in scattered
    ]


def test_cuda_fp16_full_layers_track_the_all_gqa_package(
    cuda_heads, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The fp16 package (K / V rounded to fp16 in the shared buffers, as GQA's are, read
    back as fp32 for the explicit attention) against the same model with GQA on every
    layer, both along transformers' greedy path on the CPU EP. This random model's fp16
    error is GQA's own (the all-GQA package is up to 0.38 off transformers' logits); the
    two packages stay closer to each other than that (E2B's heads: within 0.03) and the
    new one is no further from transformers."""
    import dataclasses

    import engine.caps as caps

    model_dir, model = cuda_heads
    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    mixed, plain = tmp_path / "mixed", tmp_path / "gqa"
    export(mixed, model_dir=model_dir, options=ExportOptions(ep="cuda", dtype="fp16"))
    bf16 = tmp_path / "bf16"
    export(bf16, model_dir=model_dir, options=ExportOptions(ep="cuda", dtype="bf16"))
    cuda = dataclasses.replace(caps.get_caps("cuda"), gqa_max_head_dim=None)
    monkeypatch.setitem(caps._REGISTRY, "cuda", cuda)
    export(plain, model_dir=model_dir, options=ExportOptions(ep="cuda", dtype="fp16"))
    assert json.loads((plain / "export_studio.json").read_text())["static_kv_kinds"] == []
    # P @ V in the half type over V as cached: the KV owners cast their K to fp32, never V
    for package in (mixed, bf16):
        cast = _cast_caches(package)
        assert cast and all(".key" in name for name in cast), (package.name, cast)

    _, mixed_logits = ort_greedy(mixed, PROMPT, DECODE_STEPS, forced=ref_tokens)
    _, plain_logits = ort_greedy(plain, PROMPT, DECODE_STEPS, forced=ref_tokens)

    def gaps(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
        return [float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)]

    between = gaps(mixed_logits, plain_logits)
    plain_gaps = gaps(plain_logits, ref_logits)
    # E2B's heads: 0.03 apart; E4B's 0.07 and the 26B's 0.30, where the all-GQA package is
    # itself up to 0.5 off (fp16 noise of these random models; the fp32 math of the two
    # explicit layouts, Einsum and grouped MatMuls, gives identical logits here)
    assert max(between) <= max(0.05, max(plain_gaps)), (between, plain_gaps)
    mixed_error = float(np.mean(gaps(mixed_logits, ref_logits)))
    plain_error = float(np.mean(plain_gaps))
    assert mixed_error <= 1.1 * plain_error, (mixed_error, plain_error)


@pytest.mark.parametrize("gqa_up_to", [256, 128], ids=["full", "full+sliding"])
def test_cuda_static_layers_keep_batch_rows_apart(
    cuda_heads, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gqa_up_to: int
):
    """The CUDA package's explicit layers are batched (each row's own positions, window
    slots and K / V; WebGPU's lowering is batch 1 under capture): a 12- and a 4-token
    prompt in one batch, the short one padded on the right as genai pads (the
    GroupQueryAttention layers' convention), give each row the logits it gets alone, at
    prefill and over 10 decode steps. ``full+sliding``: with GQA limited to 128-wide
    heads the 256-wide sliding layers are explicit too, each row reading its own window."""
    import dataclasses

    import onnxruntime as ort

    import engine.caps as caps

    cuda = dataclasses.replace(caps.get_caps("cuda"), gqa_max_head_dim=gqa_up_to)
    monkeypatch.setitem(caps._REGISTRY, "cuda", cuda)
    model_dir, _ = cuda_heads
    out = tmp_path / "pkg"
    export(
        out, model_dir=model_dir, options=ExportOptions(ep="cuda", dtype="fp32", attention="gqa")
    )
    graph_ops = [n.op_type for n in onnx_graph(out).node]
    assert ("GatherElements" in graph_ops) == (gqa_up_to < 256)  # a sliding layer's window

    short = [9, 3, 200, 41]
    steps = 10
    alone = [ort_greedy(out, row, steps) for row in (PROMPT, short)]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    length = json.loads((out / "genai_config.json").read_text())["search"]["max_length"]
    past = {
        name: np.zeros((2, info.shape[1], length, info.shape[3]), np.float32)
        for name, info in inputs.items()
        if name.startswith("past_key_values")
    }
    names = [o.name for o in session.get_outputs()]
    pad = len(PROMPT) - len(short)
    ids = np.array([PROMPT, short + [0] * pad], np.int64)
    mask = np.ones((2, len(PROMPT)), np.int64)
    mask[1, len(short) :] = 0
    for step in range(steps + 1):
        feeds = {"input_ids": ids, "attention_mask": mask, **past}
        got = dict(zip(names, session.run(None, feeds), strict=True))
        long_row, short_row = got["logits"][0], got["logits"][1]
        if step == 0:
            short_row = short_row[: len(short)]  # the pads' rows are not compared
        np.testing.assert_allclose(long_row, alone[0][1][step], atol=2e-4, rtol=0)
        np.testing.assert_allclose(short_row, alone[1][1][step], atol=2e-4, rtol=0)
        past = {
            n.replace("present", "past_key_values"): v for n, v in got.items() if "present" in n
        }
        if step < steps:
            ids = np.array([[alone[0][0][step]], [alone[1][0][step]]], np.int64)
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)


def onnx_graph(package: Path):
    import onnx

    return onnx.load(package / "model.onnx", load_external_data=False).graph


def test_kv_shared_layers_chained_in_place_match_reading_the_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Three KV-shared sliding layers read one producer's cache as a chain (each the
    present of the one before, so onnxruntime may write each present in place of its
    past): the same logits as each reading the producer's present (the form the EPs marked
    untested keep), and transformers' along its greedy path."""
    import dataclasses

    import engine.caps as caps

    path = tmp_path / "ckpt"
    layer_types = (["sliding_attention"] * 3 + ["full_attention"]) * 2
    model = make_checkpoint(
        path, num_hidden_layers=8, layer_types=layer_types, num_kv_shared_layers=4
    )
    options = ExportOptions(ep="cuda", dtype="fp32", attention="gqa")
    chained, direct = tmp_path / "chained", tmp_path / "direct"
    export(chained, model_dir=path, options=options)
    untested = dataclasses.replace(caps.get_caps("cuda"), untested="(a test)")
    monkeypatch.setitem(caps._REGISTRY, "cuda", untested)
    export(direct, model_dir=path, options=options)

    def links(out: Path) -> int:
        """KV-shared GroupQueryAttention layers whose past is another KV-shared layer's
        present (a KV owner's past is a graph input)."""
        graph = onnx_graph(out)
        makers = {o: n for n in graph.node for o in n.output}
        shared = [
            n for n in graph.node if n.op_type == "GroupQueryAttention" and n.input[3] in makers
        ]
        return sum(makers[n.input[3]] in shared for n in shared)

    assert links(direct) == 0
    assert links(chained) == 2  # layers 5 and 6 read 4's and 5's presents
    ref_tokens, ref_logits = hf_greedy(model, PROMPT, DECODE_STEPS)
    _, chained_logits = ort_greedy(chained, PROMPT, DECODE_STEPS, forced=ref_tokens)
    _, direct_logits = ort_greedy(direct, PROMPT, DECODE_STEPS, forced=ref_tokens)
    for a, b in zip(chained_logits, direct_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(chained_logits, ref_logits, strict=True)]
    peak = max(float(np.abs(r).max()) for r in ref_logits)
    print(f"vs transformers: {max(diffs):.2e} (logits up to {peak:.1f})")
    assert max(diffs) <= 5e-4, diffs


def _matmul_shapes(package: Path, prompt: list[int]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Each MatMul's input shapes in a prefill of ``prompt`` on the CPU EP (its inputs made
    graph outputs of a copy of the graph beside the package's weights)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(package / "model.onnx", load_external_data=False)
    matmuls = [n for n in model.graph.node if n.op_type in ("MatMul", "FusedMatMul")]
    known = {o.name for o in model.graph.output}
    names = sorted({i for n in matmuls for i in n.input if i and i not in known})
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    probe = package / "probe.onnx"
    onnx.save(model, probe)
    try:
        session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
    finally:
        probe.unlink()
    search = json.loads((package / "genai_config.json").read_text())["search"]
    length = search["max_length"] if search.get("past_present_share_buffer") else 0
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([prompt], np.int64),
        "attention_mask": np.ones((1, len(prompt)), np.int64),
    }
    for info in session.get_inputs():
        if info.name.startswith("past_key_values"):
            feeds[info.name] = np.zeros((1, info.shape[1], length, info.shape[3]), np.float32)
    got = dict(zip(names, session.run(names, feeds), strict=True))
    return {
        n.name: tuple(tuple(got[i].shape) if i in got else () for i in n.input) for n in matmuls
    }


def test_cuda_matmuls_stride_their_batches(cuda_heads, tmp_path: Path):
    """onnxruntime's CUDA MatMul runs one strided batched GEMM only when the right operand
    is 2-D or both carry the same batch dimensions; others (batch dimensions broadcast
    against each other) run as one small GEMM per batch index. E4B's full layers had
    ``P [B, S, kv, G, T] @ V [B, 1, kv, T, D]``: S * kv GEMMs of G rows at prefill, half
    mobius's 1,024-token prefill rate on an H100. Checked on the shapes a 5-token prefill
    gives each MatMul of the CUDA package."""
    model_dir, _ = cuda_heads
    out = tmp_path / "pkg"
    options = ExportOptions(ep="cuda", dtype="fp32", attention="gqa")  # as fp16 / bf16 lower
    export(out, model_dir=model_dir, options=options)
    shapes = _matmul_shapes(out, PROMPT[:5])
    assert len(shapes) > 10
    gemms = {  # batch 1: GEMMs a broadcast MatMul runs, one per index of its batch dims
        name: (left, right)
        for name, (left, right) in shapes.items()
        if len(right) > 2
        and left[:-2] != right[:-2]
        and np.prod(np.broadcast_shapes(left[:-2], right[:-2])) > 1
    }
    # (the tied LM head, W [V, H] @ h^T [1, H, S], is one GEMM at batch 1 and one per row)
    assert not gemms, gemms
