"""Every option the engine names in a message has the app's own words, and messages use them."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from app.wording import CONTROLS, error_text, phrase, render
from engine.errors import OptionsError, PackageError, option
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset

ENGINE = Path(__file__).resolve().parents[2] / "engine"
CALL = re.compile(r"(?<![\w.])option\(")
LITERAL = re.compile(
    r"""option\(\s*(['"])([a-z_][a-z0-9_]*)\1\s*(?:,\s*(?:(['"])([^'"]*)\3|[^()]*(?:\([^()]*\)[^()]*)*)\s*)?\)"""
)
"""A literal key, and a literal value (checked against the control's choices) or any
expression (a number the engine formats, checked for its key only)."""


def engine_option_references() -> list[tuple[str, str, str | None]]:
    """(file:line, key, value) of every ``option(...)`` call under engine/."""
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for call in CALL.finditer(text):
            line = text.count("\n", 0, call.start()) + 1
            where = f"{path.relative_to(ENGINE.parent)}:{line}"
            if text[call.start() - 4 : call.start()] == "def ":
                continue  # the definition itself
            literal = LITERAL.match(text, call.start())
            assert literal, f"{where}: option() with a non-literal key; the app cannot check it"
            found.append((where, literal.group(2), literal.group(4)))
    return found


def test_every_option_the_engine_names_has_app_wording():
    references = engine_option_references()
    assert len(references) >= 15  # the grep really finds the engine's calls
    missing = [f"{where}: {key}" for where, key, _ in references if key not in CONTROLS]
    assert not missing, "no app wording for: " + ", ".join(missing)
    for where, key, value in references:
        control = CONTROLS[key]
        if value is not None and control.choices:
            assert control.choice_text(value) is not None, f"{where}: {key}={value} not offered"


def test_every_export_option_field_has_app_wording():
    assert {f.name for f in fields(ExportOptions)} <= set(CONTROLS)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("graph_capture", "off", "“Graph capture: off”"),
        ("overwrite", None, "“Replace an existing folder”"),
        ("attention", "standard", "“Attention: standard ONNX”"),
        ("runtime", "genai", "“Runtime: onnxruntime-genai”"),
        ("max_buffer_size", None, "“Buffer limit”"),
        ("not_a_key_yet", "x", "“not a key yet: x”"),
    ],
)
def test_options_are_phrased_with_control_labels(key, value, expected):
    assert phrase(key, value) == expected


def test_engine_errors_read_in_the_apps_words(tmp_path):
    from engine.package import check_destination

    with pytest.raises(PackageError) as caught:
        check_destination(tmp_path, overwrite=False)
    shown = error_text(caught.value)
    assert "“Replace an existing folder”" in shown
    assert "--" not in shown
    assert "--overwrite" in str(caught.value)  # the CLI keeps its own wording

    with pytest.raises(OptionsError) as caught:
        ExportOptions(ep="cpu", graph_capture="on").resolve()
    assert "“Graph capture: off”" in error_text(caught.value)
    assert error_text(ValueError("boom")) == "unexpected ValueError: boom"


def test_plan_warnings_use_binary_units_not_raw_bytes():
    warnings = plan(load_preset("gemma4-e2b"), ExportOptions(ep="webgpu")).warnings
    shown = [render(w) for w in warnings]
    assert shown and not any(re.search(r"\d,\d{3},\d{3} B", w) for w in shown), shown
    assert any("256.0 MiB" in w for w in shown), shown
    assert not any("max_storage_binding_size" in w for w in shown), shown
    # the engine says it in words too (the CLI prints it as is), with what to do
    (split,) = [w for w in warnings if w.startswith("embed_tokens.weight: split")]
    assert "3 pieces of up to 256.0 MiB" in split and "storage binding size (128.0 MiB)" in split
    assert "need a lower {opt:max_buffer_size}" in split  # --max-buffer-size on the CLI
    assert render("max_storage_binding_size") == "the storage binding limit"
    assert render(f"use {option('graph_capture', 'off')}") == "use “Graph capture: off”"
