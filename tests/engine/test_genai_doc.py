"""The genai_config editor model: unknown fields kept, typed validation, capture toggles, lint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.genai_doc import ConfigValueError, GenaiConfigError, GenaiDoc, format_path, rule_for

# A config the way other tools write it: fields we do not know at every level, two-space
# indent, a non-ASCII string, numbers in forms Python would print differently.
FOREIGN = """{
  "model": {
    "bos_token_id": 2,
    "context_length": 4096,
    "decoder": {
      "session_options": {
        "log_id": "onnxruntime-genai",
        "provider_options": [{"webgpu": {"enableGraphCapture": "1", "futureKnob": "x"}}],
        "intra_op_num_threads": 4
      },
      "filename": "model.onnx",
      "head_size": 256,
      "hidden_size": 1536,
      "num_attention_heads": 8,
      "num_hidden_layers": 15,
      "num_key_value_heads": 1,
      "sliding_window": {"window_size": 512, "slide_inputs": false, "layers": [0, 1, 2]},
      "x_vendor_extension": {"nested": [1, 2.50, 1e-5], "note": "héllo"}
    },
    "embedding": {
      "filename": "embeds.onnx",
      "session_options": {"provider_options": [{"webgpu": {"enableGraphCapture": "0"}}]}
    },
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
    "type": "gemma4_text",
    "vocab_size": 262144
  },
  "search": {
    "max_length": 4096,
    "num_beams": 1,
    "past_present_share_buffer": true,
    "top_p": 1.0,
    "future_search_option": null
  },
  "producer_notes": ["kept", {"as": "is"}]
}
"""


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    path = tmp_path / "genai_config.json"
    path.write_bytes(FOREIGN.encode("utf-8"))
    return path


def test_unchanged_save_is_byte_identical(foreign: Path, tmp_path: Path):
    doc = GenaiDoc.load(foreign)
    assert not doc.modified
    out = doc.save(tmp_path / "copy.json")
    assert out.read_bytes() == foreign.read_bytes()


def test_setting_a_value_back_is_not_a_change(foreign: Path):
    doc = GenaiDoc.load(foreign)
    doc.set(("search", "max_length"), 100)
    assert doc.modified
    doc.set(("search", "max_length"), 4096)
    assert not doc.modified
    assert doc.dumps() == foreign.read_bytes()


def test_edit_keeps_unknown_fields_and_formatting(foreign: Path):
    doc = GenaiDoc.load(foreign)
    doc.set_text(("search", "max_length"), "2048")
    doc.save()
    text = foreign.read_text(encoding="utf-8")
    saved = json.loads(text)
    original = json.loads(FOREIGN)
    original["search"]["max_length"] = 2048
    assert saved == original  # every unknown field survives, in place
    assert list(saved["model"]) == list(original["model"])  # key order too
    assert text.startswith('{\n  "model": {\n    "bos_token_id": 2,')  # two-space indent
    assert "héllo" in text  # not escaped: the file was not ASCII-only
    assert text.endswith("}\n")


def test_reloaded_saved_file_saves_identically(foreign: Path):
    doc = GenaiDoc.load(foreign)
    doc.set_capture("decoder", False)
    doc.save()
    first = foreign.read_bytes()
    GenaiDoc.load(foreign).save()
    assert foreign.read_bytes() == first


def test_crlf_and_bom_survive_an_edit(tmp_path: Path):
    path = tmp_path / "genai_config.json"
    raw = b"\xef\xbb\xbf" + FOREIGN.replace("\n", "\r\n").encode("utf-8")
    path.write_bytes(raw)
    doc = GenaiDoc.load(path)
    assert doc.dumps() == raw
    doc.set(("search", "num_beams"), 2)
    out = doc.dumps()
    assert out.startswith(b"\xef\xbb\xbf{\r\n")
    assert b"\n" not in out.replace(b"\r\n", b"")


@pytest.mark.parametrize(
    ("path", "text", "reason"),
    [
        (("search", "max_length"), "0", ">= 1"),
        (("search", "max_length"), "12.5", "integer"),
        (("search", "max_length"), "many", "is not an integer"),
        (("search", "top_p"), "1.5", "<= 1"),
        (("search", "temperature"), "0", "> 0"),
        (("search", "past_present_share_buffer"), "yes", "true or false"),
        (("model", "vocab_size"), "-3", ">= 1"),
        (("model", "eos_token_id"), "1, -2", "every id"),
        (("model", "type"), "  ", "must not be empty"),
        (("model", "decoder", "sliding_window", "slide_inputs"), "1", "true or false"),
    ],
)
def test_invalid_values_are_refused_with_the_reason(
    foreign: Path, path: tuple, text: str, reason: str
):
    doc = GenaiDoc.load(foreign)
    before = doc.get(path)
    with pytest.raises(ConfigValueError) as info:
        doc.set_text(path, text)
    assert reason in info.value.reason
    assert doc.get(path) == before
    assert not doc.modified


def test_provider_options_must_be_strings(foreign: Path):
    doc = GenaiDoc.load(foreign)
    path = ("model", "decoder", "session_options", "provider_options", 0, "webgpu", "futureKnob")
    with pytest.raises(ConfigValueError, match="must be text"):
        doc.set(path, 3)
    assert doc.set_text(path, "3") == "3"  # typed into a text field, it stays text


def test_valid_values_are_typed(foreign: Path):
    doc = GenaiDoc.load(foreign)
    assert doc.set_text(("search", "top_p"), "1") == 1.0
    assert isinstance(doc.get(("search", "top_p")), float)
    assert doc.set_text(("model", "eos_token_id"), "1, 106, 107") == [1, 106, 107]
    assert doc.set_text(("model", "decoder", "x_vendor_extension", "note"), "42") == "42"
    assert doc.set_text(("search", "future_search_option"), "[1, 2]") == [1, 2]


def test_containers_cannot_become_scalars(foreign: Path):
    doc = GenaiDoc.load(foreign)
    with pytest.raises(ConfigValueError, match="must stay a JSON object"):
        doc.set(("model", "decoder", "x_vendor_extension"), 3)
    with pytest.raises(ConfigValueError, match="does not exist"):
        doc.set(("model", "nope", "filename"), "x.onnx")


def test_capture_toggles_per_session(foreign: Path):
    doc = GenaiDoc.load(foreign)
    assert doc.sessions() == ["decoder", "embedding"]
    assert doc.capture("decoder") is True
    assert doc.capture("embedding") is False
    doc.set_capture("embedding", True)
    doc.set_capture("decoder", False)
    webgpu = doc.get(("model", "decoder", "session_options", "provider_options", 0, "webgpu"))
    assert webgpu == {"enableGraphCapture": "0", "futureKnob": "x"}
    assert doc.capture("embedding") is True


def test_capture_on_cpu_session_is_refused(foreign: Path):
    doc = GenaiDoc.load(foreign)
    doc.data["model"]["decoder"]["session_options"]["provider_options"] = []
    assert doc.capture("decoder") is None
    with pytest.raises(ConfigValueError, match="no graph-capture option"):
        doc.set_capture("decoder", True)


def test_cuda_capture_uses_its_own_key(tmp_path: Path):
    path = tmp_path / "genai_config.json"
    config = {"model": {"decoder": {"session_options": {"provider_options": [{"cuda": {}}]}}}}
    path.write_text(json.dumps(config))
    doc = GenaiDoc.load(path)
    doc.set_capture("decoder", True)
    assert doc.data["model"]["decoder"]["session_options"]["provider_options"][0] == {
        "cuda": {"enable_cuda_graph": "1"}
    }


def _codes(doc: GenaiDoc) -> set[str]:
    return {lint.code for lint in doc.lint()}


def test_clean_config_has_no_lint(foreign: Path):
    assert _codes(GenaiDoc.load(foreign)) == set()


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        (("search", "past_present_share_buffer"), False, "capture-without-share-buffer"),
        (("model", "decoder", "sliding_window", "slide_inputs"), True, "capture-with-slide-inputs"),
        (("search", "num_beams"), 4, "capture-with-num-beams"),
        (("search", "batch_size"), 2, "capture-with-batch-size"),
    ],
)
def test_capture_traps_are_linted_only_with_capture(
    foreign: Path, path: tuple, value: object, code: str
):
    doc = GenaiDoc.load(foreign)
    doc.data["search"].setdefault("batch_size", 1)
    doc.set(path, value)
    assert code in _codes(doc)
    doc.set_capture("decoder", False)
    assert code not in _codes(doc)


def test_length_and_token_lint(foreign: Path):
    doc = GenaiDoc.load(foreign)
    doc.set(("search", "max_length"), 8192)
    doc.set(("model", "eos_token_id"), [1, 262144])
    codes = _codes(doc)
    assert "max-length-over-context" in codes
    assert "eos-token-id-out-of-vocab" in codes
    doc.set(("model", "eos_token_id"), 262143)
    assert "eos-token-id-out-of-vocab" not in _codes(doc)


def test_problems_report_bad_values_already_in_the_file(tmp_path: Path):
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps({"model": {"vocab_size": "big"}, "search": {"top_k": -1}}))
    problems = {p.path: p.message for p in GenaiDoc.load(path).problems()}
    assert set(problems) == {("model", "vocab_size"), ("search", "top_k")}
    assert "must be an integer" in problems[("model", "vocab_size")]


def test_unreadable_files_raise_engine_errors(tmp_path: Path):
    bad = tmp_path / "genai_config.json"
    bad.write_text("{not json")
    with pytest.raises(GenaiConfigError, match="not valid JSON"):
        GenaiDoc.load(bad)
    with pytest.raises(GenaiConfigError, match="cannot read"):
        GenaiDoc.load(tmp_path / "missing.json")
    bad.write_text("[1, 2]")
    with pytest.raises(GenaiConfigError, match="JSON object"):
        GenaiDoc.load(bad)


def test_package_folder_opens_its_config(foreign: Path):
    assert GenaiDoc.load(foreign.parent).path == foreign


def test_rules_and_paths():
    assert rule_for(("model", "vision", "filename")) is not None
    assert rule_for(("model", "decoder", "x_vendor_extension")) is None
    rule = rule_for(("search", "top_p"))
    assert rule is not None and rule.describe() == "a number from 0 to 1"
    positive = rule_for(("search", "max_length"))
    assert positive is not None and positive.describe() == "an integer >= 1"
    assert format_path(("model", "decoder", "provider_options", 0, "webgpu")) == (
        "model.decoder.provider_options[0].webgpu"
    )


def test_engine_written_config_round_trips(tmp_path: Path):
    from engine.genai_config import make_genai_config
    from engine.options import ExportOptions
    from engine.package import write_json
    from engine.plan import plan
    from engine.presets import load_preset

    export_plan = plan(load_preset("gemma4-tiny"), ExportOptions(ep="webgpu"))
    path = tmp_path / "genai_config.json"
    write_json(path, make_genai_config(export_plan, capture={"decoder": False}, share_buffer=True))
    doc = GenaiDoc.load(path)
    assert doc.problems() == [] and doc.lint() == []
    assert doc.capture("decoder") is False
    doc.set_capture("decoder", True)
    doc.save()
    reread = GenaiDoc.load(path)
    assert reread.capture("decoder") is True
    reread.set_capture("decoder", False)
    assert reread.dumps() == json.dumps(json.loads(reread.dumps()), indent=4).encode() + b"\n"
