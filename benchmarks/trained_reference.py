"""A trained reference model that any machine can make without downloads, and how much each
quantization choice costs on it (issue 24's first step).

The corpus is the Python standard library's own source files (every machine with Python has
them): files are split into training and held-out text by a hash of their path. A byte-level
BPE tokenizer (the ``tokenizers`` library) is trained on the training text, then a small
Qwen3-architecture model (q/k norms, GQA, tied head) from scratch with transformers, seeded.
The checkpoint is saved with its tokenizer like any Hugging Face folder; weights are never
committed (``--keep DIR`` keeps them).

Then each quantization choice is exported from that checkpoint with the engine (CPU, fp32
activations, ``accuracy_level`` 0 so only the weights differ) and scored against the float
package on held-out sequences, every position teacher-forced in one prefill:

* ``kld``: mean KL(float || quantized) of the next-token distributions, nats per token;
* ``top1``: how often the two pick the same next token;
* ``ppl``: perplexity of the held-out text (and the float package's, and transformers');
* ``bytes``: the package's decoder weights.

Prints one JSON object. A CPU-size run (the defaults) takes a few minutes on two cores;
``--preset gpu`` is the benchmark's model size for the lent GPU (training on CUDA; the
README's table trains it ``--steps 500``, the preset's 3,000 steps overfit this small
corpus and serve as the contrast):

    python benchmarks/trained_reference.py [--preset cpu|gpu] [--steps N] [--keep DIR] [--cuda]
        [--webgpu]
        [--checkpoint DIR] [--only CHOICE,...] [--set MODULE.NAME=VALUE ...]

``--set`` overrides a module constant for the run (a sweep, e.g.
``--set engine.quantize.gptq.REFIT_STEPS=0``) and is recorded as ``overrides``.

``--cuda`` (a GPU with onnxruntime-gpu) adds our CUDA packages of the same checkpoint (fp32,
fp16, bf16, INT8 and INT4 weights), run on the CUDA EP and scored against the same float
package: what a CUDA user's package loses to its precision, on a model with real structure.
``--webgpu`` does the same for WebGPU packages on the WebGPU EP (the onnxruntime-ep-webgpu
plugin; lavapipe where there is no GPU, ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(
        vocab=2048, hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, mlp=384,
        seq=128, batch=16, steps=600, lr=3e-3, eval_sequences=24,
    ),
    "gpu": dict(
        vocab=8192, hidden=512, layers=8, heads=8, kv_heads=2, head_dim=64, mlp=1536,
        seq=256, batch=64, steps=3000, lr=2e-3, eval_sequences=64,
    ),
}  # fmt: skip
CHOICES: dict[str, dict[str, Any]] = {
    "int8_rtn": dict(weight_bits=8, embedding_bits=8),
    "int4_rtn": dict(weight_bits=4, embedding_bits=4),
    "int4_search": dict(weight_bits=4, embedding_bits=4, quant_method="search"),
    "int4_weights_float_tables": dict(weight_bits=4),
    "int4_rtn_b128": dict(weight_bits=4, embedding_bits=4, block_size=128),
    # symmetric (no zero points): onnxruntime-gpu 1.31.1's MatMulNBits runs it faster
    "int4_rtn_sym": dict(weight_bits=4, embedding_bits=4, symmetric=True),
    "int4_rtn_sym_b128": dict(weight_bits=4, embedding_bits=4, symmetric=True, block_size=128),
    "int4_gptq_sym_b128": dict(
        weight_bits=4, embedding_bits=4, symmetric=True, block_size=128, quant_method="gptq"
    ),
    "int4_gptq_b128": dict(weight_bits=4, embedding_bits=4, block_size=128, quant_method="gptq"),
    "int4_gptq": dict(weight_bits=4, embedding_bits=4, quant_method="gptq"),
    "int4_gptq_int8_tables": dict(weight_bits=4, embedding_bits=8, quant_method="gptq"),
    "int4_awq": dict(weight_bits=4, embedding_bits=4, quant_method="awq"),
    "int4_awq_gptq": dict(weight_bits=4, embedding_bits=4, quant_method="awq-gptq"),
    "int4_awq_float_tables": dict(weight_bits=4, quant_method="awq"),
    "int4_gptq_float_tables": dict(weight_bits=4, quant_method="gptq"),
    # the tied table in INT8 at block 128: +9.1% bytes over all-INT4 on the gpu preset
    # (block 32: +11.8%), INT8's rounding is small either way
    "int4_rtn_int8_tables_b128": dict(weight_bits=4, embedding_bits=8, embedding_block_size=128),
    "int4_gptq_int8_tables_b128": dict(
        weight_bits=4, embedding_bits=8, embedding_block_size=128, quant_method="gptq"
    ),
    # mixed precision by name within about +10% bytes of all-INT4 (what an automatic choice
    # by measured sensitivity would have to beat)
    "int4_gptq_int8_kv": dict(
        weight_bits=4,
        embedding_bits=4,
        quant_method="gptq",
        keep_int8=("layers.*.self_attn.k_proj.weight", "layers.*.self_attn.v_proj.weight"),
    ),
    "int4_gptq_int8_layer0": dict(
        weight_bits=4, embedding_bits=4, quant_method="gptq", keep_int8=("layers.0.*",)
    ),
    # mixed precision by measured sensitivity (engine.sensitivity) within +10% bytes of the
    # all-INT4 package, and toward half of all-INT4 GPTQ's predicted KLD
    "int4_rtn_budget_10pct": dict(weight_bits=4, embedding_bits=4, size_budget_ratio=1.10),
    "int4_gptq_budget_10pct": dict(
        weight_bits=4, embedding_bits=4, quant_method="gptq", size_budget_ratio=1.10
    ),
    "int4_gptq_budget_20pct": dict(
        weight_bits=4, embedding_bits=4, quant_method="gptq", size_budget_ratio=1.20
    ),
}
"""Calibrated choices (``gptq``, ``awq``, ``awq-gptq``, size budgets) calibrate on the
training text (``calibration.txt``, never the held-out text they are scored on)."""
"""Each quantization choice, as ExportOptions fields (block 32 unless named)."""


def corpus() -> tuple[str, str, dict[str, int]]:
    """Training and held-out text from the standard library's ``.py`` files, split by a
    hash of each file's path relative to the library (the same split on every machine
    with the same Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train: list[str] = []
    held: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or rel.startswith(("test/", "idlelib/", "lib2to3/tests")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        bucket = hashlib.sha256(rel.encode()).digest()[0]
        (held if bucket < 13 else train).append(text)  # about 5 % held out
    stats = {"train_files": len(train), "held_out_files": len(held)}
    return "\n".join(train), "\n".join(held), stats


def train_tokenizer(text: str, vocab: int, out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<pad>", "<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bar writes blank lines to a stdout that is not a terminal
    )
    chunks = text.split("\n\n")
    tokenizer.train_from_iterator(chunks, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    fast.save_pretrained(out)
    return tokenizer


def train_model(ids: np.ndarray, size: dict[str, Any], out: Path, seed: int) -> dict[str, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = Qwen3Config(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["mlp"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        head_dim=size["head_dim"],
        max_position_embeddings=max(512, 2 * size["seq"]),
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )
    model = Qwen3ForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=size["lr"], weight_decay=0.1)
    steps, seq, batch = size["steps"], size["seq"], size["batch"]
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=size["lr"], total_steps=steps, pct_start=0.05
    )
    generator = np.random.default_rng(seed)
    data = torch.from_numpy(ids.astype(np.int64))
    losses = []
    started = time.perf_counter()
    model.train()
    for _ in range(steps):
        starts = generator.integers(0, len(data) - seq - 1, size=batch)
        x = torch.stack([data[s : s + seq] for s in starts]).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval().to("cpu").float()
    model.save_pretrained(out)
    return {
        "device": device,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(time.perf_counter() - started, 1),
        "loss_first_50": round(float(np.mean(losses[:50])), 3),
        "loss_last_50": round(float(np.mean(losses[-50:])), 3),
        "model": model,
    }


CUDA_CHOICES: dict[str, dict[str, Any]] = {
    "cuda_fp32": dict(dtype="fp32"),
    "cuda_fp16": dict(dtype="fp16"),
    "cuda_bf16": dict(dtype="bf16"),
    "cuda_int8": dict(dtype="fp16", weight_bits=8, embedding_bits=8),
    "cuda_int4": dict(dtype="fp16", weight_bits=4, embedding_bits=4),
    "cuda_int4_fp32": dict(dtype="fp32", weight_bits=4, embedding_bits=4),
}
"""``--cuda``: packages for the CUDA EP, run on it (onnxruntime-gpu), each scored against the
CPU fp32 package; their defaults (accuracy_level 4 for INT4) as a user gets them."""
WEBGPU_CHOICES: dict[str, dict[str, Any]] = {
    "webgpu_fp32": dict(dtype="fp32"),
    "webgpu_fp16": dict(),
    "webgpu_int4": dict(weight_bits=4, embedding_bits=4),
    "webgpu_int4_acc0": dict(weight_bits=4, embedding_bits=4, accuracy_level=0),
    "webgpu_int4_fp32": dict(dtype="fp32", weight_bits=4, embedding_bits=4),
    "webgpu_int4_fp32_acc0": dict(dtype="fp32", weight_bits=4, embedding_bits=4, accuracy_level=0),
    "webgpu_int4_sym": dict(weight_bits=4, embedding_bits=4, symmetric=True),
}
"""``--webgpu``: packages for WebGPU (fp16 activations and accuracy_level 4, int8
activations in MatMulNBits, unless named), run on the WebGPU EP (the plugin; lavapipe
without a GPU) and scored against the CPU fp32 package."""
_KV_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def prefill_logits(package: Path, sequences: list[np.ndarray], ep: str = "cpu") -> list[np.ndarray]:
    """Logits [S, V] of every position of each sequence, one prefill per sequence."""
    import onnxruntime as ort

    providers: list[Any] = ["CPUExecutionProvider"]
    if ep == "cuda":
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        providers.insert(0, ("CUDAExecutionProvider", {"use_tf32": "0"}))
    if ep == "webgpu":  # a plugin EP: the engine registers it and picks its device
        from engine.runtime.session import create_session

        session = create_session(package / "model.onnx", "webgpu", profile_first_run=False).session
    else:
        session = ort.InferenceSession(str(package / "model.onnx"), providers=providers)
    if ep == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise RuntimeError(f"the CUDA EP did not start: {session.get_providers()}")
    inputs = {i.name: i for i in session.get_inputs()}
    search = json.loads((package / "genai_config.json").read_text())["search"]
    length = search["max_length"] if search.get("past_present_share_buffer") else 0
    out = []
    for seq in sequences:
        index = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
        feeds: dict[str, np.ndarray] = {
            "input_ids": seq[None].astype(index),
            "attention_mask": np.ones((1, len(seq)), index),
        }
        for name, info in inputs.items():
            if name.startswith("past_key_values"):
                shape = (1, info.shape[1], length, info.shape[3])
                if info.type == "tensor(bfloat16)":
                    import ml_dtypes

                    feeds[name] = np.zeros(shape, ml_dtypes.bfloat16)
                else:
                    feeds[name] = np.zeros(shape, _KV_TYPES[info.type])
        out.append(session.run(["logits"], feeds)[0][0].astype(np.float64))
    return out


def score(
    reference: list[np.ndarray], logits: list[np.ndarray], sequences: list[np.ndarray]
) -> dict[str, float]:
    from engine.runtime.quality import log_softmax

    kld, agree, nll, count = 0.0, 0, 0.0, 0
    for ref, got, seq in zip(reference, logits, sequences, strict=True):
        p_log, q_log = log_softmax(ref[:-1]), log_softmax(got[:-1])
        kld += float((np.exp(p_log) * (p_log - q_log)).sum())
        agree += int((ref[:-1].argmax(-1) == got[:-1].argmax(-1)).sum())
        nll -= float(q_log[np.arange(len(seq) - 1), seq[1:]].sum())
        count += len(seq) - 1
    return {
        "kld": kld / count,
        "top1": agree / count,
        "ppl": math.exp(nll / count),
    }


def main() -> None:
    from engine.options import ExportOptions
    from engine.pipeline import export

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the checkpoint here")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="score a checkpoint kept by an earlier run (--keep) instead of training one",
    )
    parser.add_argument(
        "--cuda", action="store_true", help="also CUDA packages, run on the CUDA EP (GPU)"
    )
    parser.add_argument(
        "--webgpu",
        action="store_true",
        help="also WebGPU packages, run on the WebGPU EP (the plugin; lavapipe without a GPU)",
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated CHOICES to run (default: all of them)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE.NAME=VALUE",
        help="override a module constant for this run, for sweeps "
        "(e.g. engine.calibration.TABLE_LOOKUP=0.05; repeatable)",
    )
    args = parser.parse_args()
    for item in args.set:
        target, _, value = item.partition("=")
        module_name, _, attr = target.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            parser.error(f"--set {item}: no module {module_name!r}")
        if not value or not hasattr(module, attr):
            parser.error(f"--set {item}: give MODULE.NAME=VALUE for a constant that exists")
        setattr(module, attr, type(getattr(module, attr))(value))
    only = set(args.only.split(",")) if args.only else set(CHOICES)
    if only - set(CHOICES):
        parser.error(f"unknown choices: {', '.join(sorted(only - set(CHOICES)))}")
    size = dict(PRESETS[args.preset])
    if args.steps is not None:
        size["steps"] = args.steps
    report: dict[str, Any] = {"preset": args.preset, "size": size, "seed": args.seed}
    if args.set:
        report["overrides"] = args.set
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = args.checkpoint or args.keep or root / "reference"
        checkpoint.mkdir(parents=True, exist_ok=True)
        train_text, held_text, stats = corpus()
        report["corpus"] = {**stats, "train_chars": len(train_text), "held_chars": len(held_text)}
        started = time.perf_counter()
        if args.checkpoint is not None:
            from tokenizers import Tokenizer
            from transformers import AutoModelForCausalLM

            tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
            model = AutoModelForCausalLM.from_pretrained(checkpoint).eval().float()
            report["training"] = {"checkpoint": str(checkpoint)}
        else:
            tokenizer = train_tokenizer(train_text, size["vocab"], checkpoint)
            report["tokenizer_seconds"] = round(time.perf_counter() - started, 1)
        train_ids = np.array(tokenizer.encode(train_text).ids, dtype=np.int32)
        held_ids = np.array(tokenizer.encode(held_text).ids, dtype=np.int32)
        report["corpus"].update(train_tokens=len(train_ids), held_tokens=len(held_ids))
        if args.checkpoint is None:
            trained = train_model(train_ids, size, checkpoint, args.seed)
            model = trained.pop("model")
            report["training"] = trained
        seq, count = size["seq"], size["eval_sequences"]
        stride = max(seq, (len(held_ids) - seq) // count)
        sequences = [held_ids[i * stride : i * stride + seq] for i in range(count)]
        report["eval"] = {"sequences": count, "tokens_each": seq}

        import torch

        with torch.no_grad():
            hf = [
                model(input_ids=torch.from_numpy(s[None].astype(np.int64)))
                .logits[0]
                .double()
                .numpy()
                for s in sequences
            ]
        packages: dict[str, Any] = {}
        base = dict(ep="cpu", dtype="fp32", accuracy_level=0)
        float_dir = root / "float"
        started = time.perf_counter()
        result = export(float_dir, model_dir=checkpoint, options=ExportOptions(**base))
        float_seconds = time.perf_counter() - started
        reference = prefill_logits(float_dir, sequences)
        packages["float"] = {
            **score(reference, reference, sequences),
            "bytes": result.plan.nbytes,
            "export_seconds": round(float_seconds, 2),
        }
        packages["float"]["max_abs_vs_transformers"] = max(
            float(np.abs(a - b).max()) for a, b in zip(hf, reference, strict=True)
        )
        packages["transformers"] = score(reference, hf, sequences)
        calibration = root / "calibration.txt"
        calibration.write_text(train_text[:400_000], encoding="utf-8")
        for name, choice in CHOICES.items():
            if name not in only:
                continue
            out = root / name
            started = time.perf_counter()
            calibrated = choice.get("quant_method") in ("gptq", "awq", "awq-gptq")
            if calibrated or "size_budget_ratio" in choice:
                choice = {**choice, "calibration": str(calibration)}
            if "size_budget_ratio" in choice:  # of the same choice's all-INT4 package
                from engine.models import load_spec
                from engine.plan import plan

                ratio = choice.pop("size_budget_ratio")
                plain = {k: v for k, v in choice.items() if k != "calibration"}
                all_int4 = plan(load_spec(checkpoint), ExportOptions(**base, **plain)).nbytes
                choice = {**choice, "size_budget": int(all_int4 * ratio)}
            result = export(out, model_dir=checkpoint, options=ExportOptions(**base, **choice))
            seconds = time.perf_counter() - started
            packages[name] = {
                **score(reference, prefill_logits(out, sequences), sequences),
                "bytes": result.plan.nbytes,
                "export_seconds": round(seconds, 2),
            }
            calibrated_notes = [n for n in result.notes if n.startswith(("AWQ", "GPTQ"))]
            if calibrated_notes:
                packages[name]["notes"] = calibrated_notes
        devices = [("cuda", CUDA_CHOICES)] if args.cuda else []
        devices += [("webgpu", WEBGPU_CHOICES)] if args.webgpu else []
        for ep, name, choice in ((e, n, c) for e, cs in devices for n, c in cs.items()):
            out = root / name
            try:
                result = export(out, model_dir=checkpoint, options=ExportOptions(ep=ep, **choice))
                logits = prefill_logits(out, sequences, ep)
            except Exception as exc:  # one failing choice must not hide the others
                packages[name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
                continue
            packages[name] = {**score(reference, logits, sequences), "bytes": result.plan.nbytes}
            packages[name]["max_abs_vs_float"] = max(
                float(np.abs(a - b).max()) for a, b in zip(reference, logits, strict=True)
            )
        float_bytes = packages["float"]["bytes"]
        for entry in packages.values():
            if "bytes" in entry:
                entry["bytes_vs_float"] = round(entry["bytes"] / float_bytes, 3)
            for key in ("kld", "top1", "ppl"):
                if key in entry:
                    entry[key] = round(entry[key], 5)
        report["packages"] = packages
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
