"""benchmarks/bench_isolation.py: the same benchmark here and in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.options import ExportOptions
from engine.pipeline import export

ROOT = Path(__file__).resolve().parents[2]


def test_it_prints_both_sides_with_the_same_tokens(tmp_path: Path):
    package = tmp_path / "tiny"
    export(package, preset="gemma4-tiny", options=ExportOptions(ep="cpu", random_weights=True))
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_isolation.py", str(package), "--runtime", "ort",
         "--graph-capture", "off", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1",
         "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["isolated"] for row in report["rows"]] == [False, True]
    assert all(row["tokens_equal_first_row"] for row in report["rows"])
    assert set(report["summary"]) == {"in_process", "isolated"}
    assert report["summary"]["isolated"]["decode_tokens_per_second"] > 0
