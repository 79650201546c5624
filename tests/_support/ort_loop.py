"""A plain onnxruntime greedy loop over a package, independent of the engine's runner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def ort_greedy(
    package: Path,
    prompt: list[int],
    steps: int,
    providers: list[str] | None = None,
    forced: list[int] | None = None,
) -> tuple[list[int], list[np.ndarray]]:
    """Prefill ``prompt`` then ``steps`` greedy steps (``forced``: feed these tokens
    instead of the argmax, to compare logits along another run's path).

    The KV cache grows by Concat, or, for a package that declares
    ``past_present_share_buffer`` (its attention writes into static buffers), is one
    ``[1, kv_heads, max_length, head_dim]`` buffer per cache fed back each step, as
    onnxruntime-genai shares them. Returns generated tokens and float32 logits per step
    ([S, V] each).
    """
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(package / "model.onnx"), providers=providers or ["CPUExecutionProvider"]
    )
    inputs = {i.name: i for i in session.get_inputs()}
    index_dtype = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
    float_dtype = (
        np.float16
        if "float16" in inputs[next(n for n in inputs if n.startswith("past"))].type
        else np.float32
    )
    config = package / "genai_config.json"
    search = json.loads(config.read_text()).get("search", {}) if config.exists() else {}
    length = search["max_length"] if search.get("past_present_share_buffer") else 0
    past = {
        name: np.zeros((1, info.shape[1], length, info.shape[3]), dtype=float_dtype)
        for name, info in inputs.items()
        if name.startswith("past_key_values")
    }
    output_names = [o.name for o in session.get_outputs()]
    ids = np.array([prompt], dtype=index_dtype)
    total = len(prompt)
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    for step in range(steps + 1):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), dtype=index_dtype), **past}
        outputs = dict(zip(output_names, session.run(None, feeds), strict=True))
        logits.append(outputs["logits"][0].astype(np.float32))
        past = {
            name.replace("present", "past_key_values"): value
            for name, value in outputs.items()
            if name.startswith("present")
        }
        if step < steps:
            tokens.append(int(logits[-1][-1].argmax()))
            fed = tokens[-1] if forced is None else forced[step]
            ids = np.array([[fed]], dtype=index_dtype)
            total += 1
    return tokens, logits
