"""Speech-session parity against transformers 5.24, per tiny audio configuration.

For each configuration of ``tests/_support/tiny_audio.AUDIO_CONFIGS`` (tiny
``Gemma4ForConditionalGeneration`` checkpoints built offline in a temporary folder), the
package's speech session on the CPU EP against ``get_audio_features`` with the padding
dropped, over the clips of ``tiny_audio.CLIPS`` (a hole in the mask, padded masks, lengths
not multiples of 4 or of the chunk, one frame, several chunks): max abs error of the fp32
and fp16 packages against the float model, and of INT4 / INT8 packages (block 16, RTN,
accuracy level 0) against transformers running the package's dequantized weights.

Prints one JSON object. Run from the repository root (a few minutes):

    python benchmarks/audio_parity.py
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    from engine.options import ExportOptions
    from tests._support.quantized import dequantized_model, quant_options
    from tests._support.tiny_audio import AUDIO_CONFIGS, AudioModels, max_errors

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    started = time.perf_counter()
    out: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = AudioModels(Path(tmp))
        for name, overrides in AUDIO_CONFIGS.items():
            model = models.model(name)[1]
            row: dict[str, object] = {"config": overrides}
            for dtype in ("fp32", "fp16"):
                result = models.export(name, ExportOptions(ep="cpu", dtype=dtype))
                row[f"{dtype}_vs_transformers"] = max(max_errors(model, result))
            for bits in (4, 8):
                result = models.export(name, quant_options(weight_bits=bits))
                restored = dequantized_model(model, result, "speech")
                row[f"int{bits}_vs_dequantized"] = max(max_errors(restored, result))
                row[f"int{bits}_vs_float_model"] = max(max_errors(model, result))
            out[name] = row
    seconds = round(time.perf_counter() - started, 1)
    print(json.dumps({"seconds": seconds, "max_abs": out}, indent=1))


if __name__ == "__main__":
    main()
