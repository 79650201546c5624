"""The README's Python API example runs as written and prints what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Python API section has no python block"
    return match.group(1)


def test_the_readme_python_api_example_runs_and_prints_its_comments(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    code = _example()
    monkeypatch.chdir(tmp_path)
    names: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), names)
    printed = capsys.readouterr().out.splitlines()
    promised = re.findall(r"# prints: (.*)$", code, re.M)
    assert promised, "the example says nothing of what it prints"
    for said in promised:
        assert said in printed, f"the README says {said!r}; the example printed {printed}"
    assert (tmp_path / "out" / "tiny" / "genai_config.json").is_file()
    assert any(line.startswith("100%") for line in printed)  # the progress callback
    shown = repr(names["result"])  # a line, not the whole plan (it was ~80 KB)
    assert shown.startswith("ExportResult(output=") and len(shown) < 300, shown
