"""Regenerate ``genai-builder-llama-int4/``: another exporter's package for the inspector tests.

A tiny random Llama (transformers) exported by onnxruntime-genai's own model builder, INT4,
CPU. Needs torch, transformers and onnxruntime-genai (the dev extra); takes a few minutes,
so the tests read the committed result instead of running the builder each time.

    python tests/engine/data/make_foreign_package.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "genai-builder-llama-int4"


def main() -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "llama"
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
        LlamaForCausalLM(config).save_pretrained(source)
        tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2"
        )
        fast.save_pretrained(source)
        shutil.rmtree(OUT, ignore_errors=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "onnxruntime_genai.models.builder",
                "-i",
                str(source),
                "-o",
                str(OUT),
                "-p",
                "int4",
                "-e",
                "cpu",
                "-c",
                str(Path(tmp) / "cache"),
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
