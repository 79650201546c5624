"""Run a decoder package the way onnxruntime-genai does with past/present share buffers.

Runs in any environment that has onnxruntime and numpy: the main one (the CPU EP, and
WebGPU through the onnxruntime-ep-webgpu plugin, which tests/webgpu/webgpu_ort.py registers
with the engine's plugin loader) or one with onnxruntime-webgpu 1.27 built in
(scripts/setup-webgpu.sh). Prints one JSON object on stdout.

What it does, per run configuration:

* KV: every ``past_key_values.N.*`` input is a preallocated ``[1, kv_heads, max_length,
  head_dim]`` buffer, and ``present.N.*`` is bound to the same buffer (share buffer).
* attention mask (int32 or int64, whatever the package declares):
  ``static``: ``[1, max_length]`` ones for the valid positions then zeros, for the prefill
  and every decode step (onnxruntime-genai under graph capture);
  ``dynamic``: ``[1, total]`` ones, growing by one per step (onnxruntime-genai with share
  buffers but no capture).
* graph capture (WebGPU only): session config entry
  ``ep.webgpuexecutionprovider.enableGraphCapture=1``; the prefill runs uncaptured
  (run option ``gpu_graph_id=-1``, as onnxruntime-genai does), the decode steps are
  captured once and replayed. All inputs are device-resident OrtValues updated in place
  with ``ort.copy_tensors`` (NOT ``bind_cpu_input``, which replays a stale upload under
  capture on 1.27), outputs are bound to fixed device buffers.
* placement (WebGPU only): every run session is created with
  ``session.disable_cpu_ep_fallback=1`` and the WebGPU EP only,
  so creation fails if any node would fall back to the CPU; a separate verbose session
  records onnxruntime's own "Node placements" log as evidence.

usage:
  python tests/webgpu/run_package.py PACKAGE [--provider webgpu|cpu] [--prompt 5,17,42]
      [--steps 16] [--max-length 64] [--runs capture:static,plain:static,plain:dynamic]
      [--force 1,2,3] [--save-logits OUT.npz]

``--force`` teacher-forces the decode inputs (the tokens fed at decode steps 1..N);
without it each run feeds its own greedy tokens. ``--save-logits`` writes every run's
logits (the prefill's last row, then one row per decode step) as float32 arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import webgpu_ort

WEBGPU = "WebGpuExecutionProvider"
CPU = "CPUExecutionProvider"
CAPTURE_KEY = "ep.webgpuexecutionprovider.enableGraphCapture"
_JSON_OUT: str | None = None
_KEEP: list[Any] = []
"""Sessions and bindings that own device buffers; they must outlive every OrtValue they
made (a device OrtValue freed after its session segfaults at exit on 1.27)."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    global _JSON_OUT
    _JSON_OUT = args.json_out
    if args.package == "probe":
        return _finish(probe(), 0)
    package = Path(args.package)
    model = package / _decoder_filename(package)
    provider = WEBGPU if args.provider == "webgpu" else CPU
    result: dict[str, Any] = {
        "package": str(package),
        "model": str(model),
        "onnxruntime": ort.__version__,
        "available_providers": webgpu_ort.available_providers(),
        **webgpu_ort.runtime(),
        "provider": provider,
        "prompt": args.prompt,
        "steps": args.steps,
        "max_length": args.max_length,
        "forced": args.force,
    }
    if provider not in webgpu_ort.available_providers():
        result["error"] = f"{provider} is not available in this onnxruntime"
        return _finish(result, 2)
    if provider == WEBGPU:
        placement = node_placement(model)
        result["placement"] = placement
        if not placement["strict_ok"]:
            result["error"] = "session creation with CPU fallback disabled failed"
            return _finish(result, 3)
    runs: dict[str, Any] = {}
    saved: dict[str, np.ndarray] = {}
    for name in args.runs:
        capture, mask_mode = _parse_run(name)
        if capture and provider != WEBGPU:
            raise SystemExit("graph capture runs need --provider webgpu")
        try:
            run = greedy_run(
                model,
                provider,
                args.prompt,
                args.steps,
                args.max_length,
                capture=capture,
                mask_mode=mask_mode,
                forced=args.force,
            )
        except Exception as exc:  # report and go on: one failing mode must not hide the rest
            runs[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        saved[name] = run.pop("logits")
        runs[name] = run
    result["runs"] = runs
    names = [n for n in args.runs if "error" not in runs[n]]
    result["logit_diff_between_runs"] = {
        f"{a} vs {b}": _step_diffs(saved[a], saved[b])
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    if args.save_logits:
        np.savez(args.save_logits, **{k.replace(":", "_"): v for k, v in saved.items()})
        result["logits_file"] = args.save_logits
    failed = any("error" in r for r in runs.values())
    return _finish(result, 4 if failed else 0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "package",
        help="package folder (genai_config.json + model.onnx), or 'probe' to check the runtime",
    )
    p.add_argument("--provider", choices=("webgpu", "cpu"), default="webgpu")
    p.add_argument("--prompt", type=_ints, default=[5, 17, 42, 99, 7, 250, 31, 64])
    p.add_argument("--steps", type=int, default=16, help="decode steps after the prefill")
    p.add_argument("--max-length", type=int, default=64, help="KV buffer / static mask width")
    p.add_argument(
        "--runs",
        type=lambda s: s.split(","),
        default=["capture:static", "plain:static", "plain:dynamic"],
        help="comma-separated capture|plain:static|dynamic",
    )
    p.add_argument("--force", type=_ints, default=None, help="teacher-forced decode tokens")
    p.add_argument("--save-logits", default=None, help="write the logits of every run (.npz)")
    p.add_argument(
        "--json-out",
        default=None,
        help="also write the JSON here (onnxruntime prints its fallback banner on stdout)",
    )
    return p


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _parse_run(name: str) -> tuple[bool, str]:
    mode, _, mask = name.partition(":")
    if mode not in ("capture", "plain") or mask not in ("static", "dynamic"):
        raise SystemExit(f"bad run '{name}': use capture|plain:static|dynamic")
    if mode == "capture" and mask != "static":
        raise SystemExit("graph capture needs the static mask (fixed input shapes)")
    return mode == "capture", mask


def _finish(result: dict[str, Any], code: int) -> int:
    result["exit_code"] = code
    text = json.dumps(result, indent=1) + "\n"
    if _JSON_OUT:
        Path(_JSON_OUT).write_text(text)
    sys.stdout.write(text)
    sys.stdout.flush()
    # Device OrtValues freed after their session crash the interpreter at exit on 1.27.
    os._exit(code)


def _decoder_filename(package: Path) -> str:
    config = package / "genai_config.json"
    if config.exists():
        return json.loads(config.read_text())["model"]["decoder"]["filename"]
    return "model.onnx"


# ------------------------------------------------------------------------ placement


def probe() -> dict[str, Any]:
    """Is this the WebGPU build, and does a node really run on a WebGPU adapter?"""
    out: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "python": sys.executable,
        "available_providers": webgpu_ort.available_providers(),
        **webgpu_ort.runtime(),
        "adapter_ok": False,
    }
    if WEBGPU not in out["available_providers"]:
        out["error"] = (
            "this onnxruntime has no WebGpuExecutionProvider (neither the onnxruntime-ep-webgpu "
            "plugin with an adapter nor onnxruntime-webgpu)"
        )
        return out
    try:
        session = webgpu_ort.session(
            _identity_model(np.dtype(np.float32), 1), _session_options(strict=True)
        )
        x = np.arange(4, dtype=np.float32)
        out["adapter_ok"] = bool(np.array_equal(session.run(None, {"x": x})[0], x))
        _KEEP.append(session)
    except Exception as exc:  # no adapter: creation fails with CPU fallback disabled
        out["error"] = str(exc).strip().splitlines()[-1][:500]
    return out


@contextmanager
def _stderr_to(path: str):
    """Redirect the process's fd 2 (onnxruntime logs there from C++) into ``path``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def node_placement(model: Path) -> dict[str, Any]:
    """Where onnxruntime puts each node: strict creation plus its verbose placement log."""
    out: dict[str, Any] = {}
    so = _session_options(strict=True)
    try:
        webgpu_ort.session(model, so)
        out["strict_ok"] = True
    except Exception as exc:
        out["strict_ok"] = False
        out["strict_error"] = str(exc).strip().splitlines()[-1][:2000]
    so = ort.SessionOptions()
    so.log_severity_level = 0
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "placement.log")
        with _stderr_to(log):
            session = webgpu_ort.session(model, so, [WEBGPU, CPU])
        text = Path(log).read_text(errors="replace")
    out["session_providers"] = session.get_providers()
    out.update(parse_placement_log(text))
    adapter = re.findall(r"(llvmpipe[^\n\"]*|Vulkan backend[^\n]*)", text)
    if adapter:
        out["adapter_log"] = adapter[0][:200]
    return out


_PLACED = re.compile(r"Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_ALL = re.compile(r"All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)")
_NOT_FOUND = re.compile(r"(\w+) kernel not found in registries for Op type: (\w+) node name: (\S*)")


def parse_placement_log(text: str) -> dict[str, Any]:
    """Parse onnxruntime's VerifyEachNodeIsAssignedToAnEp lines.

    Returns ``nodes_by_provider`` ({provider: count}), ``cpu_nodes`` ([op (name)]) and
    ``kernel_not_found`` (the EP's own reasons).
    """
    counts: dict[str, int] = {}
    cpu_nodes: list[str] = []
    m = _ALL.search(text)
    if m:
        counts[m.group(1)] = int(m.group(2))
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _PLACED.search(line)
        if not m:
            continue
        counts[m.group(1)] = counts.get(m.group(1), 0) + int(m.group(2))
        if m.group(1) == CPU:
            for follow in lines[i + 1 : i + 1 + int(m.group(2))]:
                cpu_nodes.append(follow.split("]")[-1].strip())
    reasons = sorted({f"{op} ({name})" for _, op, name in _NOT_FOUND.findall(text)})
    return {
        "placement_logged": bool(counts),
        "nodes_by_provider": counts,
        "cpu_nodes": cpu_nodes,
        "kernel_not_found": reasons,
    }


# ------------------------------------------------------------------------ the loop


def _session_options(*, strict: bool, capture: bool = False) -> ort.SessionOptions:
    so = ort.SessionOptions()
    # Verbose for capture sessions: their log says whether each run replayed the graph.
    so.log_severity_level = 0 if capture else 3
    if strict:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if capture:
        so.add_session_config_entry(CAPTURE_KEY, "1")
    return so


class Buffers:
    """Device-resident OrtValues on the WebGPU EP, or plain CPU OrtValues.

    onnxruntime-webgpu 1.27's Python API cannot allocate WebGPU memory directly, so a
    device buffer is the output of a one-node Identity session bound to "webgpu".
    """

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self._identity: dict[tuple[str, int], Any] = {}

    def new(self, array: np.ndarray) -> ort.OrtValue:
        array = np.array(array, copy=True, order="C")  # a CPU OrtValue aliases its array
        if self.provider != WEBGPU:
            return ort.OrtValue.ortvalue_from_numpy(array)
        session = self._identity_session(array.dtype, array.ndim)
        io = session.io_binding()
        io.bind_cpu_input("x", array)
        io.bind_output("y", "webgpu")
        session.run_with_iobinding(io)
        value = io.get_outputs()[0]
        _KEEP.extend([io, value])
        return value

    def write(self, target: ort.OrtValue, array: np.ndarray) -> None:
        if self.provider != WEBGPU:
            target.update_inplace(np.ascontiguousarray(array))
            return
        source = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
        ort.copy_tensors([source], [target], None)

    def _identity_session(self, dtype: np.dtype, rank: int) -> Any:
        key = (np.dtype(dtype).name, rank)
        if key not in self._identity:
            self._identity[key] = webgpu_ort.session(_identity_model(dtype, rank))
            _KEEP.append(self._identity[key])
        return self._identity[key]


def _identity_model(dtype: np.dtype, rank: int) -> bytes:
    """A serialized ONNX Identity model, written by hand so onnx is not needed."""
    elem = {"float32": 1, "int32": 6, "int64": 7, "float16": 10}[np.dtype(dtype).name]
    return _proto_identity(elem, rank)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(num: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(num << 3) + _varint(payload)
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _proto_identity(elem: int, rank: int) -> bytes:
    # TensorShapeProto with symbolic dims, TypeProto.Tensor, ValueInfoProto, NodeProto,
    # GraphProto, ModelProto (ir_version 10, opset 21) - field numbers from onnx.proto.
    dims = b"".join(_field(1, _field(2, f"d{i}".encode())) for i in range(rank))
    tensor_type = _field(1, elem) + _field(2, dims)
    type_proto = _field(1, tensor_type)

    def value_info(name: str) -> bytes:
        return _field(1, name.encode()) + _field(2, type_proto)

    node = _field(1, b"x") + _field(2, b"y") + _field(4, b"Identity")
    graph = (
        _field(1, node)
        + _field(2, b"identity")
        + _field(11, value_info("x"))
        + _field(12, value_info("y"))
    )
    opset = _field(2, 21)
    return _field(1, 10) + _field(7, graph) + _field(8, opset)


def _inputs_of(session: Any) -> tuple[dict[str, Any], np.dtype, np.dtype]:
    inputs = {i.name: i for i in session.get_inputs()}
    index = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
    past = [n for n in inputs if n.startswith("past_key_values")]
    float_dtype = np.float16 if "float16" in inputs[past[0]].type else np.float32
    return inputs, np.dtype(index), np.dtype(float_dtype)


def greedy_run(
    model: Path,
    provider: str,
    prompt: list[int],
    steps: int,
    max_length: int,
    *,
    capture: bool,
    mask_mode: str,
    forced: list[int] | None = None,
) -> dict[str, Any]:
    """Prefill then ``steps`` decode steps with share-buffer KV; returns tokens, logits
    ([steps + 1, V]: the prefill's last row, then each decode step), margins, timings.

    A capture run logs verbosely into a file and reports onnxruntime's own words: whether
    the session took graph capture, and how many runs replayed the captured graph.
    """
    args = (model, provider, prompt, steps, max_length)
    if not capture:
        return _greedy(*args, capture=False, mask_mode=mask_mode, forced=forced)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "capture.log")
        with _stderr_to(log):
            result = _greedy(*args, capture=True, mask_mode=mask_mode, forced=forced)
        text = Path(log).read_text(errors="replace")
    result["capture_log"] = {
        "session_uses_capture": "will use the graph capture feature" in text,
        "replays": text.count("Replaying the captured"),
        "refusals": sorted({m for m in re.findall(r"cannot use the graph capture[^\n]*", text)}),
    }
    return result


def _greedy(
    model: Path,
    provider: str,
    prompt: list[int],
    steps: int,
    max_length: int,
    *,
    capture: bool,
    mask_mode: str,
    forced: list[int] | None,
) -> dict[str, Any]:
    if len(prompt) + steps > max_length:
        raise ValueError(f"prompt {len(prompt)} + steps {steps} exceed max_length {max_length}")
    if forced is not None and len(forced) < steps:
        raise ValueError(f"--force gives {len(forced)} tokens, {steps} decode steps need them")
    t0 = time.perf_counter()
    strict = provider == WEBGPU
    options = _session_options(strict=strict, capture=capture)
    session = webgpu_ort.session(model, options, [provider])
    _KEEP.append(session)
    created = time.perf_counter() - t0
    inputs, index_dtype, float_dtype = _inputs_of(session)
    buffers = Buffers(provider)
    device = "webgpu" if provider == WEBGPU else "cpu"

    kv: dict[str, ort.OrtValue] = {}
    for name, info in inputs.items():
        if name.startswith("past_key_values"):
            shape = (1, int(info.shape[1]), max_length, int(info.shape[3]))
            kv[name] = buffers.new(np.zeros(shape, dtype=float_dtype))
    outputs = [o.name for o in session.get_outputs()]
    vocab = int(session.get_outputs()[outputs.index("logits")].shape[-1])

    def bind(io: Any, ids: ort.OrtValue, mask: ort.OrtValue, logits: ort.OrtValue | None):
        # Logits first: io.get_outputs() lists outputs in binding order.
        if logits is None:
            io.bind_output("logits", device)
        else:
            io.bind_ortvalue_output("logits", logits)
        io.bind_ortvalue_input("input_ids", ids)
        io.bind_ortvalue_input("attention_mask", mask)
        for name, value in kv.items():
            io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(name.replace("past_key_values", "present"), value)

    def mask_array(total: int) -> np.ndarray:
        width = max_length if mask_mode == "static" else total
        mask = np.zeros((1, width), dtype=index_dtype)
        mask[0, :total] = 1
        return mask

    # Prefill: its own shapes, never captured.
    total = len(prompt)
    prefill_ids = buffers.new(np.array([prompt], dtype=index_dtype))
    prefill_mask = buffers.new(mask_array(total))
    io = session.io_binding()
    bind(io, prefill_ids, prefill_mask, None)
    run_options = ort.RunOptions()
    if capture:
        run_options.add_run_config_entry("gpu_graph_id", "-1")
    t1 = time.perf_counter()
    session.run_with_iobinding(io, run_options)
    prefill_logits = io.get_outputs()[0].numpy()
    prefill_s = time.perf_counter() - t1
    _KEEP.append(io)
    rows = [prefill_logits[0, -1].astype(np.float32)]

    # Decode: one binding with fixed device buffers, updated in place each step.
    step_ids = buffers.new(np.zeros((1, 1), dtype=index_dtype))
    step_mask = buffers.new(mask_array(total + 1)) if mask_mode == "static" else None
    logits_type = session.get_outputs()[outputs.index("logits")].type
    logits_dtype = np.float16 if "float16" in logits_type else np.float32
    step_logits = buffers.new(np.zeros((1, 1, vocab), dtype=logits_dtype))
    decode_io = session.io_binding()
    _KEEP.append(decode_io)
    if step_mask is not None:
        bind(decode_io, step_ids, step_mask, step_logits)
    tokens: list[int] = []
    fed: list[int] = []
    step_seconds: list[float] = []
    for step in range(steps):
        token = int(rows[-1].argmax())
        tokens.append(token)
        feed = forced[step] if forced is not None else token
        fed.append(feed)
        total += 1
        t = time.perf_counter()
        buffers.write(step_ids, np.array([[feed]], dtype=index_dtype))
        if step_mask is not None:
            buffers.write(step_mask, mask_array(total))
        else:  # dynamic mask: a new [1, total] input each step, no capture
            decode_io = session.io_binding()
            _KEEP.append(decode_io)
            bind(decode_io, step_ids, buffers.new(mask_array(total)), step_logits)
        session.run_with_iobinding(decode_io)
        rows.append(step_logits.numpy()[0, -1].astype(np.float32))
        step_seconds.append(time.perf_counter() - t)
    tokens.append(int(rows[-1].argmax()))
    logits = np.stack(rows)
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return {
        "capture": capture,
        "mask": mask_mode,
        "session_providers": session.get_providers(),
        "tokens": tokens,
        "fed": fed,
        "top1_margin": [float(m) for m in (top2[:, 1] - top2[:, 0])],
        "logits": logits,
        "seconds": {
            "session": round(created, 4),
            "prefill": round(prefill_s, 4),
            "first_decode": round(step_seconds[0], 4) if step_seconds else None,
            "decode_mean_after_first": round(float(np.mean(step_seconds[1:])), 4)
            if len(step_seconds) > 1
            else None,
            "decode_total": round(float(np.sum(step_seconds)), 4),
        },
    }


def _step_diffs(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)]


if __name__ == "__main__":
    sys.exit(main())
