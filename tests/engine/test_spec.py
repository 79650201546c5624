"""Reading Hugging Face configs (both formats, multimodal nesting) into ModelSpec."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from engine.errors import SpecError
from engine.models import spec_from_config
from engine.models.checkpoint_config import load_config
from engine.presets import list_presets, load_preset, preset_config

OLD_FORMAT = {  # transformers <= 5.14 writes global_* fields
    "model_type": "gemma4_text",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "sliding_window": 8,
    "num_kv_shared_layers": 2,
    "use_double_wide_mlp": True,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": 320,
    "layer_types": ["sliding_attention"] * 2
    + ["full_attention"]
    + ["sliding_attention"] * 2
    + ["full_attention"],
}


def new_format(old: dict) -> dict:
    """The same model as transformers >= 5.15 saves it."""
    new = {
        k: v for k, v in old.items() if k not in ("global_head_dim", "num_global_key_value_heads")
    }
    new["per_layer_config"] = {
        "2": {"head_dim": 32, "num_key_value_heads": 1},
        "5": {"head_dim": 32, "num_key_value_heads": 1},
    }
    return new


def test_both_config_formats_give_the_same_spec():
    old = spec_from_config(OLD_FORMAT)
    new = spec_from_config(new_format(OLD_FORMAT))
    assert old.layers == new.layers
    full = [layer for layer in old.layers if layer.attention == "full"]
    assert {(layer.head_dim, layer.num_kv_heads, layer.k_eq_v) for layer in full} == {(32, 1, True)}


def test_global_kv_heads_apply_only_with_k_eq_v():
    config = dict(OLD_FORMAT, attention_k_eq_v=False)
    spec = spec_from_config(config)
    assert {layer.num_kv_heads for layer in spec.layers} == {2}


def test_kv_sharing_points_at_last_producer_of_same_kind():
    spec = spec_from_config(OLD_FORMAT)
    assert [layer.kv_source for layer in spec.layers] == [0, 1, 2, 3, 3, 2]
    assert [layer.index for layer in spec.kv_layers] == [0, 1, 2, 3]
    assert spec.kv_cache_index(4) == 3 and spec.kv_cache_index(5) == 2
    # double-wide MLP only on shared layers
    assert [layer.intermediate_size for layer in spec.layers] == [128] * 4 + [256] * 2


def test_multimodal_config_reads_nested_text_config():
    spec = spec_from_config(
        {
            "model_type": "gemma4",
            "text_config": dict(OLD_FORMAT),
            "tie_word_embeddings": True,
            "eos_token_id": [1, 106],
        }
    )
    assert spec.source_model_type == "gemma4" and spec.model_type == "gemma4_text"
    assert spec.weight_prefix == "model.language_model."
    assert spec.eos_token_ids == (1, 106)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "bert"}, "model type 'bert' is not supported"),
        ({"hidden_size": None}, "required field 'hidden_size' is missing"),
        ({"num_hidden_layers": "six"}, "'num_hidden_layers' must be a whole number, got 'six'"),
        ({"layer_types": ["sliding_attention"] * 5}, "'layer_types' has 5 entries"),
        ({"layer_types": ["chunked_attention"] * 6}, "unknown layer types"),
        ({"enable_moe_block": True}, "Mixture-of-Experts"),
        ({"num_kv_shared_layers": 6}, "no KV producer"),
        ({"num_key_value_heads": 3}, "does not divide"),
        (
            {"rope_parameters": {"sliding_attention": {"rope_type": "longrope"}}},
            r"rope_type 'longrope' is not supported \(this family does not take it",
        ),
        (
            {"rope_parameters": {"sliding_attention": {"rope_type": "yarn"}}},
            "required field 'original_max_position_embeddings' is missing",
        ),
        (
            {"rope_parameters": {"sliding_attention": {"partial_rotary_factor": 0.5}}},
            "rotating part of each head is not exported for this family.s default RoPE",
        ),
        # Each of these was a traceback (issue 13).
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be at least 1, got 0"),
        (
            {"rope_parameters": {"full_attention": 1e6}},
            r"rope_parameters\['full_attention'\] must be an object, got 1000000.0",
        ),
        ({"eos_token_id": "one"}, "'eos_token_id' must be a token id .* got 'one'"),
        ({"eos_token_id": [1, 9999]}, "'eos_token_id' is 9999, outside the vocabulary"),
        ({"hidden_size": 0}, "'hidden_size' must be at least 1, got 0"),
        ({"max_position_embeddings": 1}, "'max_position_embeddings' must be at least 2"),
        ({"head_dim": 15}, "'head_dim' must be even"),
        ({"global_head_dim": 0}, "'global_head_dim' must be at least 2"),
        ({"sliding_window": 0}, "'sliding_window' must be at least 1"),
        ({"layer_types": 7}, "'layer_types' must be a list of names, got 7"),
        ({"layer_types": [["sliding_attention"]] * 6}, "'layer_types' must be a list of names"),
        ({"rms_norm_eps": float("nan")}, "'rms_norm_eps' must be a finite number"),
        ({"final_logit_softcapping": -30}, "must not be negative"),
        ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false"),
        ({"vocab_size": 10**12}, "larger than any model can use"),
        ({"num_hidden_layers": 5000}, "exports at most 1024"),
        ({"hidden_size": True}, "'hidden_size' must be a number, got True"),
        # Found by the fuzzer: the package built, then failed on token ids >= 130.
        ({"vocab_size_per_layer_input": 130}, "is 130, smaller than vocab_size"),
        (
            {"rope_parameters": {"full_attention": {"partial_rotary_factor": 0}}},
            r"'partial_rotary_factor' must be in \(0, 1\]",
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_theta": "big"}}},
            "'rope_theta' must be a number",
        ),
    ],
)
def test_bad_configs_name_the_problem(change, message):
    config = copy.deepcopy(OLD_FORMAT)
    for key, value in change.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    with pytest.raises(SpecError, match=message):
        spec_from_config(config)


def test_a_config_that_is_not_json_says_where_and_what_to_do(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma4_text",\n}')
    with pytest.raises(SpecError) as caught:
        load_config(tmp_path)
    message = str(caught.value)
    assert "config.json is not valid JSON (line 2, column 1:" in message
    assert "fix it, or copy the model folder again" in message


def test_missing_model_type_is_named():
    config = dict(OLD_FORMAT)
    config.pop("model_type")
    with pytest.raises(SpecError, match="'model_type' is missing"):
        spec_from_config(config)


def test_presets_match_published_architectures():
    assert {"gemma4-e2b", "gemma4-e4b", "gemma4-tiny"} <= set(list_presets())
    e2b, e4b = load_preset("gemma4-e2b"), load_preset("gemma4-e4b")
    assert (e2b.num_layers, e2b.hidden_size, len(e2b.kv_layers)) == (35, 1536, 15)
    assert (e4b.num_layers, e4b.hidden_size, len(e4b.kv_layers)) == (42, 2560, 24)
    assert [layer.attention for layer in e2b.layers[:5]] == ["sliding"] * 4 + ["full"]
    assert {layer.intermediate_size for layer in e2b.layers[15:]} == {12288}
    assert {layer.head_dim for layer in e4b.layers if layer.attention == "full"} == {512}
    assert preset_config("gemma4-e2b")["text_config"]["vocab_size"] == 262144
    # The released E2B / E4B checkpoints see and hear: both presets carry both towers.
    for spec in (e2b, e4b):
        assert spec.towers == ("vision", "audio")
        assert spec.vision is not None and spec.audio is not None
        assert (spec.vision.hidden_size, spec.vision.num_layers, spec.vision.head_dim) == (
            768,
            16,
            64,
        )
        assert (spec.audio.hidden_size, spec.audio.num_layers) == (1024, 12)
        assert spec.audio.output_proj_dims == 1536
        assert spec.eos_token_ids == (1, 106)  # an -it model also stops at <turn|>


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(SpecError, match="gemma4-tiny"):
        load_preset("gemma5")


def test_configs_are_read_by_the_family_their_model_type_names(monkeypatch, tmp_path):
    """Every reader (checkpoint folders, presets) goes through the family registry: a family
    added there reads its own checkpoints, and nothing else needs to know it."""
    import json
    from dataclasses import replace

    import engine.models as models
    from engine.models import family_for, load_spec

    gemma4 = family_for("gemma4_text")
    read: list[tuple[str, str]] = []

    def read_toy(config, name, origin):
        read.append((name, origin))
        return replace(spec_from_config(OLD_FORMAT), name=name)

    toy = replace(gemma4, name="toy", model_types=("toy",), read_spec=read_toy)
    monkeypatch.setattr(models, "_families", lambda: (gemma4, toy))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toy"}))
    spec = load_spec(tmp_path)
    assert spec.name == tmp_path.name and read == [(tmp_path.name, str(tmp_path / "config.json"))]
    with pytest.raises(SpecError, match=r"^cfg: model type 'bert' is not supported "
                       r"\(supported: gemma4, gemma4_text, toy\)$"):  # fmt: skip
        spec_from_config({"model_type": "bert"}, origin="cfg")
    with pytest.raises(SpecError, match="'model_type' must be text, got 7"):
        spec_from_config({"model_type": 7}, origin="cfg")


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_no_truncate": {"rope_type": "yarn", "factor": 16.0, "beta_fast": 16.0,
                         "truncate": False, "original_max_position_embeddings": 32},
    "yarn_attention_factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3,
                              "original_max_position_embeddings": 64},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROPES))
def test_rope_scaling_is_the_frequencies_transformers_computes(name: str):
    """Each rope type's inverse frequencies and cos/sin factor against transformers' own
    ``ROPE_INIT_FUNCTIONS`` (a Llama config carries the parameters)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.models.rope_config import read_rope
    from engine.spec import ROPE_KINDS, RopeSpec

    params = {"rope_theta": 50_000.0, **ROPES[name]}
    head_dim = 64
    config = LlamaConfig(hidden_size=512, num_attention_heads=8, max_position_embeddings=256,
                         rope_parameters=dict(params))  # fmt: skip
    inv, attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    rope = read_rope(params, "cfg", RopeSpec("default", 10_000.0), ROPE_KINDS)
    np.testing.assert_allclose(rope.inv_freq(head_dim), inv.double().numpy(), rtol=2e-6)
    assert rope.attention_scaling == pytest.approx(attention_factor, rel=1e-6)
    default = RopeSpec("default", 50_000.0).inv_freq(head_dim)
    assert not np.allclose(rope.inv_freq(head_dim), default)  # the scaling really applies
