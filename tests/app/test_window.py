"""The main window: it opens, the preview follows the planner, errors show in one place."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import get_args

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.preview_data import ROLE_LABELS
from app.state import ModelSource
from app.widgets.controls import find_data
from app.windows.main_window import MainWindow
from app.wording import CONTROLS
from engine.logical import Role
from engine.options import ExportOptions
from engine.plan import plan
from engine.presets import load_preset, preset_config
from tests.app.conftest import make_settings, wait_for_preview


def _choose(combo, data) -> None:
    index = find_data(combo, data)
    assert index >= 0, f"{data!r} is not offered"
    combo.setCurrentIndex(index)


def test_window_opens_with_the_tiny_preview(window: MainWindow, screens):
    assert window.isVisible()
    assert window.windowTitle() == "Export Studio"
    assert [window.tabs.tabText(i) for i in range(window.tabs.count())] == [
        "Preview",
        "Export",
        "genai_config",
        "Benchmark",
        "Inspector",
    ]
    preview = window.state.preview
    expected = plan(load_preset("gemma4-tiny"), ExportOptions())
    assert preview.total_bytes == expected.nbytes
    assert window.preview.title.text().startswith("gemma4-tiny → CPU")
    assert "gemma4-tiny" in window.model_panel.summary.text()
    assert not window.banner.isVisible()
    screens(window, "01-preview-tiny-cpu")


@pytest.mark.parametrize(
    ("preset", "words", "absent"),
    [
        (
            "qwen3-1.7b",
            ["qwen3-1.7b (qwen3): 1.72 B parameters", "28 layers,", "KV heads 8,", "head dim 128,"],
            ["sliding", "window", "per-layer", "share", "None"],
        ),
        (
            "gemma4-e2b",
            ["35 layers (28 sliding, 7 full)", "head dim 256/512", "layers share", "window 512"],
            ["None"],
        ),
    ],
)
def test_the_model_summary_names_what_the_model_has(
    qtbot, window: MainWindow, preset: str, words: list[str], absent: list[str]
):
    window.model_panel.presets.setCurrentText(preset)
    wait_for_preview(qtbot, window, lambda p: p.title.startswith(preset))
    text = window.model_panel.summary.text()
    assert all(w in text for w in words), text
    assert not any(w in text for w in absent), text


def test_changing_options_updates_the_preview_from_the_planner(qtbot, window: MainWindow, screens):
    window.model_panel.presets.setCurrentText("gemma4-e4b")
    _choose(window.target_panel.ep, "webgpu")
    first = wait_for_preview(qtbot, window, lambda p: "gemma4-e4b → WebGPU" in p.title)
    expected = plan(load_preset("gemma4-e4b"), ExportOptions(ep="webgpu"))
    assert first.total_bytes == expected.nbytes

    _choose(window.target_panel.embedding_bits, 4)
    second = wait_for_preview(qtbot, window, lambda p: "embeddings int4" in p.title)
    expected = plan(load_preset("gemma4-e4b"), ExportOptions(ep="webgpu", embedding_bits=4))
    assert second.total_bytes == expected.nbytes < first.total_bytes
    # Every session's splits (E4B's embedding session holds the per-layer table).
    split = sorted(
        w.name for s in expected.sessions for w in s.weights if w.is_split and not w.shares
    )
    table = window.preview.splits
    assert sorted(table.item(r, 1).text() for r in range(table.rowCount())) == split
    split_sessions = {s.name for s in expected.sessions for w in s.weights if w.is_split}
    assert "embedding" in split_sessions  # E4B's per-layer table, in the embedding session
    assert {table.item(r, 0).text() for r in range(table.rowCount())} == split_sessions
    ple = next(
        r for r in range(table.rowCount()) if table.item(r, 1).text().startswith("embed_tokens_per")
    )
    # 42 layers' INT4 tables, four to a piece within the 128 MiB storage binding: 10 x 4 + 2
    assert table.item(ple, 4).text() == "11"
    assert window.preview.tensors.bars[0].pieces == 11
    assert window.preview.readiness.rowCount() == len(expected.sessions)
    assert second.compute_ms > 0  # measured in the worker; its budget is benchmarks/app_preview.py
    window.tabs.setCurrentIndex(0)
    screens(window, "02-preview-e4b-webgpu-int4-embeddings")


def test_a_burst_of_changes_is_throttled(qtbot, window: MainWindow):
    runs_before = window.previewer.runs
    for length in range(10, 310, 10):  # 30 changes in one go
        window.state.update_options(max_length=length)
    preview = wait_for_preview(qtbot, window, lambda p: p.context_length == 300)
    assert window.previewer.runs - runs_before <= 3
    assert preview.context_length == 300


def test_a_folder_that_is_not_a_model_is_reported_and_cannot_be_exported(
    qtbot, window: MainWindow, tmp_path, screens
):
    not_a_model = tmp_path / "photos"
    not_a_model.mkdir()
    window.model_panel.choose_folder(str(not_a_model))
    assert "no config.json" in window.state.source_problem  # known at once, before reading
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=10_000)
    assert "The model cannot be read" in window.banner.text
    assert "“Model folder”" in window.banner.text  # the engine's advice, in the app's words
    assert not window.export_panel.export_button.isEnabled()
    assert not window.export_shortcut.isEnabled()
    assert "no config.json" in window.export_panel.blocker.text()
    assert "no config.json" in window.export_shortcut.toolTip()
    window.tabs.setCurrentIndex(0)
    # no empty charts and tables with meaningless axes, no status about the last plan
    qtbot.waitUntil(lambda: window.state.preview is None, timeout=10_000)
    preview = window.preview
    assert not preview.charts.isVisible() and not preview.split_box.isVisible()
    assert "preview comes back by itself" in preview.facts.text()
    assert preview.facts.geometry().bottom() < preview.height() // 3  # at the top, together
    assert not window.statusBar().currentMessage().startswith("Preview planned")
    screens(window, "03-error-banner")
    window.model_panel.kind_buttons.button(0).click()  # back to a preset
    qtbot.waitUntil(lambda: not window.banner.isVisible(), timeout=10_000)
    qtbot.waitUntil(window.export_panel.export_button.isEnabled, timeout=10_000)
    qtbot.waitUntil(preview.charts.isVisible, timeout=10_000)
    assert preview.capture_box.isVisible()


def test_an_unknown_preset_selects_nothing_so_any_choice_loads(qtbot, window: MainWindow):
    """``export-studio --preset nope``: the list selects nothing (it showed its first
    entry, and choosing that entry changed nothing); choosing a preset loads it."""
    window.state.set_source(ModelSource("preset", "nope"))
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=10_000)
    presets = window.model_panel.presets
    assert presets.currentIndex() == -1 and presets.placeholderText() == "choose a preset"
    first = presets.itemText(0)
    presets.setCurrentIndex(0)
    assert window.state.source == ModelSource("preset", first)
    qtbot.waitUntil(lambda: not window.banner.isVisible(), timeout=20_000)


def test_capture_on_is_not_offered_where_the_ep_has_none(qtbot, window: MainWindow):
    panel = window.target_panel
    on = panel.capture.findData("on")
    assert window.state.options.ep == "cpu"
    item = panel.capture.model().item(on)
    assert not item.isEnabled()
    assert "CPU has no graph capture" in item.toolTip()
    _choose(panel.ep, "webgpu")
    assert panel.capture.model().item(on).isEnabled()
    _choose(panel.capture, "on")
    assert window.state.options.graph_capture == "on"
    _choose(panel.ep, "cpu")  # capture "on" cannot follow: set back to auto, and said so
    assert window.state.options.graph_capture == "auto"
    assert panel.capture.currentData() == "auto"
    assert "Graph capture on is not available" in panel.note.text()
    assert panel.note.isVisibleTo(panel)
    wait_for_preview(qtbot, window, lambda p: "CPU" in p.title)
    assert not window.banner.isVisible()


def test_an_explicit_dtype_follows_a_change_of_ep_that_runs_it(qtbot, window: MainWindow):
    """WebGPU with fp32 and INT4 embeddings, then DirectML: the dtype went back to "EP
    default (fp16)" unsaid, although DirectML runs fp32. It stays; an EP that does not run
    it sets it back to the default, and the note says so beside the embedding bits'."""
    panel = window.target_panel
    _choose(panel.ep, "webgpu")
    _choose(panel.dtype, "fp32")
    _choose(panel.embedding_bits, 4)
    _choose(panel.ep, "dml")
    assert window.state.options.dtype == "fp32"
    assert panel.dtype.currentData() == "fp32"
    assert "Embedding bits 4-bit is not available" in panel.note.text()
    assert "dtype" not in panel.note.text()
    preview = wait_for_preview(qtbot, window, lambda p: "DirectML" in p.title)
    assert preview.plan.options.dtype == "fp32"
    _choose(panel.ep, "trt-rtx")  # fp16 or bf16 only
    assert window.state.options.dtype is None
    assert panel.dtype.currentText() == "EP default (fp16)"
    note = panel.note.text()
    assert "Activation dtype fp32 is not available (TensorRT-RTX runs fp16 or bf16" in note
    assert "set to EP default (fp16)" in note
    _choose(panel.ep, "cuda")  # the default follows the EP
    assert window.state.options.dtype is None


def test_a_disabled_control_says_why_and_what_enables_it(qtbot, window: MainWindow):
    """With weights float, Block size and the other quantization controls were greyed with
    tooltips that only described them; the README promises disabled choices "with the
    reason". Enabled again, each has its own description back."""
    panel = window.target_panel
    assert window.state.options.weight_bits is None
    assert window.state.options.embedding_bits is None
    for control in (panel.block_size, panel.keep_float, panel.symmetric):
        assert not control.isEnabled()
        assert control.toolTip().startswith(
            "Used only when weights or embeddings are quantized: choose 4 or 8 bits in "
            "“Weight bits” or “Embedding bits” above."
        ), control.toolTip()
    # each says what makes it count: the table block size the tables, lm head the weights
    assert panel.embedding_block_size.toolTip().startswith("Used only when the embedding tables")
    for control in (panel.accuracy_level, panel.quantize_lm_head):
        assert control.toolTip().startswith("Used only when the weights are quantized")
    assert CONTROLS["block_size"].help in panel.block_size.toolTip()  # what it is, after
    assert panel.force.toolTip().startswith("Used only with a custom buffer limit")
    _choose(panel.weight_bits, 4)
    assert panel.block_size.isEnabled() and panel.quantize_lm_head.isEnabled()
    assert panel.block_size.toolTip() == CONTROLS["block_size"].help
    assert panel.quantize_lm_head.toolTip() == CONTROLS["quantize_lm_head"].help
    assert panel.embedding_block_size.toolTip().startswith("Used only when the embedding")
    _choose(panel.weight_bits, None)
    _choose(panel.embedding_bits, 4)  # tables only: what the command line refuses, greyed
    for control in (panel.accuracy_level, panel.quantize_lm_head):
        assert not control.isEnabled()  # before: accuracy level was offered, and refused
        assert control.toolTip().startswith("Used only when the weights are quantized")
    assert panel.block_size.isEnabled() and panel.embedding_block_size.isEnabled()
    assert panel.symmetric.isEnabled() and panel.quant_method.isEnabled()
    _choose(panel.limit_mode, "custom")
    assert panel.force.isEnabled() and panel.force.toolTip() == CONTROLS["force"].help
    assert panel.limit.toolTip().endswith("bytes")  # its value, exactly
    inspector = window.inspector
    assert not inspector.bench_button.isEnabled()
    assert inspector.bench_button.toolTip().startswith("Open a package folder first")


def test_block_sizes_that_do_not_fit_are_disabled_and_the_choice_adjusted(
    qtbot, window: MainWindow
):
    """Widths that are not whole blocks are padded, but the tiny model's tied head reads
    the 4-bit token table as MatMulNBits blocks, which must divide its 64 columns."""
    panel = window.target_panel
    _choose(panel.embedding_bits, 4)
    qtbot.waitUntil(
        lambda: window.state.constraints.reason("embedding_block_size", 128) is not None
    )
    for size, fits in ((16, True), (32, True), (64, True), (128, False), (256, False)):
        item = panel.embedding_block_size.model().item(panel.embedding_block_size.findData(size))
        assert item.isEnabled() == fits, size
        if not fits:
            assert "does not divide" in item.toolTip()
    window.state.update_options(embedding_block_size=128)  # e.g. options saved for another model
    assert window.state.options.embedding_block_size == 64
    assert "Embedding block size 128 does not fit this model" in panel.note.text()
    preview = wait_for_preview(qtbot, window, lambda p: "embeddings int4" in p.title)
    assert preview.plan.options.embedding_block_size == 64
    assert not window.banner.isVisible()


def test_a_bad_custom_buffer_limit_is_refused_inline(qtbot, window: MainWindow):
    panel = window.target_panel
    _choose(panel.limit_mode, "custom")  # starts from the EP's limit (or 1 GiB)
    assert window.state.options.max_buffer_size == 1024**3
    panel.limit.setText("lots")
    panel.limit.editingFinished.emit()
    assert "Not applied" in panel.limit.toolTip()
    assert "border" in panel.limit.styleSheet()
    assert window.state.options.max_buffer_size == 1024**3
    # Export waits for a limit it can read, and says why beside both Export buttons: the
    # options still hold 1 GiB, which is not what the field shows
    blocker = "the buffer limit is not applied: cannot read 'lots' as a size"
    assert not window.export_shortcut.isEnabled()
    assert blocker in window.export_reason.text()
    assert not window.export_panel.export_button.isEnabled()
    assert blocker in window.export_panel.blocker.text()
    # typing a good value clears it at once: a disabled Export takes no click, so the
    # focus change that applies the field would never come
    panel.limit.clear()
    qtbot.keyClicks(panel.limit, "64MiB")
    assert window.state.form_problem == "" and window.export_shortcut.isEnabled()
    panel.limit.editingFinished.emit()
    assert window.state.options.max_buffer_size == 64 * 1024**2
    # a new model rewrites the field from the options: the blocker goes with the bad text
    panel.limit.setText("lots")
    panel.limit.editingFinished.emit()
    assert window.state.form_problem
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    assert panel.limit.text() == "64.0MiB" and window.state.form_problem == ""


def test_a_limit_the_user_chose_can_be_forced_and_weights_kept_in_float(qtbot, window: MainWindow):
    """What the engine refuses under a custom limit, the user can write anyway (the
    export error's advice names this box); weight patterns can stay unquantized; the
    copied command line carries both."""
    panel = window.target_panel
    assert not panel.force.isEnabled()  # the EP's own limit is never forced
    _choose(panel.limit_mode, "custom")
    panel.limit.setText("64MiB")
    panel.limit.editingFinished.emit()
    assert window.state.options.max_buffer_size == 64 * 1024**2
    assert panel.force.isEnabled()
    panel.force.setChecked(True)
    assert window.state.options.force
    _choose(panel.weight_bits, 4)
    panel.keep_float.setText("layers.0.mlp.*, lm_head.weight")
    panel.keep_float.editingFinished.emit()
    assert window.state.options.keep_float == ("layers.0.mlp.*", "lm_head.weight")
    assert panel.keep_int8.isEnabled()  # mixed precision: some layers in 8 bits
    panel.keep_int8.setText("layers.1.*")
    panel.keep_int8.editingFinished.emit()
    assert window.state.options.keep_int8 == ("layers.1.*",)
    window.menu_actions["copy_cli"].trigger()
    line = QGuiApplication.clipboard().text()
    assert "--force" in line, line
    assert "--keep-float 'layers.0.mlp.*' --keep-float lm_head.weight" in line, line
    assert "--keep-int8 'layers.1.*'" in line, line
    _choose(panel.weight_bits, None)  # nothing quantized: the 8-bit patterns do not apply
    assert window.state.options.keep_int8 == () and not panel.keep_int8.isEnabled()
    _choose(panel.weight_bits, 4)  # ... and come back, as typed, with quantization
    assert window.state.options.keep_int8 == ("layers.1.*",) and panel.keep_int8.isEnabled()
    _choose(panel.limit_mode, "default")
    assert not window.state.options.force and not panel.force.isEnabled()


def test_settings_persist_between_sessions(qtbot, tmp_path: Path):
    settings = make_settings(tmp_path)
    first = MainWindow(settings)
    qtbot.addWidget(first)
    first.state.set_source(ModelSource("preset", "gemma4-e2b"))
    first.state.update_options(ep="webgpu", weight_bits=4, max_length=2048)
    first.state.set_output(str(tmp_path / "out"))
    first.state.set_overwrite(True)
    first.show()
    first.resize(1300, 820)
    qtbot.waitUntil(lambda: first.width() >= 1300)
    geometry = first.saveGeometry()
    first.close()

    second = MainWindow(make_settings(tmp_path))
    qtbot.addWidget(second)
    second.show()
    assert second.state.source == ModelSource("preset", "gemma4-e2b")
    assert second.state.options == ExportOptions(ep="webgpu", weight_bits=4, max_length=2048)
    assert second.state.output == str(tmp_path / "out")
    assert not second.state.overwrite  # never carried into another launch
    assert not second.target_panel.overwrite.isChecked()
    # The offscreen screen is 800x800 and clamps a restored size, so compare the bytes.
    assert second.settings.qsettings.value("window/geometry") == geometry
    assert second.target_panel.weight_bits.currentData() == 4
    second.close()


def test_hf_cache_scan_lists_supported_snapshots_only(
    qtbot, window: MainWindow, tmp_path, monkeypatch
):
    cache = tmp_path / "hub"
    gemma = cache / "models--google--gemma-4-e2b-it" / "snapshots" / "0123456789abcdef"
    llama = cache / "models--google--bert" / "snapshots" / "fedcba"
    for folder in (gemma, llama):
        folder.mkdir(parents=True)
    config = preset_config("gemma4-e2b")
    (gemma / "config.json").write_text(json.dumps(config))
    (llama / "config.json").write_text(json.dumps({"model_type": "bert"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))

    panel = window.model_panel
    with qtbot.waitSignal(panel.cacheScanned, timeout=10_000) as found:
        qtbot.mouseClick(panel.kind_buttons.button(2), Qt.MouseButton.LeftButton)
    assert found.args == [1]
    assert panel.cache.itemText(0).startswith("google/gemma-4-e2b-it @ 01234567")
    panel.cache.activated.emit(0)
    assert window.state.source.kind == "cache"
    preview = wait_for_preview(qtbot, window, lambda p: p.title.startswith("0123456789abcdef"))
    assert preview.total_bytes == plan(load_preset("gemma4-e2b"), ExportOptions()).nbytes


def test_the_output_folder_follows_the_model_and_options_until_edited(
    qtbot, window: MainWindow, tmp_path
):
    state, panel = window.state, window.target_panel
    assert Path(state.output).name == "gemma4-tiny-cpu-fp32"
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    _choose(panel.ep, "webgpu")
    _choose(panel.weight_bits, 4)
    _choose(panel.embedding_bits, 4)
    assert Path(state.output).name == "gemma4-e2b-webgpu-fp16-w4-emb4"
    assert panel.output.text() == state.output
    mine = str(tmp_path / "mine")
    panel.output.setText(mine)
    panel.output.textEdited.emit(mine)
    window.model_panel.presets.setCurrentText("gemma4-e4b")
    assert state.output == mine  # the user's choice stays
    panel.output.setText("")
    panel.output.textEdited.emit("")  # cleared: it follows again
    assert Path(state.output).name == "gemma4-e4b-webgpu-fp16-w4-emb4"


def test_every_session_of_a_multimodal_plan_is_previewed(qtbot, window: MainWindow, screens):
    """E2B has vision and audio towers: vision, speech, embedding and decoder sessions each
    get their bar, their split rows and their readiness row, bytes as the planner says."""
    window.model_panel.presets.setCurrentText("gemma4-e2b")
    _choose(window.target_panel.ep, "webgpu")
    data = wait_for_preview(qtbot, window, lambda p: "gemma4-e2b → WebGPU" in p.title)
    expected = plan(load_preset("gemma4-e2b"), ExportOptions(ep="webgpu"))
    names = [s.name for s in expected.sessions]
    assert names == ["vision", "speech", "embedding", "decoder"]
    assert [s.name for s in data.sessions] == names
    assert data.total_bytes == expected.nbytes
    assert sorted(r.session for r in data.readiness) == sorted(names)
    never = {r.session for r in data.readiness if r.status == "off"}
    assert never >= {"vision", "speech", "embedding"}  # per-input shapes: never captured
    window.tabs.setCurrentWidget(window.preview)
    chart = window.preview.sizes
    assert [c.split(" ")[0] for c in chart.categories] == list(reversed(names))
    table = window.preview.splits
    split = {s.name for s in expected.sessions for w in s.weights if w.is_split}
    assert split == {"embedding", "decoder"}
    assert {table.item(r, 0).text() for r in range(table.rowCount())} == split
    assert window.preview.readiness.rowCount() == 4
    labels = window.preview.tensors.categories
    assert all(label.split(":")[0] in names for label in labels)
    legend = {role for session in data.sessions for role in session.by_role}
    assert {"convolutions", "clip bounds", "position tables"} <= legend  # the towers' words
    assert legend <= set(ROLE_LABELS.values())
    screens(window, "09-preview-e2b-webgpu-multimodal")


def test_every_weight_role_has_words():
    assert set(get_args(Role)) == set(ROLE_LABELS)


def test_the_inputs_follow_the_towers_the_model_has(qtbot, window: MainWindow, screens):
    """Inputs (towers) the model has no tower for are offered disabled with the engine's
    reason; the chosen ones shape the plan, the output folder and the copied CLI line; a
    choice the next model cannot take moves back to everything it takes, said in place."""
    from engine.cli_line import parse_build_line

    panel, state = window.target_panel, window.state
    images, text = ("text", "vision"), ("text",)
    item = panel.modalities.model().item(find_data(panel.modalities, images))
    assert not item.isEnabled()  # the tiny preset is text only
    assert "no vision tower" in item.toolTip()

    window.model_panel.presets.setCurrentText("gemma4-e2b")
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("gemma4-e2b"))
    model = panel.modalities.model()
    assert all(model.item(i).isEnabled() for i in range(panel.modalities.count()))
    _choose(panel.modalities, text)
    only_text = wait_for_preview(qtbot, window, lambda p: len(p.sessions) == 1)
    assert [s.name for s in only_text.sessions] == ["decoder"]
    assert Path(state.output).name == "gemma4-e2b-cpu-fp32-text"
    line = panel.window().export_panel.copy_cli()
    assert "--modalities text " in line
    _, parsed = parse_build_line(shlex.split(line)[4:])
    assert parsed == state.export_options()

    _choose(panel.modalities, images)
    with_images = wait_for_preview(qtbot, window, lambda p: len(p.sessions) == 3)
    assert [s.name for s in with_images.sessions] == ["vision", "embedding", "decoder"]
    screens(panel, "10-target-e2b-inputs")

    window.model_panel.presets.setCurrentText("gemma4-tiny")
    qtbot.waitUntil(lambda: state.options.modalities is None, timeout=20_000)
    assert panel.modalities.currentData() is None
    assert "Inputs text, images is not available" in panel.note.text()
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("gemma4-tiny"))
    assert not window.banner.isVisible()


@pytest.mark.parametrize("method", ["gptq", "awq", "awq-gptq"])
def test_calibrated_quantizers_are_offered_for_checkpoints_only(
    qtbot, window: MainWindow, tmp_path: Path, method: str
):
    """A preset has no weights to calibrate on: GPTQ and AWQ are disabled with the reason
    there, offered for a checkpoint folder, and moved back to round to nearest (said) on a
    switch to a preset."""
    from tests._support.tiny_llama import make_checkpoint

    panel = window.target_panel
    _choose(panel.weight_bits, 4)
    item = panel.quant_method.model().item(find_data(panel.quant_method, method))
    assert not item.isEnabled() and "a preset has none" in item.toolTip()
    make_checkpoint(tmp_path / "qwen3", "qwen3")
    window.state.set_source(ModelSource("folder", str(tmp_path / "qwen3")))
    item = panel.quant_method.model().item(find_data(panel.quant_method, method))
    assert item.isEnabled()
    _choose(panel.quant_method, method)
    assert window.state.options.quant_method == method
    window.state.set_source(ModelSource("preset", "gemma4-tiny"))
    assert window.state.options.quant_method == "rtn"
    assert "a preset has none" in window.state.adjustment


@pytest.mark.parametrize("ep", ["trt-rtx", "dml"])
def test_an_ep_never_run_on_its_hardware_says_so_under_the_form(
    qtbot, window: MainWindow, screens, ep
):
    """TensorRT-RTX and DirectML packages build and pass the graph checks but never ran on
    their hardware here: the form says so while one is chosen, and its item's tooltip too."""
    panel = window.target_panel
    index = find_data(panel.ep, ep)
    assert "untested on real hardware" in panel.ep.itemData(index, Qt.ItemDataRole.ToolTipRole)
    _choose(panel.ep, ep)
    qtbot.waitUntil(lambda: "untested on real hardware" in panel.note.text())
    assert panel.note.isVisibleTo(window)
    screens(window, f"untested-ep-{ep}")
    _choose(panel.ep, "cuda")
    qtbot.waitUntil(lambda: "untested" not in panel.note.text())
