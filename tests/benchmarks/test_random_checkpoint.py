"""benchmarks/random_checkpoint.py prints one JSON object and nothing else on stdout (the
tokenizer trainer's progress bar used to add blank lines before it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_stdout_is_one_json_object(tmp_path: Path):
    out = tmp_path / "ckpt"
    script = REPO / "benchmarks" / "random_checkpoint.py"
    done = subprocess.run(
        [sys.executable, str(script), "--preset", "gemma4-tiny", "--tokenizer", "512", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("{"), repr(done.stdout[:40])
    report = json.loads(done.stdout)
    assert report["out"] == str(out) and (out / "tokenizer.json").is_file()
