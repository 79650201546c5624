"""Full-size E2B speech session: plan, random-weights build, checker, CPU session, one clip.

The audio tower of ``google/gemma-4-E2B-it`` (its config.json ``audio_config``, as
tests/_support/tiny_audio.E2B_AUDIO_CONFIG copies it) on the text preset ``gemma4-e2b``.
Per weight setting (fp16 float weights, INT4 block 32): planned bytes, bytes written,
build + write seconds, ``onnx.checker`` (full check, external data) and onnxruntime CPU
session creation, and one 30-second clip (3000 log-mel frames -> 750 audio tokens) through
the CPU EP. Only the speech session is built and written.

Prints one JSON object. Run from the repository root (a few minutes, ~1 GB of disk):

    python benchmarks/e2b_speech.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort

    from engine.models import build_session, spec_from_config
    from engine.options import ExportOptions
    from engine.plan import plan
    from engine.presets import preset_config
    from engine.weights.factory import TensorFactory
    from engine.weights.sources import RandomSource
    from tests._support.tiny_audio import E2B_AUDIO_CONFIG

    spec = spec_from_config(
        {
            "model_type": "gemma4",
            "text_config": preset_config("gemma4-e2b"),
            "audio_config": E2B_AUDIO_CONFIG,
        },
        "gemma-4-E2B-it audio",
    )
    frames = 3000
    rng = np.random.default_rng(0)
    features = rng.normal(0.0, 1.0, (1, frames, 128)).astype(np.float32)
    mask = np.ones((1, frames), dtype=bool)
    out: dict[str, object] = {"clip_frames": frames}
    settings = {"fp16": dict(dtype="fp16"), "int4": dict(dtype="fp32", weight_bits=4)}
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in settings.items():
            options = ExportOptions(ep="cpu", modalities=("text", "audio"), **extra)
            started = time.perf_counter()
            export_plan = plan(spec, options)
            speech = export_plan.session("speech")
            factory = TensorFactory(export_plan, RandomSource(0))
            model = build_session(export_plan, "speech", factory)
            path = Path(tmp) / f"speech_{label}.onnx"
            ir.save(model, path, external_data=path.name + ".data")
            written = time.perf_counter() - started
            stored = _stored_bytes(path)
            onnx.checker.check_model(str(path), full_check=True)
            started = time.perf_counter()
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            created = time.perf_counter() - started
            started = time.perf_counter()
            result = session.run(None, {"input_features": features, "input_features_mask": mask})
            ran = time.perf_counter() - started
            out[label] = {
                "planned_bytes": speech.nbytes,
                "written_planned_bytes": sum(stored.pop(t.name) for t in speech.tensors()),
                "other_constants": {"count": len(stored), "bytes": sum(stored.values())},
                "nodes": len(list(model.graph.all_nodes())),
                "build_and_write_s": round(written, 1),
                "checker": "ok",
                "session_create_s": round(created, 1),
                "run_30s_clip_s": round(ran, 2),
                "output_shape": list(result[0].shape),
                "output_finite": bool(np.isfinite(result[0].astype(np.float32)).all()),
            }
            del session
    print(json.dumps(out, indent=1))


def _stored_bytes(path: Path) -> dict[str, int]:
    """Bytes of every initializer in the saved file (inline or external), by name."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    out = {}
    for init in proto.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            out[init.name] = int(next(e.value for e in init.external_data if e.key == "length"))
        else:
            out[init.name] = len(init.raw_data)
    return out


if __name__ == "__main__":
    main()
