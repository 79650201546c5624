"""Initializers are streamed in row chunks: same bytes as a whole-tensor save, any chunk
size, every storage (float, transposed, quantized, split along either axis)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from engine.errors import CancelledError
from engine.logical import RopeTable
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from engine.presets import load_preset
from engine.progress import CancelToken
from engine.weights import factory as factory_module
from engine.weights import stream_writer
from engine.weights.checkpoint import Checkpoint
from engine.weights.factory import TensorFactory
from engine.weights.sources import RandomSource

OPTIONS = {
    "float": dict(ep="cpu"),
    # Limits this small leave some tensors over them (written anyway: --force) to split the rest.
    "split-float": dict(ep="webgpu", dtype="fp32", max_buffer_size=40_000, force=True),
    "int4": dict(ep="cpu", weight_bits=4, embedding_bits=4, block_size=16),
    "split-int8-sym": dict(
        ep="webgpu",
        weight_bits=8,
        embedding_bits=8,
        block_size=16,
        symmetric=True,
        max_buffer_size=4096,
        force=True,
    ),
}


def digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.suffix in (".onnx", ".data")
    }


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_streamed_save_writes_what_onnx_ir_writes(tmp_path: Path, options):
    """The same model file and data file, byte for byte, as ``onnx_ir.save`` with whole
    tensors, serially and with workers."""
    export_plan = plan(load_preset("gemma4-tiny"), ExportOptions(**options))
    model = build_decoder(export_plan, TensorFactory(export_plan, RandomSource(5)))
    for folder in ("whole", "serial", "workers"):
        (tmp_path / folder).mkdir()
    ir.save(model, tmp_path / "whole" / "model.onnx", external_data="model.onnx.data")
    stream_writer.save(model, tmp_path / "serial" / "model.onnx", "model.onnx.data")
    stream_writer.save(model, tmp_path / "workers" / "model.onnx", "model.onnx.data", max_workers=3)
    whole = digest(tmp_path / "whole")
    assert set(whole) == {"model.onnx", "model.onnx.data"}
    assert digest(tmp_path / "serial") == whole
    assert digest(tmp_path / "workers") == whole


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_chunk_size_does_not_change_a_checkpoint_export(
    tiny_models, tmp_path: Path, monkeypatch, options
):
    """Chunks of 3 rows (quantized pieces, column pieces of split tables, RoPE caches)
    give the package that one chunk per tensor gives."""
    model_dir, _ = tiny_models.get("all_features")
    monkeypatch.setattr(factory_module, "CHUNK_ELEMENTS", 1 << 40)
    one = export(tmp_path / "one", model_dir=model_dir, options=ExportOptions(**options))
    monkeypatch.setattr(factory_module, "CHUNK_ELEMENTS", 3)
    many = export(tmp_path / "many", model_dir=model_dir, options=ExportOptions(**options))
    assert digest(many.output) == digest(one.output)


def test_streamed_chunks_are_bounded(tiny_models, monkeypatch):
    """No chunk of any part holds more source rows than the chunk budget allows."""
    model_dir, _ = tiny_models.get("all_features")
    from engine.models import load_spec
    from engine.weights.sources import CheckpointSource

    export_plan = plan(load_spec(model_dir), ExportOptions(ep="cpu", embedding_bits=4))
    monkeypatch.setattr(factory_module, "CHUNK_ELEMENTS", 64)
    source = CheckpointSource(
        model_dir, (w.weight for w in export_plan.decoder.weights), lambda key: True
    )
    factory = TensorFactory(export_plan, source)
    table = export_plan.decoder.weight("embed_tokens_per_layer.weight")
    width = table.weight.shape[1]
    sizes = [c["qweight"].shape[0] for c in factory.chunks(table, table.pieces[0])]
    assert max(sizes) == max(1, 64 // width)
    assert sum(sizes) == table.weight.shape[0]


def _rope_source(preset: str, name: str, **options) -> RopeTable:
    """The typed source of a planned RoPE cache (what the writer computes it from)."""
    computed = plan(load_preset(preset), ExportOptions(**options)).decoder.weight(name).weight
    assert isinstance(computed.computed, RopeTable), name
    return computed.computed


def test_rope_rows_match_the_whole_cache():
    spec = load_preset("gemma4-tiny")
    for name, kind, part in (("rope.sliding.cos_cache", "sliding", 0), ("rope.full.sin_cache",
                             "full", 1)):  # fmt: skip
        source = _rope_source("gemma4-tiny", name)
        head_dim = next(layer.head_dim for layer in spec.layers if layer.attention == kind)
        assert source.rope == spec.rope[kind] and source.head_dim == head_dim
        whole = spec.rope[kind].cos_sin(head_dim, 300)[part]
        rows = np.concatenate([source.rows(b, min(300, b + 7)) for b in range(0, 300, 7)])
        np.testing.assert_array_equal(rows, whole)


def test_rotated_rope_columns_padded_are_the_whole_cache():
    """A cache of only the rotated pairs (WebGPU's), padded with cos 1 / sin 0 as the graph
    does, is the full-width cache."""
    spec = load_preset("gemma4-e2b")
    rotated = spec.rope["full"].rotated_pairs(512)
    assert rotated == 64
    for name, part, fill in (("rope.full.cos_cache", 0, 1.0), ("rope.full.sin_cache", 1, 0.0)):
        source = _rope_source("gemma4-e2b", name, ep="webgpu", modalities=("text",))
        whole = spec.rope["full"].cos_sin(512, 300)[part]
        rows = source.rows(0, 300, cols=rotated)
        padded = np.pad(rows, ((0, 0), (0, whole.shape[1] - rotated)), constant_values=fill)
        np.testing.assert_array_equal(padded, whole)


def test_checkpoint_reads_a_block_of_a_column_slice(tmp_path: Path):
    from safetensors.numpy import save_file

    table = np.arange(7 * 12, dtype=np.float32).reshape(7, 12)
    save_file({"t": table}, str(tmp_path / "model.safetensors"))
    checkpoint = Checkpoint(tmp_path)
    np.testing.assert_array_equal(checkpoint.read("t", 1, 4, 8, rows=(2, 6)), table[2:6, 4:8])
    np.testing.assert_array_equal(checkpoint.read("t", 1, 4, 8), table[:, 4:8])


def test_a_cancel_stops_the_streamed_save(tmp_path: Path):
    export_plan = plan(load_preset("gemma4-tiny"), ExportOptions(ep="cpu"))
    cancel = CancelToken()
    model = build_decoder(export_plan, TensorFactory(export_plan, RandomSource(), cancel))
    seen = []

    def on_written(tensor: ir.TensorProtocol, nbytes: int) -> None:
        seen.append(nbytes)
        if len(seen) == 3:
            cancel.cancel()
        cancel.raise_if_cancelled()

    with pytest.raises(CancelledError):
        stream_writer.save(
            model, tmp_path / "model.onnx", "model.onnx.data", on_written=on_written, max_workers=2
        )
    assert len(seen) < 10
