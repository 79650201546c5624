"""A text + audio package that onnxruntime-genai 0.18 loads, for speech-session tests, and
a WAV to feed it.

The engine's genai_config does not describe multimodal packages yet, so this writes the
``gemma4`` sections the 0.18 wheel reads (observed by running it): ``speech`` maps
``audio_embeds`` -> ``input_features`` and ``attention_mask`` -> ``input_features_mask``;
the wheel always creates a vision session and feeds the embedding session an
``image_features`` input, so the package gets a stand-in vision graph (never run: no
image) and that input. The tokenizer gains the image / audio marker tokens at the tiny
checkpoints' ids.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from tests._support.tiny_gemma_mm import TOKENS

MARKERS = {
    TOKENS["image_token_id"]: "<|image|>",
    TOKENS["audio_token_id"]: "<|audio|>",
    TOKENS["boi_token_id"]: "<|image>",
    TOKENS["eoi_token_id"]: "<image|>",
    TOKENS["boa_token_id"]: "<|audio>",
    TOKENS["eoa_token_index"]: "<audio|>",
}
AUDIO_PROCESSOR = {
    "feature_extraction": {
        "sequence": [
            {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
            {
                "operation": {
                    "name": "log_mel",
                    "type": "Gemma4LogMel",
                    # Types matter: the wheel refuses an int where it reads a float.
                    "attrs": {
                        "feature_size": 128,
                        "sampling_rate": 16000,
                        "frame_length_ms": 20.0,
                        "hop_length_ms": 10.0,
                        "min_frequency": 0.0,
                        "max_frequency": 8000.0,
                        "preemphasis": 0.0,
                        "preemphasis_htk_flavor": 1,
                        "fft_overdrive": 0,
                        "mel_floor": 0.001,
                    },
                }
            },
        ]
    }
}
IMAGE_PROCESSOR = {
    "processor": {
        "name": "gemma4_image",
        "transforms": [
            {
                "operation": {
                    "name": "decode",
                    "type": "DecodeImage",
                    "attrs": {"color_space": "RGB"},
                }
            },
            {
                "operation": {
                    "name": "patches",
                    "type": "Gemma4ImageTransform",
                    "attrs": {"patch_size": 16, "max_soft_tokens": 280, "pooling_kernel_size": 3},
                }
            },
        ],
    }
}


def write_wav(path: Path, seconds: float = 0.5, rate: int = 16000) -> np.ndarray:
    """A mono 16-bit WAV of two tones; returns the samples as float32 in [-1, 1)."""
    t = np.arange(int(seconds * rate)) / rate
    signal = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 1234 * t)
    pcm = (signal * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return pcm.astype(np.float32) / 32768.0


def make_genai_audio_package(folder: Path) -> None:
    """Turn an exported text + audio package (no per-layer inputs) into one genai loads."""
    config = json.loads((folder / "genai_config.json").read_text())
    model = config["model"]
    hidden = model["decoder"]["hidden_size"]
    model["type"] = "gemma4"
    model["decoder"]["inputs"] = {
        "inputs_embeds": "inputs_embeds",
        "attention_mask": "attention_mask",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    model["embedding"] = {
        "filename": "embedding.onnx",
        "inputs": {
            "input_ids": "input_ids",
            "image_features": "image_features",
            "audio_features": "audio_features",
        },
        "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    model["speech"] = {
        "filename": "speech.onnx",
        "config_filename": "audio_processor_config.json",
        "inputs": {"audio_embeds": "input_features", "attention_mask": "input_features_mask"},
        "outputs": {"audio_features": "audio_features"},
    }
    model["vision"] = {
        "filename": "vision.onnx",
        "config_filename": "processor_config.json",
        "inputs": {"pixel_values": "pixel_values", "pixel_position_ids": "pixel_position_ids"},
        "outputs": {"image_features": "image_features"},
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=1))
    (folder / "audio_processor_config.json").write_text(json.dumps(AUDIO_PROCESSOR, indent=1))
    (folder / "processor_config.json").write_text(json.dumps(IMAGE_PROCESSOR, indent=1))

    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    for token_id, content in MARKERS.items():
        tokenizer["added_tokens"].append(
            dict(
                id=token_id,
                content=content,
                single_word=False,
                lstrip=False,
                rstrip=False,
                normalized=False,
                special=True,
            )
        )
        tokenizer["model"]["vocab"][content] = token_id
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))

    embedding = onnx.load(str(folder / "embedding.onnx"), load_external_data=False)
    feature_type = next(i for i in embedding.graph.input if i.name == "audio_features")
    elem_type = feature_type.type.tensor_type.elem_type
    embedding.graph.input.append(
        oh.make_tensor_value_info("image_features", elem_type, ["num_image_tokens", hidden])
    )
    onnx.save(embedding, str(folder / "embedding.onnx"))
    _stand_in_vision(folder / "vision.onnx", hidden, elem_type)


def _stand_in_vision(path: Path, hidden: int, elem_type: int) -> None:
    """pixel_values [1, N, 768] -> zeros [N / 9, hidden]: loads, never runs here."""
    graph = oh.make_graph(
        [
            oh.make_node("Reshape", ["pixel_values", "rows"], ["pooled"]),
            oh.make_node("MatMul", ["pooled", "zeros"], ["features"]),
            oh.make_node("Cast", ["features"], ["image_features"], to=elem_type),
        ],
        "vision",
        [
            oh.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1, "N", 768]),
            oh.make_tensor_value_info("pixel_position_ids", TensorProto.INT64, [1, "N", 2]),
        ],
        [oh.make_tensor_value_info("image_features", elem_type, ["n", hidden])],
        initializer=[
            numpy_helper.from_array(np.array([-1, 9 * 768], np.int64), "rows"),
            numpy_helper.from_array(np.zeros((9 * 768, hidden), np.float32), "zeros"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
