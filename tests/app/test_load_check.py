"""The studio's load check (Verify's first step, and the self-test's) on packages the CPU EP
cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.load_check import check_package_loads
from engine.errors import RuntimeUnavailableError
from engine.options import ExportOptions
from engine.pipeline import export


def test_a_bf16_package_is_not_called_broken(tmp_path: Path):
    """A bf16 CUDA package was reported as "does not load or run in onnxruntime" (the CPU
    EP has no bf16 kernels): a sound package called broken. Now the check says which EP
    cannot run it and where to check it."""
    out = tmp_path / "bf16"
    options = ExportOptions(ep="cuda", dtype="bf16", modalities=("text",), random_weights=True)
    export(out, preset="gemma4-tiny", options=options)
    with pytest.raises(RuntimeUnavailableError) as caught:
        check_package_loads(out)
    message = str(caught.value)
    assert "takes or gives bfloat16 (past_key_values.0.key)" in message
    assert "the CPU EP, which this check runs on, has no bf16 kernels" in message
    assert "--ep cuda" in message
