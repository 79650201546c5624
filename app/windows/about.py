"""Help ▸ About: what this is, and the versions of everything it runs on (for bug reports)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import APP_NAME

DISTRIBUTIONS = (
    ("Export Studio", "export-studio", "engine"),
    ("onnxruntime", "onnxruntime", "onnxruntime"),
    ("onnxruntime-genai", "onnxruntime-genai", "onnxruntime_genai"),
    ("onnx", "onnx", "onnx"),
    ("onnx-ir", "onnx-ir", "onnx_ir"),
    ("PySide6", "PySide6-Essentials", "PySide6"),
    ("pyqtgraph", "pyqtgraph", "pyqtgraph"),
    ("numpy", "numpy", "numpy"),
)


def version_of(distribution: str, module: str) -> str:
    """An installed package's version without importing it (its metadata), else the
    module's ``__version__`` (a frozen bundle may carry no metadata), else "not installed"."""
    names = [distribution]
    if distribution == "onnxruntime":  # other builds install the same module
        names += ["onnxruntime-webgpu", "onnxruntime-gpu", "onnxruntime-directml"]
    for name in names:
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return found if name == distribution else f"{found} ({name})"
    try:
        imported = __import__(module)
    except ImportError:
        return "not installed"
    return str(getattr(imported, "__version__", "installed"))


def versions() -> list[tuple[str, str]]:
    """(component, version) of the app and what it runs on."""
    rows = [(label, version_of(dist, module)) for label, dist, module in DISTRIBUTIONS]
    rows.insert(6, ("Qt", qVersion()))
    rows.append(("WebGPU", webgpu_adapter()))
    rows.append(("Python", f"{platform.python_version()} ({sys.executable})"))
    rows.append(
        ("Platform", f"{platform.platform()}, Qt platform {QGuiApplication.platformName()}")
    )
    return rows


def webgpu_adapter() -> str:
    """How WebGPU runs here, in words: the plugin EP and its adapter (GPU or software)."""
    try:
        import onnxruntime as ort

        from engine.runtime.plugins import ort_plugin

        plugin = ort_plugin("WebGpuExecutionProvider")  # None for a build that has it built in
        if plugin is None and "WebGpuExecutionProvider" in ort.get_available_providers():
            return f"built into onnxruntime {ort.__version__}"
    except Exception as exc:  # a broken runtime must not keep About from opening
        return f"unavailable ({type(exc).__name__}: {exc})"
    if plugin is None:
        return 'not installed (pip install "export-studio[webgpu]")'
    if not plugin.devices:
        return f"plugin {plugin.version or ''} installed, but no adapter (no GPU, no lavapipe)"
    return plugin.adapter


class AboutDialog(QDialog):
    """The versions, selectable and copyable."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"About {APP_NAME}")
        self.rows = versions()
        text = "\n".join(f"{name}: {value}" for name, value in self.rows)
        intro = QLabel(
            f"<b>{APP_NAME}</b> exports Hugging Face LLMs (Gemma 4, Gemma 3, Llama 3.x, Qwen3, "
            "Qwen2.5, Mistral, SmolLM3, Phi-3) to ONNX Runtime GenAI packages tuned for one "
            "execution provider, and shows what you get."
        )
        intro.setWordWrap(True)
        self.details = QLabel(
            "<table>"
            + "".join(f"<tr><td>{n}&nbsp;&nbsp;</td><td>{v}</td></tr>" for n, v in self.rows)
            + "</table>"
        )
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAccessibleName("Versions")
        self.details.setAccessibleDescription(text)
        copy = QPushButton("&Copy versions")
        copy.setToolTip("Copy the versions to the clipboard (for a bug report)")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(text))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(copy, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.details)
        layout.addWidget(buttons)
