"""Fixtures for the app tests: a main window on throwaway settings, and screenshots."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, QThreadPool
from PySide6.QtWidgets import QWidget

from app import dialogs
from app.qt_compat import binding_problem
from app.settings import AppSettings
from app.windows.main_window import MainWindow
from engine import sensitivity
from engine.models import load_spec
from engine.options import ExportOptions
from engine.pipeline import ExportResult, export
from engine.plan import plan
from engine.runtime.bench_record import BenchResult
from engine.sensitivity import Tradeoff
from tests._support.tiny_llama import make_checkpoint

BINDING_PROBLEM = binding_problem()
LEAD_SCREENS = Path(os.environ.get("EXPORT_STUDIO_SCREENS", "/tmp/app-screens"))

Measured = Callable[[ExportOptions], Tradeoff]


def make_settings(folder: Path) -> AppSettings:
    return AppSettings(QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat))


def bench_result(**changes: object) -> BenchResult:
    """A recorded WebGPU genai run (capture off, 3 repeats), with ``changes``."""
    result = BenchResult(
        package="gemma4-e2b-webgpu-fp16-w4-emb4",
        runtime="genai",
        ep="webgpu",
        provider="WebGpuExecutionProvider",
        graph_capture=False,
        kv_mode="share",
        prompt_length=64,
        new_tokens=64,
        repeats=3,
        warmup=1,
        load_seconds=12.34,
        time_to_first_token_seconds=0.4567,
        prefill_tokens_per_second=12_345.6,
        decode_tokens_per_second=123.4,
        decode_tokens_per_second_min=120.1,
        decode_tokens_per_second_max=125.9,
        decode_tokens_per_second_runs=(120.1, 123.4, 125.9),
        peak_rss_bytes=3_456_789_012,
        peak_rss_scope="benchmark",
    )
    return replace(result, **changes)  # type: ignore[arg-type]


def export_split_webgpu_tiny(out: Path) -> ExportResult:
    """gemma4-tiny for WebGPU with INT4 embeddings under a 16 KiB buffer limit: its tables
    split into pieces (random weights, seconds)."""
    options = ExportOptions(
        ep="webgpu",
        embedding_bits=4,
        block_size=16,  # WebGPU reads 4-bit rows of an even block count only
        max_buffer_size=16 * 1024,
        force=True,  # the linear weights are over so small a limit; the tables split
        random_weights=True,
    )
    return export(out, preset="gemma4-tiny", options=options)


@pytest.fixture(autouse=True)
def _working_binding() -> None:
    """Fail (not crash the whole run) where the Qt binding corrupts reference counts."""
    if BINDING_PROBLEM:
        pytest.fail(BINDING_PROBLEM, pytrace=False)


@pytest.fixture(autouse=True)
def _no_unanswered_dialogs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A modal question nobody answers would hang the run: a test that expects one
    answers it (``monkeypatch.setattr(dialogs, "ask", ...)``); any other fails at once."""

    def unexpected(parent: object, title: str, text: str, buttons: object) -> str:
        raise AssertionError(f"unexpected dialog: {title}: {text}")

    monkeypatch.setattr(dialogs, "ask", unexpected)


@pytest.fixture(autouse=True)
def _own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Default output folders go under ~/export-studio: a package the user (or the README's
    quick start) left there must not change what a test sees, nor a test write there."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture
def settings(tmp_path: Path) -> AppSettings:
    return make_settings(tmp_path / "settings")


@pytest.fixture
def window(qtbot, settings: AppSettings) -> Iterator[MainWindow]:
    """The main window, shown, with its first preview computed."""
    win = MainWindow(settings)  # closed below (not by qtbot: unsaved edits go first)
    win.resize(1440, 900)
    win.show()
    qtbot.waitUntil(
        lambda: win.state.preview is not None and not win.previewer.busy and win.warmed_up,
        timeout=20_000,
    )
    yield win
    if win.config_editor.doc is not None:  # a test's unsaved edits: drop them unasked
        win.config_editor.doc = None
    win.close()
    win.deleteLater()
    QThreadPool.globalInstance().waitForDone(30_000)


def wait_for_preview(qtbot, win: MainWindow, check: Callable[[object], bool]) -> object:
    """Wait until the preview is settled and ``check(preview)`` holds."""
    qtbot.waitUntil(
        lambda: (
            not win.previewer.busy and win.state.preview is not None and check(win.state.preview)
        ),
        timeout=20_000,
    )
    return win.state.preview


@pytest.fixture(scope="session")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Callable[[QWidget, str], Path]:
    """``screens(widget, name)`` saves a PNG of the widget to a temp folder and a copy for
    the lead in /tmp/app-screens (or $EXPORT_STUDIO_SCREENS)."""
    folder = tmp_path_factory.mktemp("screens")

    def save(widget: QWidget, name: str) -> Path:
        path = folder / f"{name}.png"
        assert widget.grab().save(str(path)), f"could not save {path}"
        assert path.stat().st_size > 10_000, "the screenshot is suspiciously small (blank?)"
        try:
            LEAD_SCREENS.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, LEAD_SCREENS / path.name)
        except OSError:
            pass  # the copy is a convenience; the test's own file is what counts
        return path

    return save


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 checkpoint folder (random weights, a tokenizer)."""
    folder = tmp_path_factory.mktemp("quality") / "my-qwen2"
    make_checkpoint(folder, "qwen2")
    return folder


@pytest.fixture
def measured(qwen2: Path, monkeypatch: pytest.MonkeyPatch) -> Measured:
    """``measured(options)``: the checkpoint's tradeoff, each weight's cost made up (the
    later weights cost more) instead of measured on the float model."""

    def costs(model_dir: object, export_plan: object, weights: list, *_: object, **__: object):
        return {wp.name: 0.01 * (i + 1) for i, wp in enumerate(weights)}

    monkeypatch.setattr(sensitivity, "measure", costs)
    spec = load_spec(qwen2)

    def make(options: ExportOptions) -> Tradeoff:
        return sensitivity.tradeoff(qwen2, plan(spec, options), lambda o: plan(spec, o))

    return make
