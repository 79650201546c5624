"""Start-up: the entry points work, and no heavy runtime is imported before the window shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args, "--settings", str(tmp_path / "s.ini")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )


def test_window_shows_without_torch_transformers_or_onnxruntime(tmp_path):
    result = _run("--exit-when-shown", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[0])
    assert report["heavy_modules"] == []
    assert report["deferred_modules_at_show"] == []  # charts come after the first frame
    assert report["preview_drawn_s"] >= report["shown_s"]
    assert report["shown_s"] < 30  # the real budget (1 s) is benchmarks/app_startup.py's


def test_importing_app_is_free():
    heavy = "('PySide6', 'engine', 'numpy')"
    code = f"import sys, app; print(sorted(m for m in {heavy} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_help_lists_the_self_test(tmp_path):
    result = _run("--help", tmp_path=tmp_path)
    assert result.returncode == 0
    assert "--self-test" in result.stdout


QUICK_EXIT = """
import sys
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
from app.settings import AppSettings
from app.windows.main_window import MainWindow
app = QApplication(sys.argv[:1])
window = MainWindow(AppSettings(QSettings(sys.argv[1], QSettings.Format.IniFormat)))
window.show()
if sys.argv[2] == "close":
    window.close()
# the script ends here: its preview worker may still be running
"""


def test_a_window_created_and_dropped_at_once_leaves_no_worker_errors(tmp_path):
    for how in ("close", "drop"):
        result = subprocess.run(
            [sys.executable, "-c", QUICK_EXIT, str(tmp_path / "s.ini"), how],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr, f"{how}: {result.stderr}"
        assert "has been deleted" not in result.stderr, f"{how}: {result.stderr}"


def test_without_a_display_it_says_so_in_one_line_and_exports_headless(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.pop("QT_QPA_PLATFORM", None)
    env["HOME"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "app", "--preset", "gemma4-tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("export-studio:")]
    assert len(said) == 1 and "no display" in said[0]
    package = tmp_path / "export-studio" / "gemma4-tiny-cpu-fp32"
    assert said[0].endswith(
        f"python -m engine build --preset gemma4-tiny --random-weights {package}"
    )
    assert (package / "model.onnx").is_file() and (package / "genai_config.json").is_file()
    assert "qt." not in result.stderr.lower()  # Qt was never asked


def test_without_a_display_it_exports_the_saved_session(tmp_path, monkeypatch, capsys):
    """The headless equivalent exported the default preset whatever the settings held; it
    exports what the window would restore from them (--settings INI): the last model folder
    and options, and the preset, with those options, once that folder is gone."""
    from PySide6.QtCore import QSettings

    from app import __main__ as entry
    from app import platform_check
    from app.settings import AppSettings
    from app.source import ModelSource
    from app.state import StudioState
    from engine import cli

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ini = tmp_path / "saved.ini"
    settings = AppSettings(QSettings(str(ini), QSettings.Format.IniFormat))
    state = StudioState()
    state.set_source(ModelSource("folder", str(ckpt)))
    state.update_options(ep="cpu", dtype="fp16", weight_bits=4)
    settings.save_state(state)
    settings.sync()
    ran: list[list[str]] = []
    monkeypatch.setattr(platform_check, "display_problem", lambda: "no display (test)")
    monkeypatch.setattr(cli, "main", lambda argv: ran.append(list(argv)) or 0)
    out = tmp_path / "out"
    assert entry.main(["--settings", str(ini), "--output", str(out)]) == 0
    (said,) = capsys.readouterr().err.strip().splitlines()
    assert said.endswith(
        f"python -m engine build --model {ckpt} --dtype fp16 --weight-bits 4 {out}"
    ), said
    assert ran == [
        ["build", "--model", str(ckpt), "--dtype", "fp16", "--weight-bits", "4", str(out)]
    ]

    ckpt.rmdir()  # gone: the window falls back to the preset, and keeps the options
    assert entry.main(["--settings", str(ini), "--output", str(out)]) == 0
    lost, said = capsys.readouterr().err.strip().splitlines()
    assert lost == (
        f"export-studio: the last model folder {ckpt} no longer exists: exporting preset "
        "gemma4-tiny"
    )
    assert said.endswith(
        "python -m engine build --preset gemma4-tiny --dtype fp16 --weight-bits 4 "
        f"--random-weights {out}"
    ), said


def _library_needing(tmp_path: Path, missing: str) -> Path:
    """A copy of a real system library whose dependency on libxcb.so.1 now names
    ``missing`` instead (same length, so the ELF stays valid). Any libxcb-* extension
    library will do (scripts/install-lavapipe.sh's Mesa brings several); none at all fails."""
    import glob

    candidates = (
        Path(path).read_bytes()
        for pattern in ("/usr/lib/*/libxcb-*.so.[0-9]", "/lib/*/libxcb-*.so.[0-9]")
        for path in sorted(glob.glob(pattern))
    )
    data = next((data for data in candidates if data.count(b"libxcb.so.1\0") == 1), None)
    if data is None:
        pytest.fail(
            "no libxcb-*.so.N here to build the test library from: "
            "run scripts/install-lavapipe.sh or apt-get install libxcb-icccm4"
        )
    assert len(missing) == len("libxcb.so.1")
    copy = tmp_path / "libneeds.so"
    copy.write_bytes(data.replace(b"libxcb.so.1\0", missing.encode() + b"\0"))
    return copy


def test_missing_x11_libraries_are_named_with_the_line_that_installs_them(
    tmp_path, monkeypatch, capsys
):
    from app import __main__ as entry
    from app import platform_check

    library = _library_needing(tmp_path, "libxqz.so.1")
    assert platform_check.missing_libraries(library) == ["libxqz.so.1"]
    monkeypatch.setattr(platform_check, "xcb_library", lambda: library)
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(platform_check.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert entry.main(["--preset", "gemma4-tiny"]) == 3
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "export-studio: Qt's X11 support needs libxqz.so.1, which this system lacks; "
        "install it with: sudo apt-get install -y libxqz1"
    ]


@pytest.mark.parametrize(
    ("soname", "package"),
    [
        ("libxcb-cursor.so.0", "libxcb-cursor0"),
        ("libxcb-icccm.so.4", "libxcb-icccm4"),
        ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
        ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
        ("libX11-xcb.so.1", "libx11-xcb1"),
        ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ],
)
def test_debian_package_names_follow_the_soname(soname, package):
    from app.platform_check import debian_package

    assert debian_package(soname) == package


def test_which_environments_have_a_display():
    from app.platform_check import display_problem, uses_xcb

    assert display_problem({}, "linux").startswith("no display")
    assert display_problem({"DISPLAY": ":0"}, "linux") == ""
    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux") == ""
    assert display_problem({}, "darwin") == ""
    assert uses_xcb({"DISPLAY": ":0"}, "linux")
    assert not uses_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, "linux")


@pytest.mark.parametrize(("width", "height"), [(1920, 1080), (1366, 768)])
def test_at_150_percent_scaling_the_window_opens_inside_the_screen(tmp_path, width, height):
    screen = {"screens": [{"name": "s", "x": 0, "y": 0, "width": width, "height": height}]}
    config = tmp_path / "screen.json"
    config.write_text(json.dumps(screen))
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": f"offscreen:configfile={config}",
        "QT_SCALE_FACTOR": "1.5",
    }
    result = subprocess.run(
        [sys.executable, "-m", "app", "--exit-when-shown", "--settings", str(tmp_path / "s.ini")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[0])
    x, y, w, h = report["window"]
    sx, sy, sw, sh = report["screen"]
    assert (sw, sh) == (round(width / 1.5), round(height / 1.5))
    assert sx <= x and sy <= y and x + w <= sx + sw and y + h <= sy + sh, report
