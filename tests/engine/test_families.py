"""Llama, Mistral, Qwen2, Qwen3 and SmolLM3 through the same stages as Gemma 4, exact against
transformers' own forward of tiny random checkpoints (tests/_support/tiny_llama.py: odd
widths, GQA and MQA, tied and untied heads, biases, q/k norms, llama3 RoPE, layers without
RoPE, sliding windows shorter than the run), on every attention lowering, through onnxruntime-genai,
and quantized against transformers running the package's dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import SpecError
from engine.models import family_for, spec_from_config
from engine.options import ExportOptions
from engine.pipeline import export
from tests._support.genai_loop import genai_greedy
from tests._support.ort_loop import ort_greedy
from tests._support.quantized import (
    MIXED_BY_NAME,
    WIDE_QWEN2,
    dequantized_model,
    forced_logits,
    hf_forced_logits,
    hf_stepwise_logits,
)
from tests._support.tiny_gemma import hf_greedy
from tests._support.tiny_llama import BASE, CONFIGS, make_checkpoint

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 12, 8, 77, 150]
STEPS = 24  # 36 positions: past every tiny sliding window (8)

LOWERINGS = {
    "cpu-gqa": dict(ep="cpu", attention="gqa"),  # GroupQueryAttention, int64 I/O
    "cpu-standard": dict(ep="cpu", attention="standard"),  # plain ONNX ops, Concat-grown KV
    "webgpu": dict(ep="webgpu"),  # static KV buffers, fp32 core, int32 I/O (on the CPU EP)
}


class Checkpoints:
    """Each tiny checkpoint and transformers' greedy run of it, made once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[str, tuple[Path, Any, list[int], list[np.ndarray]]] = {}

    def get(self, name: str) -> tuple[Path, Any, list[int], list[np.ndarray]]:
        if name not in self._made:
            path = self.root / name
            model = make_checkpoint(path, name)
            tokens, logits = hf_greedy(model, PROMPT, STEPS)
            self._made[name] = (path, model, tokens, logits)
        return self._made[name]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("families"))


@pytest.mark.parametrize("lowering", sorted(LOWERINGS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fp32_package_matches_transformers_every_step(
    checkpoints: Checkpoints, tmp_path: Path, name: str, lowering: str
):
    model_dir, _, ref_tokens, ref_logits = checkpoints.get(name)
    out = tmp_path / "pkg"
    result = export(
        out, model_dir=model_dir, options=ExportOptions(dtype="fp32", **LOWERINGS[lowering])
    )
    assert result.plan.spec.model_type == CONFIGS[name]["model_type"]
    tokens, logits = ort_greedy(out, PROMPT, STEPS)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)]
    assert max(diffs) <= 1e-4, f"max abs logit diff per step: {diffs}"
    assert tokens == ref_tokens


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_genai_generates_transformers_tokens(checkpoints: Checkpoints, tmp_path: Path, name: str):
    """onnxruntime-genai 0.18 loads the package under its family's ``model.type`` and
    generates transformers' greedy tokens."""
    model_dir, _, ref_tokens, _ = checkpoints.get(name)
    out = tmp_path / "pkg"
    export(out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32"))
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["type"] == CONFIGS[name]["model_type"]
    assert genai_greedy(out, PROMPT, STEPS) == ref_tokens


@pytest.mark.parametrize(
    ("name", "bits", "embedding_bits", "lowering"),
    # qwen3 on WebGPU: 8-bit tables (its GatherBlockQuantized reads 4-bit rows only of an
    # even block count; hidden 72 has 5 blocks of 16)
    [
        ("llama", 4, 4, "cpu-gqa"),
        ("phi4", 4, 8, "webgpu"),  # q/k rows reordered for partial RoPE, read fused
        ("qwen2", 8, 4, "cpu-gqa"),
        ("qwen3", 4, 8, "webgpu"),
        ("gemma3", 4, 8, "cpu-gqa"),
    ],
)
def test_quantized_package_computes_its_dequantized_weights(
    checkpoints: Checkpoints,
    tmp_path: Path,
    name: str,
    bits: int,
    embedding_bits: int,
    lowering: str,
):
    """INT4 / INT8 weights (MatMulNBits, GatherBlockQuantized tables, a tied head reading the
    embedding's bytes) equal transformers running the package's own dequantized weights."""
    model_dir, model, ref_tokens, _ = checkpoints.get(name)
    options = ExportOptions(
        dtype="fp32",
        weight_bits=bits,
        embedding_bits=embedding_bits,
        block_size=16,
        accuracy_level=0,
        **LOWERINGS[lowering],
    )
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=options)
    assert any(wp.quantized for wp in result.plan.decoder.weights)
    ours = forced_logits(out, PROMPT, ref_tokens)
    theirs = hf_stepwise_logits(dequantized_model(model, result), PROMPT, ref_tokens)
    assert float(np.abs(ours - theirs).max()) <= 1e-4
    # ... and it is quantized: the float model's logits are further away.
    original = hf_stepwise_logits(model, PROMPT, ref_tokens)
    assert float(np.abs(ours - original).max()) > 1e-3


def test_the_fixtures_exercise_what_they_claim(checkpoints: Checkpoints):
    """Guards for the tests above: the runs outlast the sliding windows, the llama3 RoPE
    scaling moves the logits, biases and q/k norms are really in the checkpoints."""
    for name in ("mistral", "qwen3_sliding"):
        _, model, _, _ = checkpoints.get(name)
        assert len(PROMPT) + STEPS > model.config.sliding_window
        spec = spec_from_config(model.config.to_dict())
        assert "sliding" in {layer.attention for layer in spec.layers}
    _, llama, _, _ = checkpoints.get("llama")
    spec = spec_from_config(llama.config.to_dict())
    rope = spec.rope["full"]
    assert rope.kind == "llama3"
    plain = np.asarray(rope.inv_freq(32)) * 0 + 1 / 500_000.0 ** (np.arange(0, 32, 2) / 32)
    assert not np.allclose(rope.inv_freq(32), plain)
    _, qwen2, _, _ = checkpoints.get("qwen2")
    assert qwen2.model.layers[0].self_attn.q_proj.bias is not None
    _, qwen3, _, _ = checkpoints.get("qwen3")
    assert qwen3.model.layers[0].self_attn.q_norm.weight.shape == (48,)
    _, phi3, _, _ = checkpoints.get("phi3")
    assert phi3.model.layers[0].self_attn.qkv_proj.weight.shape == (4 * 16 + 2 * 2 * 16, 64)
    assert phi3.model.layers[0].mlp.gate_up_proj.weight.shape == (2 * 136, 64)
    _, smol, _, _ = checkpoints.get("smollm3")
    spec = spec_from_config(smol.config.to_dict())
    assert [x.rope for x in spec.layers] == [True, False, True]
    assert [x.attention for x in spec.layers] == ["full", "sliding", "full"]
    # Gemma 3: its norms are 1 + w (and w is far from 0 here, so reading w alone would
    # fail the parity tests); its scale is query_pre_attn_scalar's; two RoPEs.
    _, gemma3, _, _ = checkpoints.get("gemma3")
    spec = spec_from_config(gemma3.config.to_dict())
    assert [x.attention for x in spec.layers] == ["sliding", "full", "sliding"]
    assert spec.layers[0].attention_scale == 24**-0.5 != spec.layers[0].head_dim ** -0.5
    assert spec.rope["full"].kind == "linear" and spec.rope["full"].factor == 8.0
    assert spec.rope["sliding"].theta == 10_000.0 and spec.rope["full"].theta == 1e6
    assert float(gemma3.model.layers[0].input_layernorm.weight.detach().abs().min()) > 0.3
    assert len(PROMPT) + STEPS > spec.sliding_window
    # Phi-4's shape: 24 of each head's 32 channels rotate (the rest pass), and the runs pass
    # longrope's original length: transformers' one forward (long factors everywhere) and its
    # step-by-step run (short ones while the sequence is short) differ, so the parity tests
    # see which set each step takes.
    _, phi4, tokens, _ = checkpoints.get("phi4")
    rope = spec_from_config(phi4.config.to_dict()).rope["full"]
    assert rope.kind == "longrope" and rope.rotary_dim(32) == 24
    assert rope.channel_order(32) is not None
    assert rope.switches(len(PROMPT) + STEPS) and not rope.switches(16)
    assert rope.attention_scaling == pytest.approx((1 + np.log(256 / 16) / np.log(16)) ** 0.5)
    whole = hf_forced_logits(phi4, PROMPT, tokens)
    assert float(np.abs(whole - hf_stepwise_logits(phi4, PROMPT, tokens)).max()) > 1e-2


@pytest.mark.parametrize(("max_length", "rows"), [(16, 16), (64, 128)])
def test_longrope_caches_hold_the_long_set_only_past_the_original_length(
    checkpoints: Checkpoints, max_length: int, rows: int
):
    """A package whose context fits longrope's original length (16) keeps the short set;
    a longer one keeps the long set after it, rows ``max_length`` on."""
    from engine.models import load_spec
    from engine.plan import plan

    model_dir, _, _, _ = checkpoints.get("phi4")
    export_plan = plan(load_spec(model_dir), ExportOptions(ep="cpu", max_length=max_length))
    cache = export_plan.decoder.weight("rope.full.cos_cache")
    assert cache.weight.shape == (rows, 16)
    assert cache.weight.computed is not None
    assert cache.weight.computed.long_from == (None if rows == max_length else max_length)


def test_gemma3_norms_read_one_plus_w(checkpoints: Checkpoints, tmp_path: Path):
    """Every norm scale of a Gemma 3 package holds 1 + the checkpoint's w (in fp32), on the
    per-head q/k norm table of the WebGPU lowering too; nothing else is offset."""
    import onnx
    from onnx import numpy_helper

    from engine.models import load_spec
    from engine.plan import plan

    model_dir, model, _, _ = checkpoints.get("gemma3")
    export_plan = plan(load_spec(model_dir), ExportOptions(ep="webgpu", dtype="fp32"))
    norms = [w.weight for w in export_plan.decoder.weights if w.weight.role == "norm"]
    offsets = {p.offset for w in norms for p in (w.parts or (w,)) if p.source is not None}
    assert norms and offsets == {1.0}
    others = {w.weight.offset for w in export_plan.decoder.weights if w.weight.role != "norm"}
    assert others == {0.0}
    out = tmp_path / "pkg"
    export(out, model_dir=model_dir, options=ExportOptions(ep="cpu", dtype="fp32"))
    proto = onnx.load(str(out / "model.onnx"))
    stored = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    expected = 1.0 + model.model.layers[1].post_feedforward_layernorm.weight.detach().numpy()
    np.testing.assert_array_equal(stored["layers.1.post_feedforward_layernorm.weight"], expected)


def test_gemma3_published_fields_are_read_as_transformers_reads_them():
    """The 1B's published config (rope_theta, rope_local_base_freq, sliding_window_pattern)
    and transformers 5's rope_parameters give one spec; a 4B-style rope_scaling scales the
    full layers only."""
    legacy = _config(
        "gemma3_text",
        rope_theta=1e6,
        rope_local_base_freq=10_000,
        sliding_window_pattern=3,
        num_hidden_layers=6,
        sliding_window=8,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    )
    old = spec_from_config(legacy)
    assert [x.attention for x in old.layers] == ["sliding", "sliding", "full"] * 2
    assert old.rope["full"].kind == "linear" and old.rope["full"].factor == 8.0
    assert old.rope["sliding"].kind == "default" and old.rope["sliding"].theta == 10_000.0
    layer_types = [("full" if (i + 1) % 3 == 0 else "sliding") + "_attention" for i in range(6)]
    new = spec_from_config(
        _config(
            "gemma3_text",
            num_hidden_layers=6,
            sliding_window=8,
            layer_types=layer_types,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
    )
    assert old.rope == new.rope and old.layers == new.layers
    assert family_for("gemma3_text").name == "gemma3" == family_for("gemma3").name


@pytest.mark.parametrize(("preset", "parameters"), [("gemma3-1b", 1.0e9), ("gemma3-4b", 3.88e9)])
def test_gemma3_presets_hold_the_published_sizes(preset: str, parameters: float):
    """Gemma 3 1B: 1.0 B parameters; 4B: 4.3 B with its ~0.42 B vision encoder, which is not
    exported (3.88 B of text decoder)."""
    from engine.models import model_summary
    from engine.presets import load_preset

    assert abs(model_summary(load_preset(preset))["parameters"] - parameters) / parameters < 0.01


def test_a_kind_no_layer_rotates_in_has_no_rope_caches(checkpoints: Checkpoints, tmp_path: Path):
    """SmolLM3's sliding layer is its no-RoPE one: no sliding cos / sin caches are planned,
    on any lowering."""
    model_dir, _, _, _ = checkpoints.get("smollm3")
    for lowering, flags in LOWERINGS.items():
        result = export(
            tmp_path / lowering, model_dir=model_dir, options=ExportOptions(dtype="fp32", **flags)
        )
        names = {w.name for w in result.plan.decoder.weights if w.weight.role == "rope_cache"}
        assert names == {"rope.full.cos_cache", "rope.full.sin_cache"}, (lowering, names)


# ------------------------------------------------------------------------------ reading configs


def _config(model_type: str, **changes: Any) -> dict[str, Any]:
    config = {**BASE, "model_type": model_type, **changes}
    return {k: v for k, v in config.items() if v is not None}


def test_each_type_is_read_with_transformers_defaults():
    llama = spec_from_config(_config("llama", head_dim=None, attention_bias=True))
    assert llama.layers[0].head_dim == 72 // 4 and llama.qkv_bias and llama.o_bias
    assert not llama.qk_norm and {x.attention for x in llama.layers} == {"full"}
    assert llama.layers[0].attention_scale == 18**-0.5
    qwen2 = spec_from_config(_config("qwen2"))
    assert qwen2.qkv_bias and not qwen2.o_bias
    qwen3 = spec_from_config(_config("qwen3", head_dim=None))
    assert qwen3.qk_norm and qwen3.layers[0].head_dim == 128  # Qwen3Config's default
    # Mistral: a config without the field has transformers' 4096 window; null has none.
    long = 8192
    assert spec_from_config(_config("mistral", max_position_embeddings=long)).sliding_window == 4096
    # ... and a window no shorter than the positions hides nothing: full layers.
    assert spec_from_config(_config("mistral")).sliding_window == 0  # 4096 over 256
    no_window = _config("mistral", max_position_embeddings=long)
    no_window["sliding_window"] = None
    assert {x.attention for x in spec_from_config(no_window).layers} == {"full"}
    # Qwen drops the window unless use_sliding_window.
    assert {x.attention for x in spec_from_config(_config("qwen3", sliding_window=8)).layers} == {
        "full"
    }
    assert family_for("qwen3").name == "llama"


def test_published_rope_fields_are_read_as_transformers_reads_them():
    """Hub checkpoints carry ``rope_theta`` and ``rope_scaling``; transformers 5 writes
    ``rope_parameters``. Both give the same spec."""
    scaling = dict(
        rope_type="llama3",
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    old = spec_from_config(_config("llama", rope_theta=500_000.0, rope_scaling=scaling))
    new = spec_from_config(_config("llama", rope_parameters={**scaling, "rope_theta": 500_000.0}))
    assert old.rope == new.rope and old.rope["full"].theta == 500_000.0
    assert old.rope["full"].kind == "llama3"
    plain = spec_from_config(_config("qwen2"))
    assert plain.rope["full"].theta == 10_000.0 and plain.rope["full"].kind == "default"


@pytest.mark.parametrize(
    ("model_type", "changes", "message"),
    [
        ("llama", {"mlp_bias": True}, "mlp_bias=true is not supported"),
        ("llama", {"num_key_value_heads": 3}, r"num_key_value_heads \(3\) does not divide"),
        ("llama", {"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not supported"),
        (
            "llama",
            {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}},
            "'long_factor' must be a list of numbers",
        ),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ("llama", {"head_dim": None, "hidden_size": 70}, "not a multiple of num_attention_heads"),
        ("qwen3", {"head_dim": 33}, "'head_dim' must be even"),
        ("qwen2", {"eos_token_id": 400}, "'eos_token_id' is 400, outside the vocabulary"),
        (
            "qwen3",
            {"use_sliding_window": True, "sliding_window": 8, "layer_types": ["x"] * 3},
            "unknown layer types",
        ),
        ("smollm3", {"no_rope_layers": [1, 0]}, "'no_rope_layers' has 2 entries"),
        (
            "phi3",
            {
                "rope_scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0],
                    "long_factor": [1.0],
                }
            },
            r"short_factor has 1 values; head_dim 32 with partial_rotary_factor 1.0 rotates 16",
        ),
        (
            "phi3",
            {"rope_scaling": {"type": "su", "short_factor": [1.0] * 16, "long_factor": [0] * 16}},
            "'long_factor' must hold positive numbers only",
        ),
        ("phi3", {"partial_rotary_factor": 0.3}, "rotates 9 of head_dim 32 channels"),
        (
            "phi3",
            {
                "original_max_position_embeddings": 0,
                "rope_scaling": {
                    "type": "longrope",
                    "short_factor": [1] * 16,
                    "long_factor": [1] * 16,
                },
            },
            "'original_max_position_embeddings' must be at least 1",
        ),
        ("qwen3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor with q/k norms"),
        ("smollm3", {"no_rope_layers": [1, 2, 1]}, "must be a list of 0 and 1"),
        ("gemma3_text", {"use_bidirectional_attention": True}, "EmbeddingGemma"),
        ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attention softcapping"),
        ("gemma3_text", {"query_pre_attn_scalar": 0}, "must be positive"),
        ("gemma3", {}, "needs a 'text_config' object"),
    ],
)
def test_bad_configs_name_the_problem(model_type: str, changes: dict[str, Any], message: str):
    with pytest.raises(SpecError, match=message):
        spec_from_config(_config(model_type, **changes), origin="cfg")


def test_towers_are_refused_for_a_text_family(checkpoints: Checkpoints, tmp_path: Path):
    from engine.errors import OptionsError

    model_dir, _, _, _ = checkpoints.get("qwen2")
    with pytest.raises(OptionsError, match="has no vision tower"):
        export(
            tmp_path / "pkg",
            model_dir=model_dir,
            options=ExportOptions(modalities=("text", "vision")),
        )
    assert not (tmp_path / "pkg").exists()


# ------------------------------------------------------------------------------ plans and splits


@pytest.mark.parametrize(
    ("preset", "non_embedding"),
    # The model cards' "Number of Parameters (Non-Embedding)" (Qwen3) and sizes (Llama 3.2,
    # Qwen2.5: total parameters).
    [("qwen3-0.6b", 0.44e9), ("qwen3-1.7b", 1.4e9), ("qwen3-4b", 3.6e9), ("qwen3-8b", 6.95e9)],
)
def test_presets_hold_the_published_parameter_counts(preset: str, non_embedding: float):
    from engine.models import model_summary
    from engine.presets import load_preset

    spec = load_preset(preset)
    summary = model_summary(spec)
    tables = spec.vocab_size * spec.hidden_size * (1 if spec.tie_word_embeddings else 2)
    assert abs(summary["parameters"] - tables - non_embedding) / non_embedding < 0.02


def test_phi3s_original_length_is_read_where_transformers_reads_it():
    """Phi-3 keeps original_max_position_embeddings beside the rope fields, and transformers
    takes that one first (Phi3Config's 4096 when the config has none): its Phi3Config of
    these two configs holds 16 and 4096."""
    factors = {"short_factor": [1.0] * 16, "long_factor": [2.0] * 16}
    inner = {"type": "longrope", "original_max_position_embeddings": 8, **factors}
    both = spec_from_config(
        _config("phi3", original_max_position_embeddings=16, rope_scaling=inner)
    ).rope["full"]
    assert both.original_max_position_embeddings == 16 and both.factor == 256 / 16
    default = spec_from_config(
        _config("phi3", max_position_embeddings=8192, rope_scaling={"type": "longrope", **factors})
    ).rope["full"]
    assert default.kind == "longrope" and default.original_max_position_embeddings == 4096


def test_phi4_mini_preset_is_read_as_transformers_reads_it():
    """Phi-4-mini's published config (the preset): 3.84 B parameters (the card's 3.8 B), and
    its RoPE, short and long, equal to transformers' own longrope over the 96 of 128 channels
    that rotate, with the attention factor from 131,072 / 4,096."""
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.models import model_summary
    from engine.presets import load_preset, preset_config

    spec = load_preset("phi4-mini")
    assert abs(model_summary(spec)["parameters"] - 3.84e9) / 3.84e9 < 0.01
    rope = spec.rope["full"]
    assert (rope.kind, rope.rotary_dim(128), rope.rotated_pairs(128)) == ("longrope", 96, 48)
    raw = {k: v for k, v in preset_config("phi4-mini").items() if not k.startswith("_")}
    config = transformers.Phi3Config(**raw)
    for seq_len, long in ((None, False), (4097, True)):
        inv, scale = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len)
        ours = rope.inv_freq(128, long=long)
        np.testing.assert_allclose(ours[:48], inv.numpy(), rtol=1e-6)
        assert not ours[48:].any()  # the passing channels' pairs: frequency 0
        assert rope.attention_scaling == pytest.approx(scale)


def test_a_150k_vocabulary_is_split_to_fit_webgpu_buffers():
    """Qwen3-1.7B's fp16 token table (151,936 x 2,048, 594 MiB) is over WebGPU's 256 MiB
    buffer: the plan splits it, and the tied head reads the same pieces."""
    from engine.plan import plan
    from engine.presets import load_preset

    export_plan = plan(load_preset("qwen3-1.7b"), ExportOptions(ep="webgpu", dtype="fp16"))
    table = export_plan.decoder.weight("embed_tokens.weight")
    head = export_plan.decoder.weight("lm_head.weight")
    assert table.is_split and table.unsplit_nbytes == 151_936 * 2_048 * 2
    assert max(piece.largest_buffer for piece in table.pieces) <= 256 * 2**20
    assert head.shares == "embed_tokens.weight"
    assert all(t.nbytes <= 256 * 2**20 for s in export_plan.sessions for t in s.tensors())


@pytest.mark.parametrize(("name", "lowering"), [("qwen3", "webgpu"), ("llama", "cpu-gqa")])
def test_split_tables_compute_the_same_model(
    checkpoints: Checkpoints, tmp_path: Path, name: str, lowering: str
):
    """A buffer limit a third of the tiny tables' sizes splits the token table and the LM
    head; the package still equals transformers (``force``: the fused q/k/v weight stays
    over that limit, linear weights are not split)."""
    model_dir, _, ref_tokens, ref_logits = checkpoints.get(name)
    out = tmp_path / "pkg"
    options = ExportOptions(
        dtype="fp32", max_buffer_size=32 * 1024, force=True, **LOWERINGS[lowering]
    )
    result = export(out, model_dir=model_dir, options=options)
    split = {w.name for w in result.plan.decoder.weights if w.is_split}
    assert {"embed_tokens.weight", "lm_head.weight"} <= split
    tokens, logits = ort_greedy(out, PROMPT, STEPS)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)) <= 1e-4
    assert tokens == ref_tokens


def test_a_multimodal_gemma3_checkpoint_exports_its_text_decoder(tmp_path: Path):
    """Gemma 3 4B and up are ``gemma3`` checkpoints (Gemma3ForConditionalGeneration, keys
    under ``language_model.model.`` as published and as transformers saves them): the text
    decoder is exported, the vision tower left unread; transformers' own forward of the
    whole model on text gives the same logits and tokens, and genai generates them."""
    import torch
    import transformers

    from tests._support.tiny_gemma import make_tokenizer

    text = {**BASE, **CONFIGS["gemma3"]}
    text.pop("model_type")
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
        image_token_index=330,
        boi_token_index=328,
        eoi_token_index=329,
    )
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(0.2 * torch.randn_like(param) if "norm" in name else 0.08 * param.normal_())
    model.save_pretrained(tmp_path / "checkpoint")
    make_tokenizer(tmp_path / "checkpoint", text["vocab_size"])
    ref_tokens, ref_logits = hf_greedy(model, PROMPT, STEPS)
    out = tmp_path / "pkg"
    result = export(out, model_dir=tmp_path / "checkpoint", options=ExportOptions(dtype="fp32"))
    assert result.plan.spec.source_model_type == "gemma3"
    tokens, logits = ort_greedy(out, PROMPT, STEPS)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ref_logits, logits, strict=True)) <= 1e-4
    assert tokens == ref_tokens
    assert genai_greedy(out, PROMPT, STEPS) == ref_tokens
    from engine.errors import OptionsError

    with pytest.raises(OptionsError, match="only Gemma 3's text decoder is exported"):
        export(
            tmp_path / "mm",
            model_dir=tmp_path / "checkpoint",
            options=ExportOptions(modalities=("text", "vision")),
        )
    assert not (tmp_path / "mm").exists()


def test_mixed_precision_by_name_keeps_the_chosen_layers_in_int8(
    checkpoints: Checkpoints, tmp_path: Path
):
    """``keep_int8``: INT4 weights but layer 0 and the token table in INT8. The plan says
    so per tensor (and sizes it), the graph's MatMulNBits / GatherBlockQuantized nodes carry
    each weight's own bits, and the package equals transformers on its dequantized
    weights; genai runs it."""
    import onnx

    from engine.errors import OptionsError
    from engine.plan import plan

    model_dir, model, ref_tokens, _ = checkpoints.get("qwen2")
    options = ExportOptions(**MIXED_BY_NAME)
    out = tmp_path / "pkg"
    result = export(out, model_dir=model_dir, options=options)
    bits = {wp.name: wp.bits for wp in result.plan.decoder.weights if wp.quantized}
    assert bits["layers.0.self_attn.q_proj.weight"] == 8 == bits["embed_tokens.weight"]
    assert bits["layers.1.self_attn.q_proj.weight"] == 4 == bits["layers.2.mlp.down_proj.weight"]
    all_int4 = plan(result.plan.spec, replace_options(options, keep_int8=()))
    assert result.plan.nbytes > all_int4.nbytes
    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
    node_bits = {
        node.input[1]: next(a.i for a in node.attribute if a.name == "bits")
        for node in proto.graph.node
        if node.op_type == "MatMulNBits"
    }
    assert sorted(set(node_bits.values())) == [4, 8]
    ours = forced_logits(out, PROMPT, ref_tokens)
    theirs = hf_forced_logits(dequantized_model(model, result), PROMPT, ref_tokens)
    assert float(np.abs(ours - theirs).max()) <= 1e-4
    assert len(genai_greedy(out, PROMPT, 8)) == 8
    with pytest.raises(OptionsError, match="nothing is quantized"):
        ExportOptions(keep_int8=("layers.0.*",)).resolve()
    for pattern in ("layers.99.*", "layers.0.input_layernorm.weight"):  # a typo, a norm
        with pytest.raises(OptionsError, match="matches no quantized weight"):
            export(
                tmp_path / "typo",
                model_dir=model_dir,
                options=replace_options(options, keep_int8=(pattern,)),
            )
    assert not (tmp_path / "typo").exists()


def test_weights_moved_to_int8_take_block_128_where_their_width_allows(tmp_path: Path):
    """A weight ``keep_int8`` moves to 8 bits takes blocks of 128 where that divides its
    width (a quarter of block 32's scale bytes; 8-bit codes lose almost nothing to it), else
    the largest block between the chosen one and 128 that does: here 64 for the 192-wide
    MLP input, and the tied head reads the table's 128-blocks. The package computes its own
    dequantized weights."""
    import onnx

    from engine.plan import INT8_BLOCK, plan

    model = make_checkpoint(tmp_path / "checkpoint", "qwen2", **WIDE_QWEN2)
    tokens, _ = hf_greedy(model, PROMPT, 8)
    options = ExportOptions(**MIXED_BY_NAME)
    out = tmp_path / "pkg"
    result = export(out, model_dir=tmp_path / "checkpoint", options=options)
    blocks = {wp.name: (wp.bits, wp.block_size) for wp in result.plan.decoder.weights}
    assert INT8_BLOCK == 128
    assert blocks["embed_tokens.weight"] == (8, 128) == blocks["lm_head.weight"]
    assert blocks["layers.0.self_attn.q_proj.weight"] == (8, 128)
    assert blocks["layers.0.mlp.down_proj.weight"] == (8, 64)  # K = 192
    assert blocks["layers.1.self_attn.q_proj.weight"] == (4, 16)
    all_int4 = plan(result.plan.spec, replace_options(options, keep_int8=()))
    assert result.plan.nbytes > all_int4.nbytes
    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
    node_blocks = {
        (attrs["bits"], attrs["block_size"])
        for node in proto.graph.node
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized")
        for attrs in [{a.name: a.i for a in node.attribute}]
    }
    assert {(8, 128), (8, 64), (4, 16)} <= node_blocks
    ours = forced_logits(out, PROMPT, tokens)
    theirs = hf_forced_logits(dequantized_model(model, result), PROMPT, tokens)
    assert float(np.abs(ours - theirs).max()) <= 1e-4


def replace_options(options: ExportOptions, **changes: Any) -> ExportOptions:
    from dataclasses import replace

    return replace(options, **changes)
