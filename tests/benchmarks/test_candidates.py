"""Engine changes that wait for a GPU A/B (``benchmarks/device/candidates/*.patch``): each
still applies to this engine, and the device README names exactly the ones waiting. A
patch that rotted while main moved on would cost the device call it was prepared for; a
README that still sent a session to a patch already landed (or deleted) would too.

A candidate's own promise (what its graph changes) is tested beside it while it waits,
and deleted with it: pv-bf16.patch's test checked that E2B's bf16 graph lost its 3 V
casts and kept its 3 K casts; it landed December 7 and ``test_parity.py`` checks that now.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "benchmarks" / "device" / "candidates"
README = REPO / "benchmarks" / "device" / "README.md"
WAITING = re.compile(r"\*\*Waiting for a GPU: `candidates/([\w.-]+\.patch)`")
"""How the device README introduces a waiting candidate (its other mentions are history)."""


def _applied(patch: Path, root: Path) -> Path:
    """This checkout's engine, resources and tests copied under ``root`` with ``patch``
    applied (``git apply`` outside a repository works as ``patch -p1``)."""
    for part in ("engine", "resources", "tests"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        ["git", "apply", "--verbose", str(patch)], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{patch.name} no longer applies:\n{done.stderr}"
    return root


def test_the_readme_names_exactly_the_waiting_candidates():
    waiting = set(WAITING.findall(README.read_text(encoding="utf-8")))
    present = {patch.name for patch in FOLDER.glob("*.patch")}
    assert waiting == present, (
        f"described as waiting but not in {FOLDER.name}/: {sorted(waiting - present)}; "
        f"in {FOLDER.name}/ but not described: {sorted(present - waiting)}"
    )


def test_every_waiting_candidate_applies(tmp_path: Path):
    # With no candidate waiting (December 7) this checks nothing; the README test above
    # still holds the folder and the README to each other.
    for patch in sorted(FOLDER.glob("*.patch")):
        _applied(patch, tmp_path / patch.stem)
