"""Error messages name options in markup that each face phrases its own way."""

from __future__ import annotations

import pytest

from engine.errors import OptionsError, option, option_keys, render_message
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset


def test_cli_face_names_flags() -> None:
    error = OptionsError(f"use {option('graph_capture', 'off')} or {option('overwrite')}")
    assert str(error) == "use --graph-capture off or --overwrite"
    assert option_keys(error.raw) == {"graph_capture", "overwrite"}


def test_another_face_phrases_the_same_error_its_own_way() -> None:
    error = OptionsError(f"use {option('graph_capture', 'off')}")
    words = {"graph_capture": "Graph capture"}
    assert error.render(lambda key, value: f"{words[key]}: {value}") == "use Graph capture: off"


def test_engine_errors_reach_the_user_without_markup() -> None:
    with pytest.raises(OptionsError) as info:
        ExportOptions(ep="cpu", graph_capture="on").resolve()
    assert "{opt:" not in str(info.value)
    assert "--graph-capture off" in str(info.value)


def test_plan_warnings_render_without_markup() -> None:
    p = plan(load_preset("gemma4-e2b"), ExportOptions(ep="webgpu", max_buffer_size=1024**3))
    raw = [w for w in p.warnings if "{opt:" in w]
    assert raw, "the binding-size warning names the buffer-limit option"
    assert all("{opt:" not in render_message(w) for w in p.warnings)
    assert all("{opt:" not in w for w in p.to_json()["warnings"])
