"""Capture-readiness audit: static rules by EP flags, the capture decision, placement logs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import onnx_ir as ir
import pytest

from engine.audit import (
    SessionAudit,
    audit_model,
    audit_package,
    decide_capture,
    parse_placements,
)
from engine.caps import get_caps
from engine.errors import OptionsError, PackageError
from engine.models import build_decoder
from engine.options import ExportOptions
from engine.pipeline import export
from engine.plan import plan
from engine.presets import load_preset
from engine.rewrites import apply_rewrites

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def graph(preset: str, rewrite: bool, **options) -> tuple[ir.Model, object]:
    export_plan = plan(load_preset(preset), ExportOptions(**options))
    model = build_decoder(export_plan)
    if rewrite:
        apply_rewrites(model, export_plan.caps)
    return model, export_plan


def test_graph_built_for_another_ep_names_every_webgpu_blocker():
    """CUDA's graph (the host total length's Shape), and the CPU lowering with the dynamic
    empty KV that WebGPU's rewrites replace (Shape -> ConstantOfShape)."""
    model, _ = graph("gemma4-tiny", rewrite=False, ep="cuda")
    audit = audit_model(model, get_caps("webgpu"))
    assert "Shape" in {f.op_type for f in audit.findings}
    assert not audit.capture_ready
    assert any("leaves the device" in r for r in audit.reasons())
    export_plan = plan(load_preset("gemma4-tiny"), ExportOptions(ep="cpu"))
    static = replace(export_plan.caps, capture_needs_static_graph=True)
    audit = audit_model(build_decoder(replace(export_plan, caps=static)), get_caps("webgpu"))
    assert {"Shape", "ConstantOfShape"} <= {f.op_type for f in audit.findings}


@pytest.mark.parametrize("preset", ["gemma4-tiny", "gemma4-e2b", "gemma4-e4b"])
def test_rewritten_webgpu_graph_is_capture_ready(preset: str):
    model, export_plan = graph(preset, rewrite=True, ep="webgpu", weight_bits=4, embedding_bits=4)
    audit = audit_model(model, export_plan.caps)
    assert audit.findings == () and audit.capture_ready
    for op in ("Shape", "ConstantOfShape", "Slice", "Squeeze"):
        assert audit.op_counts.get(op, 0) == 0


def test_int64_inputs_are_findings_on_an_ep_without_int64():
    model, _ = graph("gemma4-tiny", rewrite=True, ep="cpu")  # int64 I/O
    audit = audit_model(model, get_caps("webgpu"))
    assert any("int64" in f.reason for f in audit.findings)


def test_an_op_without_a_kernel_for_its_dtype_is_a_finding():
    """WebGPU 1.27 has a float CumSum but no int32 one (tests/webgpu/op_kernels.py)."""
    model = ir.from_onnx_text(
        """
        <ir_version: 10, opset_import: ["" : 23]>
        g (int32[1, 4] ids, float[1, 4] x) => (int32[1, 4] a, float[1, 4] b) {
            axis = Constant <value_int = 1> ()
            a = CumSum (ids, axis)
            b = CumSum (x, axis)
        }
        """
    )
    findings = audit_model(model, get_caps("webgpu"), "embedding").findings
    assert [(f.node, f.op_type) for f in findings] == [(model.graph.node(1).name, "CumSum")]
    assert "no kernel for CumSum on int32" in findings[0].reason
    assert audit_model(model, get_caps("cpu")).findings == ()


def test_cpu_has_no_capture_and_standard_attention_cannot_capture():
    model, export_plan = graph("gemma4-tiny", rewrite=True, ep="cpu")
    audit = audit_model(model, export_plan.caps)
    assert decide_capture(audit, True, "auto")[0] is False
    webgpu_model, webgpu_plan = graph("gemma4-tiny", rewrite=True, ep="webgpu")
    webgpu_audit = audit_model(webgpu_model, webgpu_plan.caps)
    assert decide_capture(webgpu_audit, True, "auto") == (True, [])
    assert decide_capture(webgpu_audit, True, "off")[0] is False
    capture, reasons = decide_capture(webgpu_audit, False, "auto")
    assert capture is False and "Concat" in reasons[0]
    with pytest.raises(OptionsError, match="cannot be switched on"):
        decide_capture(audit, True, "on")


def test_genai_config_sets_capture_per_session(tmp_path: Path):
    on = export(
        tmp_path / "on",
        preset="gemma4-tiny",
        options=ExportOptions(ep="webgpu", random_weights=True),
    )
    config = json.loads((on.output / "genai_config.json").read_text())
    webgpu = config["model"]["decoder"]["session_options"]["provider_options"][0]["webgpu"]
    assert webgpu["enableGraphCapture"] == "1" and on.graph_capture
    assert config["search"]["past_present_share_buffer"] is True
    assert config["search"]["max_length"] <= config["model"]["context_length"]
    off = export(
        tmp_path / "off",
        preset="gemma4-tiny",
        options=ExportOptions(ep="webgpu", random_weights=True, graph_capture="off"),
    )
    config = json.loads((off.output / "genai_config.json").read_text())
    assert (
        config["model"]["decoder"]["session_options"]["provider_options"][0]["webgpu"][
            "enableGraphCapture"
        ]
        == "0"
    )


@pytest.mark.parametrize("ep", ["cpu", "webgpu", "cuda"])
def test_generated_genai_config_passes_lint(tmp_path: Path, ep: str):
    from engine.genai_doc import GenaiDoc

    result = export(
        tmp_path / "pkg", preset="gemma4-tiny", options=ExportOptions(ep=ep, random_weights=True)
    )
    doc = GenaiDoc.load(result.output)
    assert doc.lint() == [] and doc.problems() == []
    assert not any(note.startswith("genai_config lint") for note in result.notes)


def test_capture_on_with_standard_attention_is_refused(tmp_path: Path):
    with pytest.raises(OptionsError, match="Concat"):
        export(
            tmp_path / "x",
            preset="gemma4-tiny",
            options=ExportOptions(
                ep="webgpu", attention="standard", graph_capture="on", random_weights=True
            ),
        )
    assert not (tmp_path / "x").exists()


def test_placement_log_parsing():
    placement = parse_placements((DATA / "placement_log.txt").read_text())
    assert placement.provider_nodes == {"WebGpuExecutionProvider": 2, "CPUExecutionProvider": 2}
    assert placement.host_nodes == ("Add (add64)", "Cast (cast)")
    assert placement.copies == ("MemcpyFromHost (Memcpy)",)


_TAG = "x [V:onnxruntime:, session_state.cc:1584 VerifyEachNodeIsAssignedToAnEp] "
_CUDA_LOG = "\n".join(
    _TAG + line
    for line in (
        " Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 2",
        "  GroupQueryAttention (gqa)",
        "  MatMul (mm)",
        " Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2",
        "  Gather (Gather_node_5)",
        "  Cast (Cast_node_6)",
    )
)


def test_cpu_shape_nodes_without_copies_leave_a_cuda_session_capturable():
    """As measured on the H200 (onnxruntime-gpu 1.31.1): the shape subgraph that feeds
    GroupQueryAttention's host-memory total_sequence_length runs on the CPU, and genai
    captures the session (CUDA graphs refuse only Memcpy nodes). On WebGPU any CPU node
    breaks capture."""
    from dataclasses import replace

    cuda = replace(parse_placements(_CUDA_LOG), host_nodes_break_capture=False)
    audit = SessionAudit("decoder", "cuda", True, (), {}, cuda)
    assert audit.capture_ready and audit.reasons() == []
    copied = replace(cuda, copies=("MemcpyToHost (Memcpy_token_0)",))
    audit = SessionAudit("decoder", "cuda", True, (), {}, copied)
    assert not audit.capture_ready
    assert audit.reasons() == [
        "MemcpyToHost (Memcpy_token_0) copies between the host and the device"
    ]
    webgpu = parse_placements(_CUDA_LOG)  # host nodes break capture by default
    assert not SessionAudit("decoder", "webgpu", True, (), {}, webgpu).capture_ready


def test_audit_package_measures_cpu_placement(tmp_path: Path):
    result = export(
        tmp_path / "pkg", preset="gemma4-tiny", options=ExportOptions(ep="cpu", random_weights=True)
    )
    (audit,) = audit_package(result.output, get_caps("cpu"))
    assert audit.placement is not None
    assert audit.placement.provider_nodes.get("CPUExecutionProvider", 0) > 0
    # The CPU EP cannot capture; every node on the CPU is expected there, not a finding.
    assert not audit.capture_ready and audit.findings == ()


def test_placement_on_an_absent_ep_lists_the_plugin_eps_too(tmp_path: Path):
    """A CUDA package audited on a machine without CUDA: the EPs it could run on include
    the WebGPU plugin (before: only onnxruntime's built-in ones, while ``bench`` offered
    webgpu)."""
    import onnxruntime as ort

    from engine.audit import device_placement
    from engine.runtime.plugins import ort_plugin

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the case needs an absent EP")
    result = export(
        tmp_path / "pkg",
        preset="gemma4-tiny",
        options=ExportOptions(ep="cuda", random_weights=True),
    )
    placement, why = device_placement(result.output / "model.onnx", get_caps("cuda"))
    assert placement is None and "CUDAExecutionProvider is not available" in why
    plugin = ort_plugin("WebGpuExecutionProvider")
    assert plugin is not None and plugin.devices, "the dev extra's WebGPU plugin offers a device"
    assert "WebGpuExecutionProvider" in why.partition("(has ")[2], why


def test_audit_package_reports_missing_files(tmp_path: Path):
    with pytest.raises(PackageError, match=r"no genai_config\.json"):
        audit_package(tmp_path, get_caps("cpu"))
    (tmp_path / "genai_config.json").write_text(
        json.dumps({"model": {"decoder": {"filename": "x.onnx"}}})
    )
    with pytest.raises(PackageError, match=r"x\.onnx"):
        audit_package(tmp_path, get_caps("cpu"))


def test_audit_cli_exit_codes():
    ready = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "audit",
            "--preset",
            "gemma4-e2b",
            "--ep",
            "webgpu",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ready.returncode == 0, ready.stderr
    assert json.loads(ready.stdout)[0]["capture_ready"] is True


def _audit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine", "audit", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def cpu_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit") / "pkg"
    export(out, preset="gemma4-tiny", options=ExportOptions(ep="cpu", random_weights=True))
    return out


def test_audit_of_a_package_onnxruntime_cannot_load_is_an_error(cpu_package: Path, tmp_path: Path):
    import shutil

    import onnx

    damaged = tmp_path / "pkg"
    shutil.copytree(cpu_package, damaged)
    proto = onnx.load(str(damaged / "model.onnx"), load_external_data=False)
    proto.graph.node[0].op_type = "NoSuchOp"  # a graph no runtime has a kernel for
    onnx.save(proto, str(damaged / "model.onnx"))
    for extra in ((), ("--json",)):
        result = _audit_cli(str(damaged), *extra)
        assert result.returncode == 2, result.stdout + result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: onnxruntime could not create a session for model.onnx")
        assert "NoSuchOp" in line and "Traceback" not in result.stderr
    # Without placement the graph alone is audited, as asked (the CPU EP never captures).
    assert _audit_cli(str(damaged), "--no-placement").returncode == 0
    # A truncated data file is refused before any session, in the package check's words.
    data = damaged / "model.onnx.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    result = _audit_cli(str(damaged))
    assert result.returncode == 2 and "is truncated or corrupt" in result.stderr, result.stderr


def test_audit_with_a_runtime_python_that_cannot_measure_is_an_error(
    cpu_package: Path, tmp_path: Path
):
    import venv

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python without onnxruntime
    cases = {
        str(bare / "bin" / "python"): "has no usable onnxruntime (ModuleNotFoundError",
        str(tmp_path / "no-such-python"): "cannot be run: No such file or directory",
    }
    for python, said in cases.items():
        result = _audit_cli(str(cpu_package), "--runtime-python", python)
        assert result.returncode == 2, result.stdout + result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert f"--runtime-python '{python}' {said}" in line, line


def test_audit_exit_code_is_the_same_with_json(cpu_package: Path):
    plain, as_json = _audit_cli(str(cpu_package)), _audit_cli(str(cpu_package), "--json")
    assert plain.returncode == as_json.returncode == 0  # nothing the CPU EP could capture
    assert "decoder on cpu: graph capture not supported on cpu" in plain.stdout
    (decoder,) = json.loads(as_json.stdout)
    assert decoder["session"] == "decoder" and decoder["placement"] is not None
    assert decoder["capture_ready"] is False
    # Standard attention is never captured (the KV cache grows by Concat): exit 1 both ways.
    args = ("--preset", "gemma4-tiny", "--ep", "cuda", "--attention", "standard")
    plain, as_json = _audit_cli(*args), _audit_cli(*args, "--json")
    assert plain.returncode == as_json.returncode == 1, plain.stderr
    assert "decoder on cuda: graph capture not ready" in plain.stdout
    assert "standard attention grows the KV cache by Concat" in plain.stdout
    assert json.loads(as_json.stdout)[0]["capture_ready"] is False


def test_audit_of_a_multimodal_preset_lists_every_session_decoder_first():
    result = _audit_cli("--preset", "gemma4-e2b", "--ep", "webgpu", "--json")
    assert result.returncode == 0, result.stderr  # the decoder is ready; encoders never count
    audits = json.loads(result.stdout)
    assert audits[0]["session"] == "decoder"
    assert sorted(a["session"] for a in audits) == ["decoder", "embedding", "speech", "vision"]
    never = {a["session"]: a["never_captured"] for a in audits}
    assert never["decoder"] is None and all(never[s] for s in ("embedding", "speech", "vision"))
    text = _audit_cli("--preset", "gemma4-e2b", "--ep", "webgpu")
    assert text.stdout.splitlines()[0] == "decoder on webgpu: graph capture ready"
    assert "vision on webgpu: never captured: its input shapes follow" in text.stdout


def test_audit_of_a_multimodal_package_counts_only_what_can_be_captured(tmp_path: Path):
    """The package's audit agrees with its build: the embedding, vision and speech sessions
    are never captured and leave the exit status alone; a package whose manifest predates
    the record reads the same."""
    from tests._support.tiny_gemma_mm import make_mm_checkpoint

    checkpoint, package = tmp_path / "ckpt", tmp_path / "mm"
    make_mm_checkpoint(checkpoint, audio=True)
    export(package, model_dir=checkpoint, options=ExportOptions(ep="webgpu"))
    manifest_path = package / "export_studio.json"
    manifest = json.loads(manifest_path.read_text())
    assert set(manifest["never_captured"]) == {"embedding", "vision", "speech"}
    for _ in ("recorded", "older manifest"):
        result = _audit_cli(str(package), "--no-placement")
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "decoder on webgpu: graph capture ready"
        for session in ("embedding", "vision", "speech"):
            assert any(line.startswith(f"{session} on webgpu: never captured: ") for line in lines)
        as_json = json.loads(_audit_cli(str(package), "--no-placement", "--json").stdout)
        assert {a["session"] for a in as_json if a["never_captured"]} == {
            "embedding", "vision", "speech"
        }  # fmt: skip
        manifest.pop("never_captured", None)
        manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", [b"", b"\x08\x07", b"\xff" * 64])
def test_audit_of_a_damaged_graph_file_is_an_error(cpu_package: Path, tmp_path: Path, damage):
    import shutil

    damaged = tmp_path / "pkg"
    shutil.copytree(cpu_package, damaged)
    (damaged / "model.onnx").write_bytes(damage)  # empty, an empty model's bytes, garbage
    result = _audit_cli(str(damaged), "--no-placement")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "model.onnx" in line and "export" in line and "again" in line, line


def test_audit_of_a_package_takes_its_ep_unless_ep_names_one(tmp_path: Path):
    package = tmp_path / "wg"
    export(package, options=ExportOptions(ep="webgpu", random_weights=True), preset="gemma4-tiny")
    own = _audit_cli(str(package), "--no-placement")
    assert own.stdout.startswith("decoder on webgpu: graph capture ready"), own.stdout
    asked = _audit_cli(str(package), "--no-placement", "--ep", "cpu")
    assert asked.stdout.startswith("decoder on cpu: graph capture not supported on cpu")
    assert own.returncode == asked.returncode == 0, own.stderr + asked.stderr


def test_build_flags_beside_a_package_are_refused(cpu_package: Path):
    """Before, ``audit PACKAGE --block-size 64 --weight-bits 4`` audited the package as
    built and said nothing of the flags."""
    refused = _audit_cli(str(cpu_package), "--block-size", "64", "--weight-bits", "4")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip() == (
        "error: --weight-bits, --block-size describe an export, but a package is audited as it "
        "was built: leave them out, or audit --preset / --model with them"
    )
    assert refused.stdout == ""


def test_only_our_packages_have_sessions_left_out_of_the_verdict():
    from engine.audit import never_captured_sessions

    sessions = ["decoder", "embedding", "vision"]
    assert never_captured_sessions(None, sessions) == {}  # another tool's: all judged
    older = never_captured_sessions({"producer": "export-studio"}, sessions)
    assert set(older) == {"embedding", "vision"}
    recorded = never_captured_sessions({"never_captured": {"vision": "why"}}, sessions)
    assert recorded == {"vision": "why"}
