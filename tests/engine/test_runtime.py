"""Opening packages, choosing providers and sampling: bad input gets a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.errors import OptionsError, PackageError, RuntimeUnavailableError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.runtime.package import IoNames, open_package
from engine.runtime.sampling import GREEDY, Sampler
from engine.runtime.session import (
    SessionHandle,
    available_providers,
    create_session,
    placement_from_profile,
    read_placement,
    require_provider,
)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runtime") / "pkg"
    export(out, preset="gemma4-tiny", options=ExportOptions(ep="cpu", random_weights=True))
    return out


@pytest.fixture()
def copy(package: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(package, target)
    return target


def test_open_package_reads_genai_config(package: Path):
    pkg = open_package(package)
    config = json.loads((package / "genai_config.json").read_text())
    assert pkg.decoder_file == package.absolute() / "model.onnx"
    assert pkg.model_type == "gemma4_text" and pkg.ep == "cpu" and pkg.dtype == "fp32"
    assert pkg.vocab_size == config["model"]["vocab_size"]
    assert pkg.share_buffer is config["search"]["past_present_share_buffer"] is True
    assert pkg.max_length == config["search"]["max_length"]
    assert pkg.eos_token_ids == (1,) and not pkg.quantized and not pkg.graph_capture


def test_missing_folder_is_reported(tmp_path: Path):
    with pytest.raises(PackageError, match=r"does not exist.*engine build"):
        open_package(tmp_path / "nowhere")


def test_a_file_is_not_a_package(tmp_path: Path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(PackageError, match="is a file, not a package folder"):
        open_package(tmp_path / "model.onnx")


def test_folder_without_genai_config_is_not_a_package(tmp_path: Path):
    with pytest.raises(PackageError, match=r"is not a package: it has no genai_config.json"):
        open_package(tmp_path)


def test_broken_genai_config_names_line_and_column(copy: Path):
    (copy / "genai_config.json").write_text('{"model": {,}}')
    with pytest.raises(PackageError, match=r"not valid JSON \(line 1, column 12"):
        open_package(copy)


def test_genai_config_without_decoder_section(copy: Path):
    (copy / "genai_config.json").write_text(json.dumps({"model": {"type": "gemma4_text"}}))
    with pytest.raises(PackageError, match=r"'model.decoder' section is missing"):
        open_package(copy)


def test_genai_config_naming_a_missing_onnx_file(copy: Path):
    (copy / "model.onnx").rename(copy / "renamed.onnx")
    with pytest.raises(PackageError, match=r"model.onnx \(model.decoder.filename\)"):
        open_package(copy)


def test_missing_external_data_is_reported_before_onnxruntime(copy: Path):
    (copy / "model.onnx.data").unlink()
    with pytest.raises(PackageError, match=r"model.onnx.data \(external data of model.onnx\)"):
        open_package(copy)


def test_io_names_map_past_to_present():
    io = IoNames()
    assert io.present_for("past_key_values.12.value") == "present.12.value"
    assert io.is_past("past_key_values.3.key") and not io.is_past("past_key_values.x.key")
    with pytest.raises(KeyError):
        io.present_for("input_ids")


def test_unknown_ep_name_is_an_options_error():
    with pytest.raises(OptionsError, match="unknown execution provider 'tpu'"):
        require_provider("tpu")


def test_absent_ep_is_refused_not_replaced_by_the_cpu(package: Path):
    assert "DmlExecutionProvider" not in available_providers()  # DirectML is Windows-only
    with pytest.raises(RuntimeUnavailableError, match=r"DirectML EP .* is not available.*--ep"):
        create_session(package / "model.onnx", "dml")


def test_graph_capture_on_the_cpu_is_refused(package: Path):
    with pytest.raises(OptionsError, match="graph capture is not available for CPU"):
        create_session(package / "model.onnx", "cpu", graph_capture=True)


def _node(name: str, provider: str, op: str) -> dict:
    return {
        "cat": "Node",
        "name": f"{name}_kernel_time",
        "args": {"provider": provider, "op_name": op},
    }


def test_placement_counts_nodes_per_provider_once():
    events = [
        _node("a", "WebGpuExecutionProvider", "MatMul"),
        _node("a", "WebGpuExecutionProvider", "MatMul"),  # a second run of the same node
        _node("b", "CPUExecutionProvider", "Shape"),
        {"cat": "Session", "name": "model_run", "args": {}},
    ]
    placement = placement_from_profile(events, "WebGpuExecutionProvider")
    assert placement.nodes == {"WebGpuExecutionProvider": 1, "CPUExecutionProvider": 1}
    assert placement.fallback_ops == {"Shape": 1}
    assert placement.provider == "WebGpuExecutionProvider" and not placement.all_on_requested


class _ProfiledSession:
    def __init__(self, path: Path) -> None:
        self.path = path

    def end_profiling(self) -> str:
        return str(self.path)


def test_an_ep_that_ran_nothing_is_an_error_not_cpu_numbers(tmp_path: Path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps([_node("a", "CPUExecutionProvider", "MatMul")]))
    handle = SessionHandle(
        session=_ProfiledSession(profile),
        ep="webgpu",
        provider="WebGpuExecutionProvider",
        device="webgpu",
        graph_capture=False,
        load_seconds=0.0,
        profiling=True,
    )
    with pytest.raises(RuntimeUnavailableError, match="ran none of the 1 nodes"):
        read_placement(handle)
    assert not profile.exists()


def test_cpu_session_reports_every_node_on_the_cpu(package: Path):
    from engine.runtime.runner import Runner

    runner = Runner(package)
    runner.generate([5, 6, 7], 2)
    assert runner.placement is not None and runner.placement.all_on_requested
    assert runner.provider == "CPUExecutionProvider"
    assert sum(runner.placement.nodes.values()) > 50


def test_greedy_picks_the_argmax():
    logits = np.array([0.1, 3.0, -1.0, 2.9], dtype=np.float32)
    assert GREEDY.pick(logits, GREEDY.rng()) == 1


def test_seeded_sampling_repeats_and_respects_top_k():
    logits = np.linspace(0.0, 1.0, 50).astype(np.float32)
    sampler = Sampler(temperature=1.0, top_k=5, seed=7)
    first = [sampler.pick(logits, rng) for rng in [sampler.rng()] for _ in range(30)]
    again = [sampler.pick(logits, rng) for rng in [sampler.rng()] for _ in range(30)]
    assert first == again
    assert set(first) <= set(range(45, 50)) and len(set(first)) > 1


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.6, 0.3, 0.05, 0.05]))
    sampler = Sampler(temperature=1.0, top_p=0.8, seed=0)
    rng = sampler.rng()
    assert {sampler.pick(logits, rng) for _ in range(200)} == {0, 1}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p")],
)
def test_bad_sampler_settings_are_refused(kwargs: dict, message: str):
    with pytest.raises(OptionsError, match=message):
        Sampler(**kwargs)


def test_genai_config_without_eos_opens(copy: Path):
    config = json.loads((copy / "genai_config.json").read_text())
    del config["model"]["eos_token_id"]
    (copy / "genai_config.json").write_text(json.dumps(config))
    assert open_package(copy).eos_token_ids == ()
