"""Packages of every quantization method run in onnxruntime-genai, on the CPU and on WebGPU
(through the plugin: lavapipe here), and generate what our own runner does from the same
package (issue 24; that each package computes its own dequantized weights is tested per
method in test_gptq.py, test_awq.py and test_quantize_ort.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.genai_runner import GenaiRunner
from engine.runtime.runner import Runner, RunnerOptions
from tests._support.tiny_llama import make_checkpoint

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-shaped with a tokenizer (the calibrated methods read the built-in text)."""
    folder = tmp_path_factory.mktemp("methods") / "qwen2"
    make_checkpoint(folder, "qwen2")
    return folder


@pytest.mark.parametrize("ep", ["cpu", "webgpu"])
@pytest.mark.parametrize("method", ["rtn", "search", "gptq", "awq", "awq-gptq"])
def test_every_method_runs_in_genai_as_in_our_runner(
    qwen2: Path, tmp_path: Path, ep: str, method: str
):
    # INT8 tables: hidden 80 is 5 blocks of 16, which WebGPU reads only in 8 bits
    options = ExportOptions(
        ep=ep, dtype="fp32", weight_bits=4, embedding_bits=8, block_size=16, quant_method=method
    )
    result = export(tmp_path / "pkg", model_dir=qwen2, options=options)
    if method != "rtn" and method != "search":
        assert any(n.startswith(("GPTQ", "AWQ")) for n in result.notes), result.notes
    ours = Runner(tmp_path / "pkg", RunnerOptions(ep=ep)).generate(PROMPT, NEW_TOKENS)
    genai = GenaiRunner(tmp_path / "pkg", ep=ep).generate(PROMPT, NEW_TOKENS)
    assert genai.tokens == ours.tokens
    assert len(set(ours.tokens)) > 1  # not a degenerate repeat of one token
