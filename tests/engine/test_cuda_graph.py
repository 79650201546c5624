"""What CUDA graphs need of a GroupQueryAttention package, checked without a GPU.

onnxruntime refuses graph capture for a session whose partitioning left a Memcpy node
("all compute graph nodes have not been partitioned to the CUDAExecutionProvider"), and
GroupQueryAttention reads ``total_sequence_length`` in host memory: computed from the
mask's values on the device it needs a copy to the host. Measured on the H200
(onnxruntime-gpu 1.31.1, genai-cuda 0.18, Llama 3.2 1B and Qwen3 1.7B packages): every node
on CUDA, capture refused. So on EPs whose GQA takes it on the host the length must come from
the mask's shape alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from engine.audit import graph_inputs_above, host_value_reads
from engine.caps import get_caps, list_eps
from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.ort_loop import ort_greedy
from tests._support.tiny_llama import make_checkpoint

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
SHAPE_OPS = {"Shape", "Gather", "Cast", "Constant", "Squeeze", "Unsqueeze", "Slice"}


def _value_readers(model: onnx.ModelProto, output: str) -> set[str]:
    """Graph inputs whose values (not just shape) reach ``output``: a walk up its producers
    that stops at Shape."""
    producers = {o: node for node in model.graph.node for o in node.output}
    inputs = {i.name for i in model.graph.input}
    found: set[str] = set()
    todo, seen = [output], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
            continue
        node = producers.get(name)
        if node is None or node.op_type == "Shape":
            continue
        todo.extend(i for i in node.input if i)
    return found


def _length_paths(model: onnx.ModelProto) -> list[tuple[set[str], set[str]]]:
    """For each GroupQueryAttention: (graph inputs whose values reach its
    total_sequence_length, the op types on the way)."""
    producers = {o: node for node in model.graph.node for o in node.output}
    out = []
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        length = node.input[6]
        ops, todo, seen = set(), [length], set()
        while todo:
            name = todo.pop()
            if name in seen or name not in producers:
                continue
            seen.add(name)
            producer = producers[name]
            ops.add(producer.op_type)
            if producer.op_type != "Shape":
                todo.extend(i for i in producer.input if i)
        out.append((_value_readers(model, length), ops))
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cuda_graph") / "qwen3"
    make_checkpoint(path, "qwen3_sliding")
    return path


HOST_LENGTH_EPS = [ep for ep in list_eps() if get_caps(ep).host_total_length]


@pytest.mark.parametrize("ep", HOST_LENGTH_EPS)
def test_total_sequence_length_comes_from_the_mask_shape(checkpoint: Path, tmp_path: Path, ep: str):
    options = ExportOptions(ep=ep, dtype="fp16", attention="gqa")
    try:
        export(tmp_path / "pkg", model_dir=checkpoint, options=options)
    except Exception as exc:  # an EP without a kernel this checkpoint needs says so
        pytest.fail(f"{ep}: {exc}")
    model = onnx.load(str(tmp_path / "pkg" / "model.onnx"), load_external_data=False)
    paths = _length_paths(model)
    assert paths, "the package has no GroupQueryAttention"
    for readers, ops in paths:
        assert not readers, f"total_sequence_length reads the values of {readers} ({ops})"
        assert ops <= SHAPE_OPS, ops


def test_the_cpu_package_still_reads_the_mask_values(checkpoint: Path, tmp_path: Path):
    """The guard above would catch today's CUDA packages: the CPU lowering (no capture, no
    host/device split) computes the length from the mask's values."""
    export(tmp_path / "pkg", model_dir=checkpoint, options=ExportOptions(ep="cpu", dtype="fp16"))
    model = onnx.load(str(tmp_path / "pkg" / "model.onnx"), load_external_data=False)
    assert all(readers == {"attention_mask"} for readers, _ in _length_paths(model))


def test_the_cuda_package_computes_what_the_cpu_package_does(checkpoint: Path, tmp_path: Path):
    """The CUDA fp16 package's graph, run on the CPU EP, gives the CPU fp16 package's logits
    (to about an fp16 ulp) and tokens (both GroupQueryAttention over a shared buffer)."""
    for ep in ("cpu", "cuda"):
        options = ExportOptions(ep=ep, dtype="fp16", attention="gqa")
        export(tmp_path / ep, model_dir=checkpoint, options=options)
    cpu_tokens, cpu_logits = ort_greedy(tmp_path / "cpu", PROMPT, 24)
    cuda_tokens, cuda_logits = ort_greedy(tmp_path / "cuda", PROMPT, 24)
    assert cuda_tokens == cpu_tokens
    # The CUDA graph's per-head norms are Skip kernels with a zero skip
    # (EpCapabilities.skip_kernel_norms), which on the CPU EP round a few values the other
    # way: 2 of 25 steps differ, by at most one fp16 ulp of the step's largest logit (the
    # rest bit for bit). The bound is two.
    eps = float(np.finfo(np.float16).eps)
    pairs = zip(cpu_logits, cuda_logits, strict=True)
    diffs = [float(np.abs(a - b).max() / (eps * np.abs(a).max())) for a, b in pairs]
    assert max(diffs) <= 2, diffs
    assert sum(d > 0 for d in diffs) <= len(diffs) // 4, diffs


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_cuda_packages_switch_tf32_off(checkpoint: Path, tmp_path: Path, dtype: str):
    """The CUDA EP computes fp32 MatMuls in TF32 unless told not to; on the H200 that put a
    full-size fp32 E2B package 0.93 away from transformers at its first token (0.019 with it
    off). Every CUDA package says ``use_tf32: 0`` beside the CUDA graph switch, and our
    runner hands the decoder's options to onnxruntime as genai does."""
    from engine.caps import get_caps as caps_of
    from engine.runtime.package import open_package, session_provider_options

    export(tmp_path / "pkg", model_dir=checkpoint, options=ExportOptions(ep="cuda", dtype=dtype))
    config = json.loads((tmp_path / "pkg" / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    (entry,) = decoder["session_options"]["provider_options"]
    assert entry["cuda"]["use_tf32"] == "0" and "enable_cuda_graph" in entry["cuda"]
    package = open_package(tmp_path / "pkg")
    options = session_provider_options(
        package.config["model"]["decoder"], caps_of("cuda").genai_provider
    )
    assert options["use_tf32"] == "0"


def _shared_buffer_logits(
    package: Path, prompt: list[int], forced: list[int], max_length: int, *, static: bool
) -> np.ndarray:
    """Teacher-forced last-position logits of a shared-buffer GQA package on the CPU EP,
    with the mask genai passes: ``[1, total]``, or under graph capture the static
    ``[1, max_length]`` (ones then zeros) whose width is the buffer's, not the sequence's."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(package / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    kv = np.float16 if "float16" in inputs["past_key_values.0.key"].type else np.float32
    index = np.int64 if "int64" in inputs["input_ids"].type else np.int32
    past = {
        name: np.zeros((1, info.shape[1], max_length, info.shape[3]), kv)
        for name, info in inputs.items()
        if name.startswith("past_key_values")
    }
    ids, total, rows = list(prompt), len(prompt), []
    for step in range(len(forced) + 1):
        mask = np.zeros((1, max_length if static else total), index)
        mask[0, :total] = 1
        feeds = {"input_ids": np.array([ids], index), "attention_mask": mask, **past}
        out = dict(zip(names, session.run(None, feeds), strict=True))
        rows.append(out["logits"][0, -1].astype(np.float32))
        past = {
            n.replace("present", "past_key_values"): v for n, v in out.items() if "present" in n
        }
        if step < len(forced):
            ids, total = [forced[step]], total + 1
    return np.stack(rows)


def test_longrope_picks_its_set_by_the_valid_length_under_the_static_capture_mask(tmp_path: Path):
    """Phi-4's longrope switches to its long factors once the sequence passes the original
    length (16 here). Under CUDA graphs genai's mask is as wide as the buffer, so the CUDA
    package must count the mask's ones, not its width: with the static mask it computes
    exactly what it does with the growing one (the width would pick the long set from the
    first token: a 1.15 logit difference), and both stay on transformers' fp16 track."""
    from tests._support.tiny_gemma import hf_greedy

    model = make_checkpoint(tmp_path / "phi4", "phi4")
    steps = 24  # 12 + 24 positions: past the original length
    tokens, logits = hf_greedy(model, PROMPT, steps)
    options = ExportOptions(ep="cuda", dtype="fp16", attention="gqa", max_length=64)
    export(tmp_path / "pkg", model_dir=tmp_path / "phi4", options=options)
    growing = _shared_buffer_logits(tmp_path / "pkg", PROMPT, tokens, 64, static=False)
    static = _shared_buffer_logits(tmp_path / "pkg", PROMPT, tokens, 64, static=True)
    np.testing.assert_array_equal(static, growing)
    reference = np.stack([step[-1] for step in logits])
    assert float(np.abs(static - reference).max()) < 0.05


def _tiny(path: Path, name: str) -> tuple[Any, int]:
    """A tiny checkpoint: transformers' model and how many of its layers project their own
    keys and values (Gemma 4's full layers with ``attention_k_eq_v`` read values from the
    keys' projection)."""
    from engine.models.checkpoint_config import load_spec
    from tests._support import tiny_gemma

    if name.startswith("gemma4"):
        model = tiny_gemma.make_checkpoint(path, attention_k_eq_v=name == "gemma4_k_eq_v")
    else:
        model = make_checkpoint(path, name)
    return model, sum(layer.owns_kv and not layer.k_eq_v for layer in load_spec(path).layers)


@pytest.mark.parametrize(
    "name", ["llama_bias_mqa", "phi3", "phi4", "qwen3", "gemma3", "gemma4", "gemma4_k_eq_v"]
)
def test_cuda_attention_takes_one_packed_projection(tmp_path: Path, name: str):
    """On CUDA a KV-owning layer projects q, k and v as one MatMul whose output
    GroupQueryAttention takes packed (key and value left out): per layer two GEMVs fewer at
    decode, and for Gemma 4 one norm and one Mul where q, k and v had a norm each. Where q
    and k only are normed (Qwen3, Gemma 3), the one projection is split for their norms and
    GQA takes q, k and v apart. KV-shared layers keep their query-only projection. The
    graph, run on the CPU EP teacher-forced on
    transformers' fp32 tokens, stays as close to transformers' logits as the CPU fp16
    package (three projections, three norms): Gemma 4's norm and Mul round twice in fp16,
    which cost 0.8-1.4x the CPU package's mean error over four seeds, so the bound is 1.5x."""
    from tests._support.tiny_gemma import hf_greedy

    model, owners = _tiny(tmp_path / "ckpt", name)
    assert owners
    tokens, hf_logits = hf_greedy(model, PROMPT, 16)
    reference = np.stack([step[-1] for step in hf_logits])
    nodes, error = {}, {}
    for ep in ("cpu", "cuda"):
        options = ExportOptions(ep=ep, dtype="fp16", attention="gqa", max_length=64)
        export(tmp_path / ep, model_dir=tmp_path / "ckpt", options=options)
        nodes[ep] = onnx.load(str(tmp_path / ep / "model.onnx"), load_external_data=False)
        logits = _shared_buffer_logits(tmp_path / ep, PROMPT, tokens, 64, static=False)
        error[ep] = np.abs(logits - reference)

    def packed(ep: str) -> list[bool]:
        gqa = [n for n in nodes[ep].graph.node if n.op_type == "GroupQueryAttention"]
        return [list(n.input[1:3]) == ["", ""] for n in gqa]

    def matmuls(ep: str) -> int:
        return sum(n.op_type in ("MatMul", "MatMulNBits") for n in nodes[ep].graph.node)

    split = name in ("qwen3", "gemma3")  # q and k normed, v not
    assert sum(packed("cuda")) == (0 if split else owners)
    assert len(packed("cuda")) == len(packed("cpu")) and not any(packed("cpu"))
    stored_fused = name in ("phi3", "phi4")  # the checkpoint's one qkv_proj on both

    def splits(ep: str) -> int:
        return sum(n.op_type == "Split" for n in nodes[ep].graph.node)

    # one Split per layer where q and k are normed apart; none where CPU splits the stored one
    extra = owners if split else -owners if stored_fused else 0
    assert splits("cuda") - splits("cpu") == extra
    assert matmuls("cpu") - matmuls("cuda") == (0 if stored_fused else 2 * owners)
    assert error["cuda"].mean() <= 1.5 * error["cpu"].mean() + 1e-4
    assert error["cuda"].max() < 0.15


def _host_inputs_from_values(model) -> list[str]:
    """The audit's host-read findings for CUDA (inputs CUDA reads on the host computed
    from a graph input's values), one line each."""
    findings = host_value_reads(model, get_caps("cuda"))
    return [f"{f.op_type} {f.node}: {f.reason}" for f in findings]


@pytest.mark.parametrize(
    ("preset", "options"),
    [
        ("gemma4-e2b", ExportOptions(ep="cuda", weight_bits=4, embedding_bits=4)),
        ("gemma4-e2b", ExportOptions(ep="cuda", dtype="fp16")),
        ("gemma4-26b-a4b", ExportOptions(ep="cuda", weight_bits=4)),
        ("qwen3-1.7b", ExportOptions(ep="cuda", weight_bits=4)),
        ("llama3.2-1b", ExportOptions(ep="cuda", dtype="fp16")),
    ],
    ids=["e2b-int4", "e2b-fp16", "26b-int4", "qwen3", "llama"],
)
def test_cuda_decoders_read_no_device_values_on_the_host(preset: str, options: ExportOptions):
    """Every input the CUDA EP reads in host memory (shapes, axes, starts, pads, GQA's
    total length) is a constant or shape arithmetic: no MemcpyToHost, so CUDA graphs can
    capture the session. Full-size presets (E2B's 512-wide full layers explicit over the
    shared buffers, the 26B MoE, Qwen3 and Llama on GQA); graphs only, no weights."""
    from engine.models import build_decoder
    from engine.plan import plan
    from engine.presets import load_preset
    from engine.rewrites import apply_rewrites

    options = dataclasses.replace(options, modalities=("text",))
    export_plan = plan(load_preset(preset), options)
    model = build_decoder(export_plan)
    apply_rewrites(model, export_plan.caps)
    assert _host_inputs_from_values(model) == []


def test_the_host_input_walk_finds_the_cpu_package_s_value_reads():
    """The guard above can fail: the CPU lowering computes GroupQueryAttention's total
    length from the mask's values (right there: no host / device split)."""
    from engine.models import build_decoder
    from engine.plan import plan
    from engine.presets import load_preset

    export_plan = plan(load_preset("qwen3-1.7b"), ExportOptions(ep="cpu", weight_bits=4))
    found = _host_inputs_from_values(build_decoder(export_plan))
    assert any(line.startswith("GroupQueryAttention") for line in found), found


def test_cuda_e2b_takes_key_positions_from_the_buffer_shape_not_a_scan():
    """The explicit 512-wide layers' key positions 0..L-1 come from a Range over the
    buffer's length: a CumSum over the buffer cost 66 us of an H100 decode step at
    L = 4,096 (onnxruntime's CUDA CumSum sums each element's whole prefix). The only CumSum
    left runs over the S new tokens."""
    from engine.models import build_decoder
    from engine.plan import plan
    from engine.presets import load_preset
    from engine.rewrites import apply_rewrites

    options = ExportOptions(ep="cuda", weight_bits=4, embedding_bits=4, modalities=("text",))
    export_plan = plan(load_preset("gemma4-e2b"), options)
    model = build_decoder(export_plan)
    apply_rewrites(model, export_plan.caps)
    scans = [node for node in model.graph if node.op_type == "CumSum"]
    assert scans, "the new tokens' running index is a CumSum"
    for node in scans:
        above = graph_inputs_above(node.inputs[0])
        assert not any(name.startswith("past_key_values") for name in above), (node.name, above)
    ranges = [node for node in model.graph if node.op_type == "Range"]
    assert any(
        any(name.startswith("past_key_values") for name in graph_inputs_above(node.inputs[1]))
        for node in ranges
    )


def test_cuda_e2b_kv_shared_layers_chain_their_cache_in_place():
    """E2B's 16 KV-shared sliding layers (GroupQueryAttention on CUDA) read their producer's
    cache as a chain: the first reads the producer's present, each next one the present of
    the one before, so every such present has one reader and onnxruntime writes it in place
    of its past (GQA's MayInplace). Reading the producer's present from every layer made
    each copy the whole buffer into a present nothing read: 32 copies and 30 memsets, 150 us
    of an H100 decode step at 4,096 (``results/cuda_profile-2026-12-06e-*``)."""
    from engine.models import build_decoder
    from engine.plan import plan
    from engine.presets import load_preset
    from engine.rewrites import apply_rewrites

    options = ExportOptions(ep="cuda", weight_bits=4, embedding_bits=4, modalities=("text",))
    export_plan = plan(load_preset("gemma4-e2b"), options)
    model = build_decoder(export_plan)
    apply_rewrites(model, export_plan.caps)
    outputs = {id(value) for value in model.graph.outputs}
    gqas = [node for node in model.graph if node.op_type == "GroupQueryAttention"]
    shared = [node for node in gqas if not node.inputs[3].is_graph_input()]
    assert len(shared) == 16
    starts = 0
    for node in shared:
        for past in node.inputs[3:5]:
            readers = {id(user) for user, _ in past.uses()}
            if id(past) in outputs:  # a producer's present: the chain's first reader only
                starts += 1
                assert readers == {id(node)}, node.name
            else:
                assert past.producer() in shared and readers == {id(node)}, node.name
    assert starts == 2  # the sliding producer's key and value
