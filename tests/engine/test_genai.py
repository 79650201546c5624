"""onnxruntime-genai loads our package folders and generates transformers' tokens."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og  # the dev extra installs it; a missing one fails loudly
import pytest

from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.genai_loop import genai_greedy
from tests._support.tiny_gemma import hf_greedy

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
NEW_TOKENS = 20


@pytest.mark.parametrize("attention", ["gqa", "standard"])
@pytest.mark.parametrize("config", ["all_features", "plain"])
def test_genai_greedy_equals_transformers(tiny_models, tmp_path: Path, config: str, attention: str):
    model_dir, model = tiny_models.get(config)
    out = tmp_path / "pkg"
    export(
        out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32", attention=attention)
    )
    genai_config = json.loads((out / "genai_config.json").read_text())
    # GQA packages share one preallocated KV buffer between past and present.
    assert genai_config["search"]["past_present_share_buffer"] is (attention == "gqa")

    expected, _ = hf_greedy(model, PROMPT, NEW_TOKENS)
    assert genai_greedy(out, PROMPT, NEW_TOKENS) == expected


def test_genai_tokenizer_loads_from_package(tiny_models, tmp_path: Path):
    model_dir, _ = tiny_models.get("all_features")
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=ExportOptions(ep="cpu"))
    assert "tokenizer.json" in result.tokenizer_files
    tokenizer = og.Tokenizer(og.Model(str(out)))
    ids = [int(t) for t in tokenizer.encode("hello world")]
    assert ids and tokenizer.decode(ids).strip() == "hello world"
