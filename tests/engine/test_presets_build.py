"""Every preset x EP builds a valid graph; the CPU-runnable ones load in onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from engine.caps import list_eps
from engine.errors import OptionsError
from engine.graph.attention import static_kinds
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from engine.presets import list_presets, load_preset
from tests._support.structure import structural_proto

VARIANTS = {
    "float": {},
    "int4": dict(weight_bits=4, embedding_bits=4),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("ep", list_eps())
@pytest.mark.parametrize("preset", list_presets())
def test_graph_passes_onnx_checker(preset: str, ep: str, variant: str):
    # The text package (the presets' vision and audio towers have their own tests).
    options = ExportOptions(ep=ep, modalities=("text",), **VARIANTS[variant])
    try:
        export_plan = plan(load_preset(preset), options)
    except OptionsError as exc:
        # Only refusals an EP is documented to make (no GatherBlockQuantized on DML...).
        assert "unavailable" in str(exc), exc
        return
    model = build_decoder(export_plan)
    onnx.checker.check_model(structural_proto(model), full_check=False)
    names = {i.name for i in model.graph.inputs}
    assert {"input_ids", "attention_mask"} <= names
    kv_inputs = [n for n in names if n.startswith("past_key_values.")]
    assert len(kv_inputs) == 2 * len(export_plan.spec.kv_layers)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("ep", list_eps())
def test_tiny_preset_package_runs_on_cpu_ep(tmp_path: Path, ep: str, variant: str):
    options = ExportOptions(ep=ep, random_weights=True, **VARIANTS[variant])
    try:
        result = export(tmp_path / "pkg", preset="gemma4-tiny", options=options)
    except OptionsError as exc:
        assert "unavailable" in str(exc), exc
        return
    session = ort.InferenceSession(
        str(result.output / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name: i for i in session.get_inputs()}
    index = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
    dtype = np.float16 if "float16" in inputs["past_key_values.0.key"].type else np.float32
    feeds = {"input_ids": np.array([[3, 4, 5]], index), "attention_mask": np.ones((1, 3), index)}
    # Attention that writes into static buffers gets them, as genai's shared KV gives them.
    length = 16 if static_kinds(result.plan.spec, result.plan.options) else 0
    for name, info in inputs.items():
        if name.startswith("past_key_values."):
            feeds[name] = np.zeros((1, info.shape[1], length, info.shape[3]), dtype)
    logits = session.run(["logits"], feeds)[0]
    assert logits.shape == (1, 3, 512)
    assert np.isfinite(logits.astype(np.float32)).all()
