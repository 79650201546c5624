"""The vision session against transformers 5.24's ``Gemma4Model.get_image_features``.

Tiny ``Gemma4ForConditionalGeneration`` checkpoints are built offline; each image is fed
the way onnxruntime-genai 0.18 feeds it (one image per run, ``pixel_values`` float32
[1, N, 768], ``pixel_position_ids`` [1, N, 2]) and the session's ``image_features`` must be
exactly that image's tokens.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from engine.caps import list_eps
from engine.dtypes import ir_dtype
from engine.options import ExportOptions
from engine.pipeline import ExportResult, export
from engine.quantize import QuantizedBlocks, dequantize
from tests._support.structure import structural_proto
from tests._support.tiny_gemma_mm import make_mm_checkpoint, random_patches
from tests.engine.test_plan_package import SMALL_CONSTANT_BYTES, stored_initializers
from tests.engine.test_webgpu import _clean_env, _setup_hint, run_webgpu, webgpu_python

VISION_ONLY = ("text", "vision")
FP32_TOL = 1e-4
CONFIGS: dict[str, dict[str, Any]] = {
    # tiny_gemma_mm's default tower: clipped linears, 2 heads = 2 KV heads, head_dim 16.
    "clipped": {},
    "standardized_gqa": dict(
        use_clipped_linears=False,
        standardize=True,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    ),
    "mqa_clipped_standardized": dict(
        standardize=True,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        num_hidden_layers=3,
        hidden_activation="gelu",
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 50.0},
    ),
}


@dataclass(frozen=True)
class Batch:
    """Images given to transformers in one call (padded to a common length), which the
    session runs one at a time."""

    name: str
    grids: tuple[tuple[int, int], ...]
    """(width, height) in patches, multiples of the pooling kernel."""
    pad_to: int | None = None


BATCHES = (
    Batch("wide_unpadded", ((24, 3),)),  # x positions past 16: two RoPE digits
    Batch("tall_unpadded", ((3, 9),)),
    Batch("two_sizes_padded", ((6, 6), (3, 9)), pad_to=45),
    Batch("one_padded", ((9, 6),), pad_to=63),
)


def images(batch: Batch, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """pixel_values [B, N, 768] and pixel_position_ids [B, N, 2] of a batch."""
    rng = np.random.default_rng(seed)
    pairs = [random_patches(rng, w, h, batch.pad_to) for w, h in batch.grids]
    return np.concatenate([p for p, _ in pairs]), np.concatenate([q for _, q in pairs])


# ------------------------------------------------------------------------------ fixtures


class Models:
    """Tiny multimodal checkpoints (no audio tower) and their packages, built once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, tuple[Path, Any]] = {}
        self._exports: dict[tuple[str, ExportOptions], ExportResult] = {}

    def get(self, name: str) -> tuple[Path, Any]:
        if name not in self._models:
            import torch

            path = self.root / name
            model = make_mm_checkpoint(path, vision=CONFIGS[name], audio=False)
            if model.config.vision_config.standardize:
                # The checkpoint's std_bias / std_scale buffers: make them matter.
                tower = model.model.vision_tower
                with torch.no_grad():
                    tower.std_bias.copy_(0.5 * torch.randn_like(tower.std_bias))
                    tower.std_scale.copy_(1.0 + 0.3 * torch.randn_like(tower.std_scale))
                model.save_pretrained(path)
            self._models[name] = (path, model)
        return self._models[name]

    def export(self, name: str, options: ExportOptions) -> ExportResult:
        key = (name, options)
        if key not in self._exports:
            path, _ = self.get(name)
            out = self.root / f"pkg{len(self._exports)}"
            self._exports[key] = export(out, model_dir=path, options=options)
        return self._exports[key]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("vision_models"))


def options(**extra: Any) -> ExportOptions:
    return ExportOptions(**{"ep": "cpu", "dtype": "fp32", "modalities": VISION_ONLY, **extra})


# ------------------------------------------------------------------------------ helpers


def hf_features(model: Any, batch: Batch) -> list[np.ndarray]:
    """transformers' features per image, float32."""
    import torch

    pixels, positions = images(batch)
    with torch.no_grad():
        out = model.model.get_image_features(
            torch.from_numpy(pixels).to(model.dtype),
            image_position_ids=torch.from_numpy(positions),
        )
    return [t.float().numpy() for t in out.pooler_output]


def session(package: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(package / "vision.onnx"), providers=["CPUExecutionProvider"])


def feeds(sess: Any, batch: Batch) -> list[dict[str, np.ndarray]]:
    """One feed per image, in the dtypes the session declares."""
    pixels, positions = images(batch)
    types = {i.name: i.type for i in sess.get_inputs()}
    index = np.int32 if types["pixel_position_ids"] == "tensor(int32)" else np.int64
    return [
        {
            "pixel_values": pixels[i : i + 1],
            "pixel_position_ids": positions[i : i + 1].astype(index),
        }
        for i in range(len(batch.grids))
    ]


def run_features(package: Path, batch: Batch) -> list[np.ndarray]:
    sess = session(package)
    return [sess.run(None, feed)[0] for feed in feeds(sess, batch)]


def max_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    assert [g.shape for g in got] == [w.shape for w in want]
    return max(
        float(np.abs(g.astype(np.float32) - w).max()) for g, w in zip(got, want, strict=True)
    )


def vision_weights(result: ExportResult) -> dict[str, np.ndarray]:
    """Every quantized weight of the vision session, dequantized to float32 [out, in], by
    checkpoint key."""
    proto = onnx.load(str(result.output / "vision.onnx"))
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    out = {}
    for wp in result.plan.session("vision").weights:
        if not wp.quantized:
            continue
        assert wp.bits is not None and wp.block_size is not None and wp.weight.source
        rows, cols = wp.weight.shape
        blocks = cols // wp.block_size
        parts = {t.part: arrays[t.name] for t in wp.pieces[0].tensors}
        packed = QuantizedBlocks(
            parts["qweight"].reshape(rows, -1),
            parts["scales"].reshape(rows, blocks),
            parts["zero_points"],
        )
        out[wp.weight.source] = dequantize(packed, bits=wp.bits, block_size=wp.block_size)
    return out


# ---------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp32_features_match_transformers(models: Models, name: str):
    _, model = models.get(name)
    package = models.export(name, options()).output
    errors = {}
    for batch in BATCHES:
        want = hf_features(model, batch)
        got = run_features(package, batch)
        for image, (g, w) in enumerate(zip(got, want, strict=True)):
            width, height = batch.grids[image]
            k = model.config.vision_config.pooling_kernel_size
            assert g.shape == (width * height // k**2, model.config.text_config.hidden_size)
            assert w.shape == g.shape
        errors[batch.name] = max_error(got, want)
    print(json.dumps({name: errors}))
    assert max(errors.values()) <= FP32_TOL, errors


def test_session_io_is_what_genai_feeds(models: Models):
    """genai 0.18 converts pixel_values / pixel_position_ids to the dtypes the graph
    declares: float32 pixels everywhere (transformers scales them before casting), int64
    positions where int64 arithmetic stays on the device, int32 on WebGPU."""
    expected = {
        ("cpu", "fp32"): ("tensor(int64)", "tensor(float)"),
        ("cpu", "fp16"): ("tensor(int64)", "tensor(float16)"),
        ("webgpu", "fp16"): ("tensor(int32)", "tensor(float16)"),
    }
    for (ep, dtype), (index, out) in expected.items():
        result = models.export("clipped", options(ep=ep, dtype=dtype))
        sess = session(result.output)
        inputs = {i.name: (i.type, i.shape) for i in sess.get_inputs()}
        assert inputs == {
            "pixel_values": ("tensor(float)", [1, "num_patches", 768]),
            "pixel_position_ids": (index, [1, "num_patches", 2]),
        }
        (output,) = sess.get_outputs()
        assert (output.name, output.type, output.shape) == (
            "image_features",
            out,
            ["num_image_tokens", 64],
        )


def test_fp16_features_as_close_as_transformers_in_fp16(models: Models):
    """The fp16 package against float32 transformers, next to transformers' own fp16 run."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    path, model = models.get("clipped")
    half = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float16).eval()
    package = models.export("clipped", options(dtype="fp16")).output
    for batch in BATCHES:
        want = hf_features(model, batch)
        ours = max_error(run_features(package, batch), want)
        theirs = max_error(hf_features(half, batch), want)
        print(json.dumps({batch.name: {"package_fp16": ours, "transformers_fp16": theirs}}))
        assert ours <= 2 * theirs + 1e-3, (ours, theirs)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_weights_equal_transformers_on_dequantized_weights(models: Models, bits: int):
    """MatMulNBits (accuracy level 0: float32 activations) computes exactly what
    transformers computes with the package's dequantized weights."""
    import copy

    import torch

    _, model = models.get("standardized_gqa")
    result = models.export(
        "standardized_gqa", options(weight_bits=bits, block_size=16, accuracy_level=0)
    )
    restored = vision_weights(result)
    linears = [n for n, p in model.named_parameters() if "vision" in n and p.dim() == 2]
    assert sorted(restored) == sorted(linears)
    dequantized = copy.deepcopy(model)
    params = dict(dequantized.named_parameters())
    with torch.no_grad():
        for key, array in restored.items():
            params[key].copy_(torch.from_numpy(array))
    for batch in BATCHES:
        got = run_features(result.output, batch)
        error = max_error(got, hf_features(dequantized, batch))
        drift = max_error(got, hf_features(model, batch))
        print(
            json.dumps({f"int{bits}": {batch.name: {"vs_dequantized": error, "vs_float": drift}}})
        )
        assert error <= FP32_TOL


def test_attention_in_kv_head_chunks_matches(models: Models):
    """A buffer limit below one KV head's scores at the largest image splits attention per
    KV head; the features do not change."""
    _, model = models.get("standardized_gqa")
    # Scores of one KV head (2 query heads) at 280 tokens x 9 patches: 50.8 MB float32.
    limited = options(max_buffer_size=40_000_000)
    result = models.export("standardized_gqa", limited)
    proto = onnx.load(str(result.output / "vision.onnx"), load_external_data=False)
    softmaxes = sum(node.op_type == "Softmax" for node in proto.graph.node)
    assert softmaxes == 2 * 2  # 2 layers x 2 KV heads
    for batch in BATCHES:
        assert max_error(run_features(result.output, batch), hf_features(model, batch)) <= FP32_TOL


@pytest.mark.parametrize(
    "extra",
    [
        dict(),
        dict(weight_bits=4, block_size=16),
        dict(ep="webgpu", dtype="fp16", weight_bits=8, block_size=16),
    ],
    ids=["float", "int4", "webgpu-fp16-int8"],
)
def test_written_vision_initializers_match_the_plan(models: Models, extra: dict[str, Any]):
    result = models.export("mqa_clipped_standardized", options(**extra))
    vision = result.plan.session("vision")
    stored = stored_initializers(result.output / "vision.onnx")
    planned = {t.name: t for t in vision.tensors()}
    for name, tensor in planned.items():
        data_type, shape, nbytes, _ = stored[name]
        assert (data_type, shape, nbytes) == (
            ir_dtype(tensor.dtype).value,
            tensor.shape,
            tensor.nbytes,
        )
    extra_tensors = {n: v[2] for n, v in stored.items() if n not in planned}
    assert all(size <= SMALL_CONSTANT_BYTES for size in extra_tensors.values()), extra_tensors
    assert sum(stored[name][2] for name in planned) == vision.nbytes
    assert result.files["vision.onnx.data"] == sum(v[2] for v in stored.values() if v[3])


def test_webgpu_vision_session_keeps_graph_capture_off(models: Models):
    """The token count is read from the positions at run time (a Slice), so the audit
    refuses capture for this session whatever the decoder gets."""
    result = models.export("clipped", options(ep="webgpu", dtype="fp32"))
    assert result.capture["vision"] is False
    assert result.capture["decoder"] is True
    assert any(n.startswith("vision: graph capture off: Slice") for n in result.notes), result.notes


# ------------------------------------------------------------------------------ full size

E2B_CONFIG = Path(__file__).parent / "data" / "gemma-4-E2B-it.config.json"
"""The public google/gemma-4-E2B-it config.json (transformers 5.5.0.dev0 wrote it)."""


@pytest.fixture(scope="module")
def e2b_spec(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.models import load_spec

    folder = tmp_path_factory.mktemp("e2b")
    (folder / "config.json").write_text(E2B_CONFIG.read_text())
    return load_spec(folder)


def test_e2b_vision_weights_are_transformers_state_dict(e2b_spec):
    """The planned vision weights of E2B have transformers' names and shapes, every one."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    from engine.plan import plan

    config = Gemma4Config(**json.loads(E2B_CONFIG.read_text()))
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(config)
    want = {
        key: tuple(value.shape)
        for key, value in model.state_dict().items()
        if key.startswith(("model.vision_tower.", "model.embed_vision."))
    }
    vision = plan(e2b_spec, ExportOptions(ep="webgpu", dtype="fp16")).session("vision")
    got = {wp.weight.source: wp.weight.shape for wp in vision.weights}
    assert got == want
    table = vision.weight("vision_tower.patch_embedder.position_embedding_table")
    assert table.weight.shape == (2, 10240, 768) and table.storage == "float"
    assert vision.nbytes == 2 * sum(math.prod(shape) for shape in want.values())


@pytest.mark.parametrize(
    "extra",
    [dict(), dict(weight_bits=4), dict(dtype="bf16"), dict(dtype="fp32", weight_bits=8)],
    ids=["default-dtype", "int4", "bf16", "fp32-int8"],
)
@pytest.mark.parametrize("ep", list_eps())
def test_e2b_vision_graph_passes_the_checker_on_every_ep(e2b_spec, ep: str, extra: dict):
    from engine.errors import OptionsError
    from engine.models import build_session
    from engine.plan import plan

    try:
        export_plan = plan(e2b_spec, ExportOptions(ep=ep, modalities=VISION_ONLY, **extra))
    except OptionsError as exc:
        # Only refusals an EP is documented to make (no bf16 on WebGPU, ...).
        assert "does not run" in str(exc) or "unavailable" in str(exc), exc
        return
    model = build_session(export_plan, "vision")
    inputs = {value.name: value.dtype for value in model.graph.inputs}
    index = ir.DataType.INT64 if export_plan.caps.int64_on_device else ir.DataType.INT32
    assert inputs == {"pixel_values": ir.DataType.FLOAT, "pixel_position_ids": index}
    (output,) = model.graph.outputs
    assert output.dtype == ir_dtype(export_plan.options.dtype or "fp32")
    onnx.checker.check_model(structural_proto(model), full_check=True)


@pytest.mark.slow
def test_e2b_vision_session_builds_and_runs(e2b_spec, tmp_path: Path):
    """Full-size E2B vision tower with random INT4 weights for WebGPU fp16: it passes the
    checker, opens in onnxruntime and gives one row per 3 x 3 patches."""
    import onnxruntime as ort

    from engine.models import build_session
    from engine.plan import plan
    from engine.weights.factory import TensorFactory
    from engine.weights.sources import RandomSource

    export_plan = plan(
        e2b_spec, ExportOptions(ep="webgpu", dtype="fp16", weight_bits=4, modalities=VISION_ONLY)
    )
    model = build_session(export_plan, "vision", TensorFactory(export_plan, RandomSource(0)))
    path = tmp_path / "vision.onnx"
    ir.save(model, path, external_data="vision.onnx.data")
    onnx.checker.check_model(str(path))
    vision = export_plan.session("vision")
    stored = stored_initializers(path)
    planned = {t.name: t.nbytes for t in vision.tensors()}
    assert {name: stored[name][2] for name in planned} == planned
    assert sum(planned.values()) == vision.nbytes == 119_877_504
    # Beyond the plan: graph constants (shapes, indices, the parameterless norms' ones),
    # the largest the two RoPE angle tables (4 digits x 16 x 16 frequencies, float32):
    # 17.7 KB in all.
    extras = {name: v[2] for name, v in stored.items() if name not in planned}
    assert max(extras.values()) == 4 * 16 * 16 * 4 and sum(extras.values()) < 20_000, extras
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batch = Batch("e2b", ((12, 9),))
    (features,) = [sess.run(None, feed)[0] for feed in feeds(sess, batch)]
    assert features.shape == (12, 1536) and features.dtype == np.float16
    assert np.isfinite(features.astype(np.float32)).all()


# ------------------------------------------------------------------------------ WebGPU

RUNNER = Path(__file__).resolve().parents[2] / "tests" / "webgpu" / "run_session.py"
LAVAPIPE_FP16_TOL = 0.05
"""WebGPU fp16 vs the CPU EP's fp16 on lavapipe. The WebGPU EP's fp16 MatMul accumulates
in fp16: one [18, 768] x [768, 32] MatMul is off by 0.02 (rounding alone: 0.001); the
tiny tower measured 0.025."""


@pytest.fixture(scope="module")
def webgpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WebGPU environment's python, with a working adapter (as tests/engine/test_webgpu.py
    requires it: missing means failed, not skipped)."""
    python = webgpu_python()
    if not python.exists():
        pytest.fail(f"{python} does not exist: {_setup_hint(python)}")
    report = run_webgpu(python, ["probe"], tmp_path_factory.mktemp("probe") / "probe.json")
    if not report.get("adapter_ok"):
        pytest.fail(f"{_setup_hint(python)}\nprobe said: {json.dumps(report, indent=1)}")
    return python


@pytest.mark.webgpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_every_vision_node_on_webgpu_and_features_match_cpu(
    models: Models, webgpu: Path, tmp_path: Path, dtype: str
):
    result = models.export("clipped", options(ep="webgpu", dtype=dtype))
    package = result.output
    sess = session(package)
    cases = {batch.name: feeds(sess, batch) for batch in BATCHES}
    arrays = {
        f"{name}.{i}/{key}": value
        for name, per_image in cases.items()
        for i, feed in enumerate(per_image)
        for key, value in feed.items()
    }
    np.savez(tmp_path / "feeds.npz", **arrays)
    report_path = tmp_path / "report.json"
    cmd = [
        str(webgpu),
        str(RUNNER),
        str(package / "vision.onnx"),
        str(tmp_path / "feeds.npz"),
        str(tmp_path / "out.npz"),
        "--json-out",
        str(report_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_clean_env())
    assert report_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    placement = report["placement"]
    assert placement["strict_ok"], placement.get("strict_error")
    assert placement["cpu_nodes"] == [], placement
    assert list(placement["nodes_by_provider"]) == ["WebGpuExecutionProvider"], placement
    outputs = dict(np.load(tmp_path / "out.npz"))
    tol = FP32_TOL if dtype == "fp32" else LAVAPIPE_FP16_TOL
    errors = {}
    for name, per_image in cases.items():
        for i, feed in enumerate(per_image):
            key = f"{name}.{i}"
            assert "error" not in report["runs"][key], report["runs"][key]
            want = sess.run(None, feed)[0].astype(np.float32)
            got = outputs[f"{key}/image_features"].astype(np.float32)
            assert got.shape == want.shape
            errors[key] = float(np.abs(got - want).max())
    print(json.dumps({dtype: {"nodes": placement["nodes_by_provider"], "errors": errors}}))
    assert max(errors.values()) <= tol, errors
