"""A fast, seeded subset of the input fuzzer (benchmarks/fuzz_inputs.py): mutated safetensors
headers and bytes, shard indexes, config.json fields, export options, genai_config.json and
manifest fields; media, tokenizer files, lengths, foreign checkpoints and damaged package
files, each through the CLI. None may end in a traceback, leave anything behind,
hang or write a CPU package that then fails to run; the full run (thousands of cases) is the
benchmark."""

from __future__ import annotations

import json
import subprocess
import sys

from tests._support.cli import ROOT

INPUT_KINDS = "header,bytes,shards,config,options,genai,manifest"
USER_KINDS = "media,tokenizer,lengths,foreign,package_files"


def fuzz(cases: int, seed: int, kinds: str) -> dict:
    # A fresh process: the fuzzer forks its workers, which a test process with live
    # onnxruntime threads should not do.
    done = subprocess.run(
        [sys.executable, "benchmarks/fuzz_inputs.py", "--cases", str(cases), "--seed", str(seed),
         "--kinds", kinds, "--workers", "2", "--timeout", "600", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    findings = json.dumps(report["findings"], indent=1)
    assert report["outcomes"]["traceback"] == 0, findings
    assert report["outcomes"]["leftover"] == 0, findings
    assert report["outcomes"]["hang"] == 0, findings
    assert report["outcomes"]["broken package"] == 0, findings
    assert report["cases"] == cases
    # The cases reach both ends: refusals and real packages or runs.
    assert report["outcomes"]["clear error"] > 0 and report["outcomes"]["ok"] > 0
    assert sorted(report["by_kind"]) == sorted(kinds.split(","))
    assert all(sum(counts.values()) >= 5 for counts in report["by_kind"].values())
    return report


def test_seeded_fuzz_cases_end_in_a_clear_error_or_a_package():
    fuzz(105, 13, INPUT_KINDS)  # 15 of each of the 7 kinds


def test_seeded_fuzz_of_media_tokenizers_lengths_formats_and_package_files():
    """Media, tokenizer files, lengths and numeric options, checkpoints of other formats,
    damaged package files: each a clear error or a result that is right."""
    report = fuzz(60, 13, USER_KINDS)  # 12 of each of the 5 kinds
    errors = " ".join(report["common_errors"])
    assert "PEFT adapter" in errors or "safetensors" in errors
