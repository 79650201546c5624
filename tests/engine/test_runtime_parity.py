"""Our runner against transformers and onnxruntime-genai, in both KV-cache modes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.errors import OptionsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.device_io import StaticTensors
from engine.runtime.genai_runner import GenaiRunner
from engine.runtime.package import open_package
from engine.runtime.runner import Runner, RunnerOptions
from engine.runtime.sampling import Sampler
from tests._support.tiny_gemma import hf_greedy

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
NEW_TOKENS = 21  # the prefill's token + 20 decode steps: past every tiny sliding window

CASES = [
    ("all_features", "gqa", "shared"),
    ("all_features", "gqa", "growing"),
    ("all_features", "standard", "growing"),
    ("plain", "gqa", "shared"),
    ("mqa", "gqa", "shared"),
    ("k_eq_v", "standard", "growing"),
]


@pytest.fixture(scope="module")
def packages(tiny_models, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("runtime_parity")
    made: dict[tuple[str, str], Path] = {}

    def get(config: str, attention: str = "gqa") -> Path:
        key = (config, attention)
        if key not in made:
            model_dir, _ = tiny_models.get(config)
            out = root / f"{config}-{attention}"
            options = ExportOptions(ep="cpu", dtype="fp32", attention=attention)  # type: ignore[arg-type]
            export(out, model_dir=model_dir, options=options)
            made[key] = out
        return made[key]

    return get


@pytest.mark.parametrize(("config", "attention", "kv_mode"), CASES)
def test_runner_matches_transformers_and_genai(
    tiny_models, packages, config: str, attention: str, kv_mode: str
):
    _, model = tiny_models.get(config)
    package = packages(config, attention)
    runner = Runner(package, RunnerOptions(kv_mode=kv_mode))  # type: ignore[arg-type]
    assert runner.kv_mode == kv_mode
    run = runner.generate(PROMPT, NEW_TOKENS, keep_logits=True)

    ref_tokens, ref_logits = hf_greedy(model, PROMPT, NEW_TOKENS - 1)
    diffs = [
        float(np.abs(ref[-1] - ours).max())
        for ref, ours in zip(ref_logits, run.logits, strict=True)
    ]
    assert max(diffs) <= 1e-4, diffs
    assert list(run.tokens[:-1]) == ref_tokens and len(run.tokens) == NEW_TOKENS

    genai = GenaiRunner(package).generate(PROMPT, NEW_TOKENS)
    assert genai.tokens == run.tokens


def test_shared_buffer_logits_equal_growing_logits(packages):
    package = packages("all_features")
    shared = Runner(package, RunnerOptions(kv_mode="shared", max_length=64))
    growing = Runner(package, RunnerOptions(kv_mode="growing"))
    a = shared.generate(PROMPT, NEW_TOKENS, keep_logits=True)
    b = growing.generate(PROMPT, NEW_TOKENS, keep_logits=True)
    assert a.tokens == b.tokens
    assert max(float(np.abs(x - y).max()) for x, y in zip(a.logits, b.logits, strict=True)) <= 1e-5


def test_reused_runner_repeats_itself(packages):
    runner = Runner(packages("all_features"), RunnerOptions(max_length=64))
    first = runner.generate(PROMPT, NEW_TOKENS)
    other = runner.generate(PROMPT[::-1], 5)
    again = runner.generate(PROMPT, NEW_TOKENS)
    assert first.tokens == again.tokens and other.tokens != first.tokens[:5]


def test_concat_package_refuses_the_shared_mode(packages):
    with pytest.raises(OptionsError, match="use the growing KV mode"):
        Runner(packages("all_features", "standard"), RunnerOptions(kv_mode="shared"))
    with pytest.raises(OptionsError, match="graph capture needs past and present KV"):
        Runner(packages("all_features", "standard"), RunnerOptions(graph_capture=True))


def test_run_longer_than_the_kv_buffer_is_refused(packages):
    runner = Runner(packages("plain"), RunnerOptions(max_length=16))
    with pytest.raises(OptionsError, match="exceeds the KV buffer length 16"):
        runner.generate(PROMPT, 8)


def test_teacher_forcing_feeds_given_tokens_and_records_argmax(packages):
    runner = Runner(packages("plain"))
    free = runner.generate(PROMPT, 8, keep_logits=True)
    forced_tokens = [3] * 8
    forced = runner.generate(PROMPT, 8, forced=forced_tokens, keep_logits=True)
    assert forced.tokens == tuple(forced_tokens)
    assert forced.argmax[0] == free.tokens[0]  # the prefill does not depend on forcing
    assert np.array_equal(forced.logits[0], free.logits[0])
    assert not np.array_equal(forced.logits[1], free.logits[1])
    same = runner.generate(PROMPT, 8, forced=list(free.tokens), keep_logits=True)
    assert same.argmax == free.tokens


def test_seeded_sampling_is_reproducible(packages):
    runner = Runner(packages("plain"))
    sampler = Sampler(temperature=1.5, top_k=50, seed=3)
    a = runner.generate(PROMPT, 12, sampler=sampler)
    b = runner.generate(PROMPT, 12, sampler=sampler)
    c = runner.generate(PROMPT, 12, sampler=replace(sampler, seed=4))
    greedy = runner.generate(PROMPT, 12)
    assert a.tokens == b.tokens and a.tokens != c.tokens and a.tokens != greedy.tokens


def test_generation_stops_at_end_of_sequence(packages):
    package = open_package(packages("plain"))
    first = Runner(package).generate(PROMPT, 4).tokens[0]
    runner = Runner(replace(package, eos_token_ids=(first,)))
    stopped = runner.generate(PROMPT, 10, stop_at_eos=True)
    assert stopped.tokens == (first,) and stopped.stopped_at_eos
    assert runner.generate(PROMPT, 10).new_tokens == 10


def test_timings_are_recorded_per_step(packages):
    run = Runner(packages("plain")).generate(PROMPT, 6)
    assert len(run.step_seconds) == 5 and all(t > 0 for t in run.step_seconds)
    assert 0 < run.prefill_seconds <= run.first_token_seconds
    assert run.decode_tokens_per_second > 0 and run.prefill_tokens_per_second > 0


def test_static_tensors_are_rewritten_in_place():
    tensors = StaticTensors({"x": ((1, 4), np.dtype(np.int32))}, "cpu", "CPUExecutionProvider")
    tensors.write({"x": np.zeros((1, 4), dtype=np.int32)})
    value = tensors.values["x"]
    address = value.data_ptr()
    tensors.write({"x": np.arange(4, dtype=np.int32)[None]})
    assert tensors.values["x"] is value and value.data_ptr() == address
    assert value.numpy().tolist() == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="expected int32"):
        tensors.write({"x": np.zeros((1, 5), dtype=np.int32)})


def _bf16_io(package: Path, out: Path) -> Path:
    """``package`` with bfloat16 KV caches and logits, as bf16 CUDA packages have them: its
    graph unchanged inside, casts at the edges (so the CPU EP, which has no bf16 kernels
    but Cast, runs it)."""
    import shutil

    import onnx
    from onnx import TensorProto, helper

    shutil.copytree(package, out, ignore=shutil.ignore_patterns("model.onnx*"))
    model = onnx.load(str(package / "model.onnx"))
    graph = model.graph
    rename: dict[str, str] = {}
    head, tail = [], []
    for value in graph.input:
        if value.name.startswith("past_key_values."):
            rename[value.name] = value.name + "_f32"
            head.append(helper.make_node("Cast", [value.name], [value.name + "_f32"], to=1))
            value.type.tensor_type.elem_type = TensorProto.BFLOAT16
    for value in graph.output:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            rename[value.name] = value.name + "_f32"
            tail.append(helper.make_node("Cast", [value.name + "_f32"], [value.name], to=16))
            value.type.tensor_type.elem_type = TensorProto.BFLOAT16
    for node in graph.node:
        node.input[:] = [rename.get(name, name) for name in node.input]
        node.output[:] = [rename.get(name, name) for name in node.output]
    nodes = [*head, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(out / "model.onnx"))
    return out


@pytest.mark.parametrize("kv_mode", ["shared", "growing"])
def test_the_runner_runs_bf16_kv_and_logits(packages, tmp_path: Path, kv_mode: str):
    """bf16 CUDA packages keep KV and logits in bfloat16, which numpy cannot hold: the
    runner refused them ("use --runtime genai"), so `bench --runtime ort`, `verify` and
    cuda_ab_logits.py could not run one. The same graph with bf16 edges must give the fp32
    package's logits but for bf16 rounding, teacher-forced along the fp32 run's tokens."""
    package = packages("all_features")
    bf16 = _bf16_io(package, tmp_path / "bf16")
    options = RunnerOptions(kv_mode=kv_mode, max_length=64)  # type: ignore[arg-type]
    ref = Runner(package, options).generate(PROMPT, NEW_TOKENS, keep_logits=True)
    runner = Runner(bf16, options)
    assert runner.float_dtype == np.dtype("bfloat16") and runner.kv_mode == kv_mode
    run = runner.generate(PROMPT, NEW_TOKENS, forced=ref.tokens, keep_logits=True)
    scale = max(float(np.abs(x).max()) for x in ref.logits)
    first = float(np.abs(run.logits[0] - ref.logits[0]).max())
    assert first <= scale * 2**-8, (first, scale)  # the prefill: logits rounded, nothing else
    diffs = [float(np.abs(a - b).max()) for a, b in zip(run.logits, ref.logits, strict=True)]
    assert max(diffs) <= scale * 0.05, (diffs, scale)  # and the caches rounded after it
    assert all(np.isfinite(x).all() for x in run.logits)
    agree = sum(a == b for a, b in zip(run.argmax, ref.argmax, strict=True))
    assert agree >= NEW_TOKENS - 2, (run.argmax, ref.argmax)
