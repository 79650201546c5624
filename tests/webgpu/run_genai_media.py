"""Run a multimodal package through onnxruntime-genai with an image and / or a clip.

Runs inside ANY environment that has onnxruntime-genai: the WebGPU one (onnxruntime-webgpu
plus onnxruntime-genai installed with --no-deps) or the main one (CPU). It never imports
the engine. Writes one JSON report.

genai is driven exactly as an app would (``og.Model``, ``create_multimodal_processor``,
``og.Images`` / ``og.Audios``, greedy ``generate_next_token``), on a copy of the package
whose genai_config.json differs only in each session's ``session_options``:

* ``log_id`` ``es-<session>`` and ``log_severity_level`` 0, so onnxruntime's verbose log
  says, per session, where every node was placed and whether the decoder replayed a
  captured graph;
* with ``--strict``, ``session.disable_cpu_ep_fallback`` "1" in every session: genai's
  load fails if any node of any session would fall back to the CPU (the report then holds
  the error, and the placement of a second, non-strict load);
* with ``--capture on|off``, the decoder's ``enableGraphCapture`` provider option.

The copy is needed: in onnxruntime-genai 0.18, ``og.Config.overlay`` of a vision, speech or
embedding ``session_options`` replaces that section and drops its providers (the session
then runs on the CPU), and ``og.Config.clear_providers`` / ``append_provider`` /
``set_provider_option`` change the decoder session only. Every session takes its EP from
its own ``provider_options`` in the file.

usage:
  python tests/webgpu/run_genai_media.py PACKAGE --json-out REPORT.json [--image PNG ...]
      [--audio WAV] [--prompt TEXT] [--steps 12] [--strict] [--capture keep|on|off]
      [--save-logits OUT.npy]

Tokens: ``tokens[i]`` is the greedy token of step i and ``logits[i]`` the row it came from
(step 0 is the prompt).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_package import _stderr_to, parse_placement_log

SESSIONS = ("vision", "speech", "embedding", "decoder")
FALLBACK_KEY = "session.disable_cpu_ep_fallback"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import onnxruntime_genai as og

    report: dict[str, Any] = {"package": str(args.package), "onnxruntime_genai": og.__version__}
    if "webgpu" in (args.package / "genai_config.json").read_text():
        import webgpu_ort

        report["webgpu_plugin"] = webgpu_ort.register_genai()
        report.update(webgpu_ort.runtime())
    try:
        import onnxruntime as ort

        report["onnxruntime"] = ort.__version__
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = work / "ort.log"
        sessions = _copy_package(args.package, work / "pkg", args.strict, args.capture)
        report["sessions"] = sessions
        with _stderr_to(str(log)):
            try:
                report.update(_generate(og, work / "pkg", args))
            except Exception as exc:  # genai raises RuntimeError for everything
                report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        text = log.read_text(errors="replace")
        if "error" in report and args.strict:
            # Where did the nodes go? A second load without the strict flag logs it.
            _copy_package(args.package, work / "loose", False, args.capture)
            with _stderr_to(str(work / "loose.log")):
                try:
                    og.Model(str(work / "loose"))
                except Exception as exc:
                    report["loose_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            text = (work / "loose.log").read_text(errors="replace")
        report["placement"] = {s: _placement(text, s) for s in sessions}
        report["capture"] = {
            "decoder_took_capture": "will use the graph capture feature" in _lines(text, "decoder"),
            "replays": _lines(text, "decoder").count("Replaying the captured"),
        }
    args.json_out.write_text(json.dumps(report, indent=1))
    return 1 if "error" in report else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("package", type=Path)
    p.add_argument("--json-out", type=Path, required=True)
    p.add_argument("--image", type=Path, action="append", default=[])
    p.add_argument("--audio", type=Path, action="append", default=[])
    p.add_argument("--prompt", default="look and listen")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--strict", action="store_true", help="disable CPU fallback in every session")
    p.add_argument("--capture", choices=("keep", "on", "off"), default="keep")
    p.add_argument("--save-logits", type=Path)
    return p


def _copy_package(package: Path, dest: Path, strict: bool, capture: str) -> list[str]:
    """``package`` with its files linked and genai_config.json rewritten; the sessions."""
    dest.mkdir()
    for item in package.iterdir():
        if item.name != "genai_config.json":
            (dest / item.name).symlink_to(item.resolve())
    doc = json.loads((package / "genai_config.json").read_text())
    sessions = [s for s in SESSIONS if "filename" in doc["model"].get(s, {})]
    for session in sessions:
        options = doc["model"][session].setdefault("session_options", {})
        options.update(log_id=f"es-{session}", log_severity_level=0)
        if strict:
            options[FALLBACK_KEY] = "1"
        if session == "decoder" and capture != "keep":
            for entry in options.get("provider_options", []):
                if "webgpu" in entry:
                    entry["webgpu"]["enableGraphCapture"] = "1" if capture == "on" else "0"
    (dest / "genai_config.json").write_text(json.dumps(doc, indent=1))
    return sessions


def _generate(og: Any, package: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    model = og.Model(str(package))
    loaded = time.perf_counter()
    processor = model.create_multimodal_processor()
    images = og.Images.open(*map(str, args.image)) if args.image else None
    audios = og.Audios.open(*map(str, args.audio)) if args.audio else None
    text = "<|image|>" * len(args.image) + "<|audio|>" * len(args.audio) + args.prompt
    inputs = processor(text, images=images, audios=audios)
    prompt = np.asarray(inputs["input_ids"].as_numpy()).reshape(-1)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.size + args.steps, do_sample=False)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    step_seconds: list[float] = []
    for _ in range(args.steps):
        tick = time.perf_counter()
        # get_logits runs the pending step; generate_next_token then picks from that row.
        logits.append(np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
        step_seconds.append(round(time.perf_counter() - tick, 4))
    rows = np.stack(logits)
    if args.save_logits:
        np.save(args.save_logits, rows)
    return {
        "prompt": prompt.tolist(),
        "tokens": tokens,
        "argmax_equals_tokens": [int(r.argmax()) for r in rows] == tokens,
        "load_seconds": round(loaded - started, 3),
        "step_seconds": step_seconds,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _lines(text: str, session: str) -> str:
    tag = f":es-{session},"
    return "\n".join(line for line in text.splitlines() if tag in line)


def _placement(text: str, session: str) -> dict[str, Any]:
    """onnxruntime's placement of one session's nodes, from its verbose log."""
    return parse_placement_log(_lines(text, session))


if __name__ == "__main__":
    raise SystemExit(main())
