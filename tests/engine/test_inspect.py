"""The package inspector reads any ONNX package's initializers without loading their data."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.errors import PackageError
from engine.inspect import inspect_package, read_session
from engine.options import ExportOptions
from engine.pipeline import export

FOREIGN_PACKAGE = Path(__file__).parent / "data" / "genai-builder-llama-int4"


def _foreign_model(folder: Path, big: int = 0) -> Path:
    """A model as another exporter might write it: inline raw data, typed float_data,
    int4, int64 dims, an external tensor with offset and length, a contrib op."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    values = np.zeros((big, 16), np.float32) if big else rng.random((8, 16), dtype=np.float32)
    inline = numpy_helper.from_array(values, "inline.w")
    typed = helper.make_tensor("typed.w", TensorProto.FLOAT16, [4, 4], np.ones(16, np.float16))
    packed4 = helper.make_tensor("q.w", TensorProto.INT4, [3, 5], list(range(-7, 8)))
    external = numpy_helper.from_array(np.arange(96, dtype=np.int64).reshape(8, 12), "ext.w")
    data = external.raw_data
    (folder / "weights.bin").write_bytes(b"\0" * 64 + data)
    external.ClearField("raw_data")
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "64"), ("length", str(len(data)))):
        entry = external.external_data.add()
        entry.key, entry.value = key, value
    nodes = [
        helper.make_node("MatMul", ["x", "inline.w"], ["y"]),
        helper.make_node("FastGelu", ["y"], ["z"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, big or 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16])],
        initializer=[inline, typed, packed4, external],
    )
    model = helper.make_model(
        graph,
        producer_name="someone-else",
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_a_foreign_model_reads_exactly_like_onnx_reads_it(tmp_path):
    path = _foreign_model(tmp_path / "pkg")
    session = read_session(path)
    proto = onnx.load(str(path), load_external_data=False)
    assert [t.name for t in session.initializers] == [t.name for t in proto.graph.initializer]
    by_name = {t.name: t for t in session.initializers}
    assert by_name["inline.w"].shape == (8, 16) and by_name["inline.w"].dtype == "float32"
    assert by_name["inline.w"].nbytes == 8 * 16 * 4
    assert by_name["typed.w"].nbytes == 16 * 2  # stored in int32_data, sized as float16
    assert by_name["q.w"].dtype == "int4" and by_name["q.w"].nbytes == 8  # 15 nibbles
    assert by_name["ext.w"].location == "weights.bin" and by_name["ext.w"].nbytes == 96 * 8
    assert session.op_counts == {"MatMul": 1, "com.microsoft::FastGelu": 1}
    assert session.inputs == ("x",) and session.outputs == ("z",)
    assert session.opsets == {"ai.onnx": 21, "com.microsoft": 1}
    assert session.producer == "someone-else"
    info = inspect_package(tmp_path / "pkg")  # no genai_config: the .onnx files are sessions
    assert [s.name for s in info.sessions] == ["model"]
    assert info.producer == "someone-else" and info.ep is None and info.problems == ()


def test_weight_data_is_skipped_not_read(tmp_path):
    """64 MiB of inline weights: the inspector allocates a tiny fraction of that."""
    path = _foreign_model(tmp_path / "big", big=1024 * 1024)
    assert path.stat().st_size > 64 * 1024**2
    tracemalloc.start()
    session = read_session(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert session.initializers[0].nbytes == 1024 * 1024 * 16 * 4
    assert peak < 1024**2, f"{peak:,} bytes allocated while inspecting"


def test_our_package_sessions_splits_and_sizes(tmp_path):
    # Block size 16: WebGPU reads 4-bit table rows of an even block count only. So small a
    # limit leaves linear weights over it (forced), the tables split.
    options = ExportOptions(
        ep="webgpu",
        embedding_bits=4,
        block_size=16,
        max_buffer_size=16 * 1024,
        force=True,
        random_weights=True,
    )
    result = export(tmp_path / "pkg", preset="gemma4-tiny", options=options)
    info = inspect_package(result.output)
    assert info.producer == "export-studio" and info.ep == "webgpu"
    decoder = info.sessions[0]
    assert decoder.name == "decoder" and decoder.filename == "model.onnx"
    planned = {t.name: t for t in result.plan.decoder.tensors()}
    stored = {t.name: t for t in decoder.initializers}
    for name, tensor in planned.items():  # every planned tensor, as planned
        assert stored[name].shape == tensor.shape, name
        assert stored[name].nbytes == tensor.nbytes, name
    external = sum(t.nbytes for t in decoder.initializers if t.location)
    assert external == info.files["model.onnx.data"]
    split = {g.base: g for g in decoder.splits()}
    expected = [w for w in result.plan.decoder.weights if w.is_split and not w.shares]
    assert set(split) == {w.name for w in expected}
    for w in expected:
        assert split[w.name].pieces == len(w.pieces)
        assert split[w.name].largest == max(p.largest_buffer for p in w.pieces)


def test_our_runner_benchmarks_a_package_from_the_genai_model_builder():
    """The builder names its KV head dim ``kv_cache_dim`` (symbolic): the runner takes the
    KV heads and head size from genai_config.json instead of refusing, and generates what
    onnxruntime-genai generates (issue 23: the Inspector's Benchmark of such a package)."""
    from engine.runtime.bench import bench
    from engine.runtime.runner import greedy_tokens
    from tests._support.genai_loop import genai_greedy

    prompt = [5, 17, 42, 99, 7, 25, 31, 64, 12, 8]
    ours = greedy_tokens(FOREIGN_PACKAGE, prompt, 24)
    assert ours == genai_greedy(FOREIGN_PACKAGE, prompt, 24)
    assert len(set(ours)) > 3  # not one token repeated
    result = bench(FOREIGN_PACKAGE, prompt_length=8, new_tokens=8, repeats=1)
    assert result.decode_tokens_per_second > 0 and result.provider == "CPUExecutionProvider"


def test_a_symbolic_kv_dim_without_genai_config_says_what_to_do(tmp_path: Path):
    from engine.errors import RuntimeUnavailableError
    from engine.runtime.runner import Runner

    package = tmp_path / "pkg"
    package.mkdir()
    for item in FOREIGN_PACKAGE.iterdir():
        (package / item.name).symlink_to(item)
    (package / "genai_config.json").unlink()
    config = json.loads((FOREIGN_PACKAGE / "genai_config.json").read_text())
    del config["model"]["decoder"]["head_size"]
    (package / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeUnavailableError, match=r"decoder\.head_size.*--runtime genai"):
        Runner(package)


def test_a_package_from_the_genai_model_builder():
    """Another exporter's package: onnxruntime-genai's builder on a tiny random Llama
    (tests/engine/data/make_foreign_package.py made it)."""
    folder = FOREIGN_PACKAGE
    info = inspect_package(folder)
    assert info.producer == "onnxruntime-genai" and info.ep == "cpu"
    config = json.loads((folder / "genai_config.json").read_text())
    assert [s.filename for s in info.sessions] == [config["model"]["decoder"]["filename"]]
    decoder = info.sessions[0]
    assert decoder.op_counts.get("com.microsoft::MatMulNBits", 0) > 0
    assert "uint8" in decoder.by_dtype()  # the 4-bit weights
    proto = onnx.load(str(folder / decoder.filename), load_external_data=False)
    assert len(decoder.initializers) == len(proto.graph.initializer)
    assert {t.name: t.shape for t in decoder.initializers} == {
        t.name: tuple(t.dims) for t in proto.graph.initializer
    }
    external = sum(t.nbytes for t in decoder.initializers if t.location)
    data_files = {t.location for t in decoder.initializers if t.location}
    assert data_files and external == sum(info.files[f] for f in data_files)
    assert decoder.splits() == ()


def test_what_is_wrong_with_a_folder_is_said(tmp_path):
    with pytest.raises(PackageError, match="is not a folder"):
        inspect_package(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackageError, match=r"holds no \.onnx file"):
        inspect_package(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"\xff" * 64)
    with pytest.raises(PackageError, match="not a readable ONNX model"):
        inspect_package(broken)
    path = _foreign_model(tmp_path / "lost")
    (path.parent / "weights.bin").unlink()
    config = {"model": {"decoder": {"filename": "model.onnx"}, "vision": {"filename": "v.onnx"}}}
    (path.parent / "genai_config.json").write_text(json.dumps(config))
    info = inspect_package(path.parent)
    assert [s.name for s in info.sessions] == ["decoder"]
    assert any("v.onnx" in p for p in info.problems)
    assert any("weights.bin" in p and "missing" in p for p in info.problems)
