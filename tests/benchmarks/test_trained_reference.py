"""benchmarks/trained_reference.py's scoring path on a tiny package, so ``--webgpu`` cannot
rot between runs: prefill logits on the WebGPU EP (the plugin; lavapipe without a GPU)
equal the CPU EP's for an fp32 WebGPU package of a Qwen3-architecture model (what the
reference trains), and scoring equal logits gives KLD 0 and full top-1."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests._support.webgpu import require_webgpu

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import trained_reference  # noqa: E402

pytestmark = [pytest.mark.webgpu]


def test_webgpu_prefill_scores_like_the_cpu(tmp_path: Path):
    from engine.options import ExportOptions
    from engine.pipeline import export
    from tests._support.tiny_llama import make_checkpoint

    require_webgpu()
    make_checkpoint(tmp_path / "checkpoint", "qwen3_sliding")
    options = ExportOptions(ep="webgpu", dtype="fp32")
    package = export(tmp_path / "pkg", model_dir=tmp_path / "checkpoint", options=options).output
    sequences = [np.arange(3, 19, dtype=np.int32), np.array([7, 1, 9, 4, 4, 2], np.int32)]
    cpu = trained_reference.prefill_logits(package, sequences, "cpu")
    webgpu = trained_reference.prefill_logits(package, sequences, "webgpu")
    assert [a.shape for a in webgpu] == [(16, cpu[0].shape[1]), (6, cpu[0].shape[1])]
    assert max(float(np.abs(a - b).max()) for a, b in zip(cpu, webgpu, strict=True)) < 1e-4
    scored = trained_reference.score(cpu, webgpu, sequences)
    assert scored["kld"] < 1e-8 and scored["top1"] == 1.0
    # a different package is not scored as equal (the score can fail)
    shifted = [a + np.linspace(0, 3, a.shape[1]) for a in webgpu]
    assert trained_reference.score(cpu, shifted, sequences)["kld"] > 1e-3
