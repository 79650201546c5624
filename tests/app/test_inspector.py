"""The package inspector, drag and drop of folders, and Help ▸ About."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.state import ModelSource
from app.widgets.inspector_panel import InspectorPanel
from app.windows.about import AboutDialog, versions
from app.windows.main_window import MainWindow
from engine.presets import preset_config
from tests.app.conftest import export_split_webgpu_tiny, wait_for_preview

FOREIGN = Path(__file__).resolve().parents[1] / "engine" / "data" / "genai-builder-llama-int4"


def _inspect(qtbot, panel: InspectorPanel, folder: Path) -> object:
    with qtbot.waitSignal(panel.inspected, timeout=30_000) as shown:
        panel.open(str(folder))
    return shown.args[0]


def test_another_exporters_package_is_inspected_audited_and_edited(
    qtbot, window: MainWindow, screens
):
    window.tabs.setCurrentWidget(window.inspector)
    panel = window.inspector
    info = _inspect(qtbot, panel, FOREIGN)
    proto = onnx.load(str(FOREIGN / "model.onnx"), load_external_data=False)
    assert panel.initializers.rowCount() == len(proto.graph.initializer)
    assert "onnxruntime-genai" in panel.summary.text()
    assert panel.sessions.item(0, 0).text() == "decoder"
    assert panel.splits.item(0, 1).text() == "nothing is split"
    names = {panel.initializers.item(r, 1).text() for r in range(panel.initializers.rowCount())}
    assert names == {t.name for t in proto.graph.initializer}
    panel.filter.setText("scales")
    shown = [
        panel.initializers.item(r, 1).text()
        for r in range(panel.initializers.rowCount())
        if not panel.initializers.isRowHidden(r)
    ]
    assert shown and all("scales" in name for name in shown)
    panel.filter.clear()
    assert panel.sizes.summary.startswith("decoder (model.onnx)")
    assert panel.sizes.categories == ["decoder 34.4 KiB"]
    assert panel.tensors.bars[0].unsplit == max(t.nbytes for t in info.sessions[0].initializers)
    with qtbot.waitSignal(panel.audited, timeout=60_000) as audited:
        panel.audit_button.click()
    assert audited.args[0][0].session == "decoder"
    assert panel.audit.count() >= 1 and "decoder on cpu" in panel.audit.item(0).text()
    screens(window, "08-inspector-foreign")
    panel.config_button.click()
    assert window.tabs.currentWidget() is window.config_editor
    assert window.config_editor.doc.path == FOREIGN / "genai_config.json"
    window.tabs.setCurrentWidget(panel)
    with qtbot.waitSignal(window.bencher.factsChanged, timeout=30_000) as changed:
        panel.bench_button.click()
    while changed.args[0] is None:  # the first emission clears the previous facts
        with qtbot.waitSignal(window.bencher.factsChanged, timeout=30_000) as changed:
            pass
    assert window.tabs.currentWidget() is window.bench_panel
    bench = window.bench_panel
    assert bench.package.text() == str(FOREIGN)
    # The builder's package runs in our runner too (its KV head dim is symbolic: the runner
    # reads it from genai_config.json), not only through onnxruntime-genai.
    bench.prompt_len.setValue(8)
    bench.new_tokens.setValue(4)
    assert bench.runtime.currentData() == "ort"
    with qtbot.waitSignal(bench.finished, timeout=120_000) as done:
        qtbot.mouseClick(bench.run_button, Qt.MouseButton.LeftButton)
    (result,) = done.args[0].results
    assert result.decode_tokens_per_second > 0 and result.provider == "CPUExecutionProvider"


def test_our_split_package_shows_its_splits_against_its_limit(qtbot, window: MainWindow, tmp_path):
    result = export_split_webgpu_tiny(tmp_path / "pkg")
    info = _inspect(qtbot, window.inspector, result.output)
    split = [w for w in result.plan.decoder.weights if w.is_split and not w.shares]
    panel = window.inspector
    assert panel.splits.rowCount() == len(split)
    rows = {
        panel.splits.item(r, 1).text(): panel.splits.item(r, 2).text() for r in range(len(split))
    }
    assert rows == {w.name: str(len(w.pieces)) for w in split}
    assert "16.0 KiB" in panel.summary.text() and "exported with" in panel.summary.text()
    bars = {b.name: b for b in panel.tensors.bars}
    for w in split:
        if w.name in bars:
            assert bars[w.name].pieces == len(w.pieces)
    assert info.ep == "webgpu"


def test_a_folder_that_is_not_a_package_is_reported(qtbot, window: MainWindow, tmp_path):
    with qtbot.waitSignal(window.state.errorChanged, timeout=30_000):
        window.inspector.open(str(tmp_path))
    assert "holds no .onnx file" in window.banner.text
    assert "Inspector" in window.banner.text


def _drop(window: MainWindow, folder: Path) -> bool:
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(folder))])
    enter = QDragEnterEvent(
        QPoint(20, 20),
        Qt.DropAction.CopyAction,
        data,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    if not enter.isAccepted():
        return False
    drop = QDropEvent(
        QPointF(20, 20),
        Qt.DropAction.CopyAction,
        data,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, drop)
    return drop.isAccepted()


def test_dropping_a_model_folder_chooses_it_and_a_package_folder_inspects_it(
    qtbot, window: MainWindow, tmp_path
):
    model = tmp_path / "my-gemma"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(preset_config("gemma4-e2b")))
    assert _drop(window, model)
    assert window.state.source == ModelSource("folder", str(model))
    assert window.model_panel.folder.text() == str(model)
    wait_for_preview(qtbot, window, lambda p: p.title.startswith("my-gemma"))
    with qtbot.waitSignal(window.inspector.inspected, timeout=30_000):
        assert _drop(window, FOREIGN)
    assert window.tabs.currentWidget() is window.inspector
    plain_file = tmp_path / "notes.txt"
    plain_file.write_text("x")
    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(plain_file)), QUrl.fromLocalFile(str(model))])
    enter = QDragEnterEvent(
        QPoint(5, 5),
        Qt.DropAction.CopyAction,
        data,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    assert not enter.isAccepted()  # two things at once: refused, nothing changes


def test_about_lists_the_versions_of_onnxruntime_genai_and_qt(qtbot, window: MainWindow):
    import onnxruntime
    import onnxruntime_genai
    from PySide6.QtCore import qVersion

    rows = dict(versions())
    assert rows["onnxruntime"] == onnxruntime.__version__
    assert rows["onnxruntime-genai"] == onnxruntime_genai.__version__
    assert rows["Qt"] == qVersion()
    assert "software adapter" in rows["WebGPU"]  # the plugin on lavapipe: no GPU here
    dialog = AboutDialog(window)
    qtbot.addWidget(dialog)
    assert onnxruntime.__version__ in dialog.details.text()
    assert window.menu_actions["about"].shortcut().toString() == "F1"


def test_inspector_audit_says_which_sessions_are_never_captured(
    qtbot, window: MainWindow, tmp_path: Path
):
    """A multimodal package's embedding, vision and speech sessions are never captured by
    design: the audit says so instead of "NOT ready", as the engine's audit does."""
    from engine.options import ExportOptions
    from engine.pipeline import export
    from tests._support.tiny_gemma_mm import make_mm_checkpoint

    make_mm_checkpoint(tmp_path / "ckpt", audio=True)
    export(tmp_path / "mm", model_dir=tmp_path / "ckpt", options=ExportOptions(ep="webgpu"))
    panel = window.inspector
    _inspect(qtbot, panel, tmp_path / "mm")
    with qtbot.waitSignal(panel.audited, timeout=60_000):
        panel.audit_button.click()
    heads = [panel.audit.item(i).text() for i in range(panel.audit.count())]
    heads = [line for line in heads if not line.startswith(" ")]
    assert heads[0].startswith("decoder on webgpu: graph capture ready")
    for session in ("embedding", "vision", "speech"):
        (line,) = [h for h in heads if h.startswith(f"{session} on webgpu:")]
        assert line.startswith(f"{session} on webgpu: never captured: its input shapes"), line
