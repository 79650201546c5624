"""The Benchmark tab: only what the package's EP supports, every metric charted, partial
results kept, a cancel reported as a cancel, a history of the engine's own records."""

from __future__ import annotations

import json
from pathlib import Path

import pyqtgraph as pg
import pytest
from PySide6.QtCore import Qt

from app.bench_controller import BenchController
from app.history import HISTORY_FILE, BenchHistory
from app.package_jobs import BenchOutcome, BenchRequest, bench_job
from app.state import StudioState
from app.widgets.bench_panel import BenchPanel
from app.windows.main_window import MainWindow
from engine.errors import CancelledError, EngineError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.progress import CancelToken


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench-packages")
    return {
        ep: export(
            root / ep, preset="gemma4-tiny", options=ExportOptions(ep=ep, random_weights=True)
        ).output
        for ep in ("cpu", "webgpu", "dml")
    }


def _open(qtbot, window: MainWindow, package: Path) -> BenchPanel:
    panel = window.bench_panel
    window.tabs.setCurrentWidget(panel)
    with qtbot.waitSignal(window.bencher.factsChanged, timeout=30_000) as changed:
        panel.set_package(str(package))
    while changed.args[0] is None:  # the first emission clears the previous facts
        with qtbot.waitSignal(window.bencher.factsChanged, timeout=30_000) as changed:
            pass
    panel.prompt_len.setValue(8)
    panel.new_tokens.setValue(4)
    return panel


def _enabled(combo, data) -> bool:
    return combo.model().item(combo.findData(data)).isEnabled()


def test_a_cpu_package_is_offered_no_capture_and_its_run_charts_every_metric(
    qtbot, window: MainWindow, packages, screens
):
    panel = _open(qtbot, window, packages["cpu"])
    assert not _enabled(panel.capture, "on") and not _enabled(panel.capture, "both")
    item = panel.capture.model().item(panel.capture.findData("both"))
    assert "CPU has no graph capture" in item.toolTip()
    assert panel.capture.currentData() == "off"
    # on WebGPU too: its graph was not built for capture there (captured, its tokens differ)
    panel.ep.setCurrentIndex(panel.ep.findData("webgpu"))
    assert not _enabled(panel.capture, "both")
    assert "built for CPU" in item.toolTip() and "--ep" not in item.toolTip()
    panel.ep.setCurrentIndex(panel.ep.findData("cpu"))
    with qtbot.waitSignal(panel.finished, timeout=120_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    outcome = done.args[0]
    (result,) = outcome.results
    assert not result.graph_capture and result.decode_tokens_per_second > 0
    assert result.time_to_first_token_seconds > 0 and result.peak_rss_bytes > 0
    assert panel.table.rowCount() == 1
    assert panel.table.item(0, 7).text() == f"{result.decode_tokens_per_second:,.1f}"
    assert "new tokens, after 1 warm-up run\n" in panel.table.item(0, 0).toolTip()
    chart = panel.latest_chart
    assert chart.title.text().endswith(": capture off")  # no "vs on" over empty bars
    for key, plot in chart.plots.items():  # decode, prefill, TTFT, load, peak RSS
        bars = [i for i in plot.items if isinstance(i, pg.BarGraphItem)]
        assert len(bars) == 1, key
    assert any(isinstance(i, pg.ErrorBarItem) for i in chart.plots["decode"].items)
    assert "decode spread over 3 runs: off " in chart.legend.text()
    assert "over 3 runs (spread" in chart.toolTip()  # the long form
    panel.history_metric.setCurrentIndex(panel.history_metric.findData("rss"))
    assert "peak rss" in panel.history_chart.title.text().lower()
    saved = json.loads((window.settings.data_dir() / HISTORY_FILE).read_text())
    assert saved[0]["result"]["decode_tokens_per_second"] == result.decode_tokens_per_second
    screens(window, "07-benchmark")

    reopened = BenchController(StudioState(), BenchHistory(window.settings.data_dir()))
    assert [r.result for r in reopened.history.runs] == [result]  # the engine's record, whole


def test_a_second_run_of_the_package_is_what_the_latest_chart_shows(
    qtbot, window: MainWindow, packages
):
    """The history redrew (on historyChanged) while the previous outcome was still the
    latest, and nothing redrew after: a second run's chart showed the first's numbers."""
    panel = _open(qtbot, window, packages["cpu"])
    panel.prompt_len.setValue(8)
    panel.new_tokens.setValue(4)
    for repeats in (3, 2):
        panel.repeats.setValue(repeats)
        qtbot.waitUntil(panel.run_button.isEnabled)
        with qtbot.waitSignal(panel.finished, timeout=120_000) as done:
            qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        (r,) = done.args[0].results
        spread = f"{r.decode_tokens_per_second_min:,.1f}-{r.decode_tokens_per_second_max:,.1f}"
        said = panel.latest_chart.legend.text()
        assert f"decode spread over {repeats} runs: off {spread} " in said, said


def test_the_capture_off_results_are_kept_when_the_capture_run_fails(packages):
    request = BenchRequest(packages["cpu"], prompt_len=8, new_tokens=4, repeats=1, capture="both")
    outcome = bench_job(request, lambda f, m: None, CancelToken())
    assert [r.graph_capture for r in outcome.results] == [False]
    assert outcome.problem is not None and "capture run failed" in outcome.problem
    assert "“Graph capture: off”" in outcome.problem  # the engine's advice in the app's words
    assert not outcome.cancelled


def test_a_partial_outcome_reaches_the_history_and_no_error_banner(
    qtbot, window: MainWindow, packages
):
    panel = _open(qtbot, window, packages["cpu"])
    request = BenchRequest(packages["cpu"], prompt_len=8, new_tokens=4, repeats=1, capture="both")
    with qtbot.waitSignal(panel.finished, timeout=120_000):
        window.bencher.run(request)
    assert panel.table.rowCount() == 1
    assert "capture-off results are kept" in panel.note.text()
    assert not window.banner.isVisible()


def test_a_cancel_is_reported_as_a_cancel_not_a_failure(qtbot, window: MainWindow, packages):
    """Cancel says at once that the run stops (its process is ended: a generation on the
    software adapter took 46 s, with the note still reading "Running…"), and can't be
    pressed twice; the cancelled run leaves the progress bar empty."""
    panel = _open(qtbot, window, packages["cpu"])
    panel.repeats.setValue(20)
    panel.new_tokens.setValue(200)
    said: list[tuple[str, bool]] = []

    def press_cancel(fraction: float, message: str) -> None:
        if "run" in message and panel.cancel_button.isEnabled():
            qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
            said.append((panel.note.text(), panel.cancel_button.isEnabled()))

    window.bencher.progress.connect(press_cancel)
    with qtbot.waitSignal(window.bencher.cancelled, timeout=120_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.bencher.worker is None, timeout=30_000)
    window.bencher.progress.disconnect(press_cancel)
    assert said == [("Cancelling: the run under way stops at once; finished runs are kept.", False)]
    assert "Cancelled" in panel.note.text()
    assert panel.progress.value() == 0
    assert not window.banner.isVisible()
    assert panel.table.rowCount() == 0
    assert panel.run_button.isEnabled()


def test_a_cancel_during_the_capture_on_run_leaves_no_stale_progress(qtbot, tmp_path: Path):
    """Cancelled during the capture-on run of "off and on, side by side", the bar read
    "100%  run 2/3" (its value set to the end, its text the last report's) and the note
    "Done"; it shows the half that finished, and the note says it was cancelled."""
    from tests.app.conftest import bench_result

    state = StudioState()
    panel = BenchPanel(state, BenchController(state, BenchHistory(tmp_path)))
    qtbot.addWidget(panel)
    request = BenchRequest(tmp_path, capture="both")
    panel.controller.progress.emit(0.8, "run 2/3")
    panel.controller.completed.emit(
        BenchOutcome(request, (bench_result(),), None, "cancelled", cancelled=True)
    )
    assert "run 2/3" not in panel.progress.format()
    assert panel.progress.text() == "50%  stopped"
    assert panel.note.text().startswith("Cancelled during the capture-on run"), panel.note.text()
    assert "Done" not in panel.note.text() and "Not run" not in panel.note.text()
    panel.controller.progress.emit(0.8, "run 2/3")
    both = (bench_result(), bench_result(graph_capture=True))
    panel.controller.completed.emit(BenchOutcome(request, both))
    assert panel.progress.text() == "100%"
    assert panel.note.text().startswith("Done: 2 runs recorded.")


def test_eps_this_onnxruntime_lacks_are_disabled_and_the_advice_names_the_selector(
    qtbot, window: MainWindow, packages
):
    panel = _open(qtbot, window, packages["dml"])
    assert not _enabled(panel.ep, "dml")
    reason = panel.ep.model().item(panel.ep.findData("dml")).toolTip()
    assert "DmlExecutionProvider" in reason and "onnxruntime-directml" in reason
    assert not _enabled(panel.ep, None)  # "DirectML (as built)" here
    assert panel.ep.currentData() == "cpu"  # moved onto one that runs
    assert "DirectML" in panel.ep.itemText(0)
    request = BenchRequest(packages["dml"], prompt_len=8, new_tokens=4, repeats=1)
    with qtbot.waitSignal(window.bencher.failed, timeout=60_000):
        window.bencher.run(request)  # forced onto the package's EP
    assert "Benchmark failed" in window.banner.text
    assert "“Execution provider”" in window.banner.text and "--ep" not in window.banner.text


def test_a_long_benchmark_on_the_software_adapter_is_announced_when_it_starts(
    qtbot, window: MainWindow, packages, monkeypatch
):
    """On lavapipe a full-size package takes an hour with the tab's defaults: Run says so,
    with the tab's own settings for a quick look."""
    from engine.runtime import bench as bench_module

    panel = _open(qtbot, window, packages["webgpu"])
    panel.ep.setCurrentIndex(panel.ep.findData("webgpu"))
    panel.capture.setCurrentIndex(panel.capture.findData("off"))
    panel.prompt_len.setValue(64)  # well over a quick look's tokens
    panel.new_tokens.setValue(16)
    # as slow per byte as lavapipe is on a decoder ten thousand times this one's size
    monkeypatch.setattr(bench_module, "SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND", 5e4)
    with qtbot.waitSignal(panel.finished, timeout=120_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        said, level = panel.note.text(), panel.note.level
    assert said.startswith("Running… webgpu runs through the WebGpuExecutionProvider plugin")
    assert "software adapter (lavapipe, no GPU) here" in said and "roughly" in said
    # capture is off already; the tab's warm-up run is one more generation
    assert said.endswith("“Prompt tokens: 16” “New tokens: 8” “Repeats: 1” “Warm-up runs: 0”.")
    assert "--" not in said and level == "warning"  # advice: in the warning's colour
    assert "Done: 1 run recorded." in panel.note.text()
    panel.warmup.setValue(0)  # the control reaches the request: no longer suggested, and run
    qtbot.waitUntil(panel.run_button.isEnabled)
    with qtbot.waitSignal(panel.finished, timeout=120_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        said = panel.note.text()
    assert said.endswith("“Prompt tokens: 16” “New tokens: 8” “Repeats: 1”."), said
    assert [r.warmup for r in done.args[0].results] == [0]
    # Settings already a quick look: how long it takes, as news, not as a warning.
    monkeypatch.setattr(bench_module, "SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND", 1e4)
    panel.prompt_len.setValue(16)
    panel.new_tokens.setValue(8)
    panel.repeats.setValue(1)
    qtbot.waitUntil(panel.run_button.isEnabled)
    with qtbot.waitSignal(panel.finished, timeout=120_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        said, level = panel.note.text(), panel.note.level
    assert "roughly" in said and "quick look" not in said and level == "off", (said, level)
    monkeypatch.undo()
    qtbot.waitUntil(panel.run_button.isEnabled)  # the worker has let go
    with qtbot.waitSignal(panel.finished, timeout=120_000):  # seconds: nothing to announce
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        assert panel.note.text() == "Running…"


def test_a_webgpu_package_runs_capture_off_and_on_from_the_main_install(
    qtbot, window: MainWindow, packages, screens
):
    """The WebGPU plugin EP (the dev and studio extras install it) runs beside onnxruntime
    and genai: the Benchmark tab offers WebGPU with capture, runs off and on side by side,
    and says the adapter is a software one here (lavapipe)."""
    panel = _open(qtbot, window, packages["webgpu"])
    assert _enabled(panel.ep, "webgpu") and _enabled(panel.capture, "both")
    panel.ep.setCurrentIndex(panel.ep.findData("webgpu"))
    panel.capture.setCurrentIndex(panel.capture.findData("both"))
    with qtbot.waitSignal(panel.finished, timeout=300_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    outcome = done.args[0]
    assert outcome.problem is None, outcome.problem
    assert [r.graph_capture for r in outcome.results] == [False, True]
    assert panel.latest_chart.title.text().endswith(": capture off vs on")
    assert {r.provider for r in outcome.results} == {"WebGpuExecutionProvider"}
    assert all(any("software adapter" in n for n in r.notes) for r in outcome.results)
    assert all("software adapter" in (r.adapter or "") for r in outcome.results)
    assert panel.table.rowCount() == 2
    assert "Ran on the WebGpuExecutionProvider plugin" in panel.note.text()
    assert "software adapter" in panel.note.text()
    screens(window, "07b-benchmark-webgpu-capture")
    # at 1280x800 the runs-over-time chart keeps its plot whole, its legend below it
    window.resize(1280, 800)
    panel.history_tabs.setCurrentIndex(1)
    qtbot.wait(100)
    chart = panel.history_chart
    assert chart.plot.height() >= 100, chart.plot.height()
    assert chart.legend.geometry().top() >= chart.plot.geometry().bottom()
    legend_bottom = chart.legend.mapTo(window, chart.legend.rect().bottomLeft()).y()
    assert legend_bottom <= window.centralWidget().geometry().bottom(), legend_bottom
    assert panel.latest_chart.plots["decode"].height() >= 100
    metric = panel.history_metric
    assert metric.isVisible() and metric.geometry().bottom() < panel.history_tabs.height()
    assert metric.width() >= metric.sizeHint().width()  # its text whole
    screens(window, "07c-benchmark-runs-over-time-1280x800")


@pytest.mark.slow
def test_a_genai_benchmark_leaves_the_window_free(qtbot, window: MainWindow, tmp_path: Path):
    """onnxruntime-genai computes holding Python's GIL (a whole token, 6 s through WebGPU on
    lavapipe, or a whole prompt): run on a thread, its benchmark froze the window and its
    Cancel. The tab runs genai in a process of its own: the window's timer keeps firing
    while the run goes on (from its first progress report to its last; the click before
    and the charts after are the window's own work)."""
    import itertools
    import time

    from PySide6.QtCore import QTimer

    package = export(
        tmp_path / "qwen", preset="qwen2.5-0.5b",
        options=ExportOptions(ep="cpu", weight_bits=4, random_weights=True, max_length=512),
    ).output  # fmt: skip
    panel = _open(qtbot, window, package)
    panel.runtime.setCurrentIndex(panel.runtime.findData("genai"))
    panel.prompt_len.setValue(384)  # seconds of prefill on two cores, in one genai call
    panel.new_tokens.setValue(2)
    panel.repeats.setValue(1)
    panel.warmup.setValue(0)
    ticks: list[float] = []
    reports: list[float] = []
    window.bencher.progress.connect(lambda fraction, message: reports.append(time.perf_counter()))
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start(10)
    with qtbot.waitSignal(panel.finished, timeout=300_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    timer.stop()
    (result,) = done.args[0].results
    assert result.runtime == "genai"
    if result.time_to_first_token_seconds < 1.5:  # a machine this fast shows nothing here
        pytest.skip(f"the prompt took {result.time_to_first_token_seconds:.2f} s, under 1.5 s")
    first, last = reports[0], reports[-1]
    seen = [first, *(t for t in ticks if first < t < last), last]
    longest = max(b - a for a, b in itertools.pairwise(seen))
    assert last - first > 1.5 and longest < 0.75, (
        f"the window stopped for {longest:.2f} s in a run of {last - first:.1f} s"
    )


def test_the_bench_job_is_a_plain_function(packages):
    seen: list[tuple[float, str]] = []
    request = BenchRequest(packages["cpu"], prompt_len=4, new_tokens=2, repeats=1)
    outcome = bench_job(request, lambda f, m: seen.append((f, m)), CancelToken())
    assert len(outcome.results) == 1 and seen[-1][0] == 1.0
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(CancelledError):
        bench_job(request, lambda f, m: None, cancel)


@pytest.fixture(scope="module")
def mm_packages(tmp_path_factory) -> dict[str, Path]:
    """A tiny multimodal checkpoint exported whole and without its audio tower, and an image
    and a clip to send (no downloads)."""
    from tests._support.media import write_png, write_wav
    from tests._support.tiny_gemma_mm import make_mm_checkpoint

    root = tmp_path_factory.mktemp("mm-bench")
    make_mm_checkpoint(root / "ckpt")
    return {
        "all": export(root / "all", model_dir=root / "ckpt").output,
        "vision": export(
            root / "vision",
            model_dir=root / "ckpt",
            options=ExportOptions(modalities=("text", "vision")),
        ).output,
        "image": write_png(root / "picture.png", 120, 64),
        "audio": write_wav(root / "clip.wav", 1.2),
    }


def test_an_image_and_audio_prompt_runs_through_genai_with_the_encoders(
    qtbot, window: MainWindow, mm_packages, screens
):
    panel = _open(qtbot, window, mm_packages["all"])
    media = panel.media
    assert media.paths["image"].isEnabled() and media.paths["audio"].isEnabled()
    assert not _enabled(panel.runtime, "ort")  # our loop runs text packages only
    assert "multimodal" in panel.runtime.model().item(panel.runtime.findData("ort")).toolTip()
    assert panel.runtime.currentData() == "genai"
    media.paths["image"].setText(str(mm_packages["image"]))
    media.paths["audio"].setText(str(mm_packages["audio"]))
    media.prompt.setText("look and listen")
    assert not panel.prompt_len.isEnabled()  # the processor makes the prompt
    panel.repeats.setValue(2)
    with qtbot.waitSignal(panel.finished, timeout=180_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    outcome = done.args[0]
    assert outcome.request.images == (mm_packages["image"],)
    (result,) = outcome.results
    assert result.runtime == "genai" and result.media == ("image", "audio")
    assert result.prompt_length > 8  # the image's and the clip's tokens are in it
    assert result.time_to_first_token_seconds > 0 and result.decode_tokens_per_second > 0
    assert "Prompt with 1 image and 1 audio clip" in panel.note.text()
    tokens = f"{result.prompt_length} + 1 image and 1 audio clip → {result.new_tokens}"
    assert panel.table.item(0, 3).text() == tokens
    assert not window.banner.isVisible()
    screens(window, "11-benchmark-image-audio")
    reopened = BenchHistory(window.settings.data_dir())
    assert reopened.runs[-1].result == result  # media and all, read back


def test_several_images_go_into_one_prompt(
    qtbot, window: MainWindow, mm_packages, monkeypatch, tmp_path
):
    """The picker selects several files; the field lists them separated by ';' and the
    prompt carries them in that order (the CPU package takes any number of images)."""
    from PySide6.QtWidgets import QFileDialog

    from tests._support.media import write_png

    second = write_png(tmp_path / "second; picture.png", 48, 80)
    third = write_png(tmp_path / "third picture.png", 40, 40)
    picked = [str(mm_packages["image"]), str(second)]
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (picked, ""))
    panel = _open(qtbot, window, mm_packages["all"])
    media = panel.media
    qtbot.mouseClick(media.browse["image"], Qt.MouseButton.LeftButton)
    assert media.paths["image"].text() == "; ".join(picked)
    assert media.images == (mm_packages["image"], second)  # ';' and a space survive a pick
    media.paths["image"].setText(f" {picked[0]} ;; {third}; ")  # typed by hand: split at ';'
    assert media.images == (mm_packages["image"], third)
    media.paths["image"].setText(str(second))  # one existing file, typed alone
    assert media.images == (second,)
    qtbot.mouseClick(media.browse["image"], Qt.MouseButton.LeftButton)
    assert media.images == (mm_packages["image"], second)
    panel.repeats.setValue(1)
    panel.new_tokens.setValue(2)
    with qtbot.waitSignal(panel.finished, timeout=180_000) as done:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    (result,) = done.args[0].results
    assert result.media == ("image", "image")
    assert "Prompt with 2 images" in panel.note.text()


def test_the_audio_picker_takes_one_clip(
    qtbot, window: MainWindow, mm_packages, monkeypatch, tmp_path
):
    """genai 0.18 takes one audio clip per prompt: the picker selects one and the field
    reads one path, ';' and all."""
    from PySide6.QtWidgets import QFileDialog

    clip = tmp_path / "a; clip.wav"
    clip.write_bytes(mm_packages["audio"].read_bytes())
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(clip), ""))
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: pytest.fail("several"))
    media = _open(qtbot, window, mm_packages["all"]).media
    assert "one per prompt" in media.paths["audio"].toolTip()
    qtbot.mouseClick(media.browse["audio"], Qt.MouseButton.LeftButton)
    assert media.audios == (clip,)
    media.paths["audio"].setText(f" {clip} ")  # typed by hand: still one path
    assert media.audios == (clip,)


def test_media_pickers_say_why_a_package_cannot_take_them(qtbot, window: MainWindow, mm_packages):
    panel = _open(qtbot, window, mm_packages["vision"])
    media = panel.media
    assert media.paths["image"].isEnabled()
    assert not media.paths["audio"].isEnabled() and not media.browse["audio"].isEnabled()
    assert "no speech session" in media.paths["audio"].toolTip()
    assert "“Inputs”" in media.paths["audio"].toolTip()  # where to choose the tower


def test_a_text_package_takes_no_media(qtbot, window: MainWindow, packages):
    panel = _open(qtbot, window, packages["cpu"])
    for kind in ("image", "audio"):
        assert not panel.media.paths[kind].isEnabled()
    assert "no vision session" in panel.media.paths["image"].toolTip()
    assert not panel.media.prompt.isEnabled()
    assert panel.prompt_len.isEnabled() and _enabled(panel.runtime, "ort")


def test_media_the_package_cannot_take_fail_before_any_run(mm_packages):
    request = BenchRequest(
        mm_packages["vision"], "genai", audios=(mm_packages["audio"],), new_tokens=2, repeats=1
    )
    with pytest.raises(EngineError, match="cannot take audio input"):
        bench_job(request, lambda f, m: None, CancelToken())


def test_the_latest_runs_legend_names_each_run_count_when_they_differ(qtbot):
    """The latest capture-off and capture-on results can come from different runs: the
    legend's one line gives one count only when both have it."""
    from dataclasses import replace

    from app.widgets.bench_charts import LatestRunsChart
    from tests.app.conftest import bench_result

    off = bench_result(
        package="p",
        repeats=10,
        decode_tokens_per_second=50.0,
        decode_tokens_per_second_min=39.0,
        decode_tokens_per_second_max=57.3,
        decode_tokens_per_second_runs=(39.0, 50.0, 57.3),
    )
    on = replace(off, graph_capture=True, repeats=3, decode_tokens_per_second=80.0)
    chart = LatestRunsChart()
    qtbot.addWidget(chart)
    chart.set_runs(off, on, "p")
    text = chart.legend.text()
    assert "over 10 runs" not in text and "10 runs)" in text and "3 runs)" in text, text
    assert "capture speed-up 1.60x" in text
    chart.set_runs(off, replace(on, repeats=10), "p")
    assert "decode spread over 10 runs: off 39.0-57.3" in chart.legend.text()


def test_slow_rates_keep_their_digits_in_the_history():
    """On lavapipe a full-size package prefills 0.29 and decodes 0.079 tok/s: the table
    said "0" and "0.1"."""
    from app.widgets.bench_panel import _rate

    assert [_rate(0.29, 0), _rate(0.0792, 1), _rate(4.5678, 1)] == ["0.29", "0.0792", "4.57"]
    assert [_rate(34997.1, 0), _rate(248.71, 1), _rate(0.0, 1)] == ["34,997", "248.7", "0.0"]
