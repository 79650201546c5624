#!/usr/bin/env bash
# A second, optional WebGPU runtime beside the main environment's plugin: onnxruntime-webgpu
# 1.27 (the provider built into onnxruntime), for side-by-side runs against the
# onnxruntime-ep-webgpu plugin that the main environment uses (pip install -e ".[webgpu]").
# The tests do not need it; EXPORT_STUDIO_WEBGPU_PYTHON=.venv-webgpu/bin/python runs the
# WebGPU tests on it instead of the plugin.
#
#   * Mesa 25 lavapipe (scripts/install-lavapipe.sh), when no Mesa >= 25 Vulkan driver is
#     installed yet; the script ends with a test that proves a node really ran on
#     WebGpuExecutionProvider (onnxruntime otherwise falls back to the CPU EP silently).
#   * a SEPARATE virtual environment (default: <repo>/.venv-webgpu) with
#     onnxruntime-webgpu==1.27.0, numpy, onnx, the engine itself (pip install --no-deps -e .)
#     and its pure-Python dependencies, and onnxruntime-genai==0.18.0 with --no-deps.
#     Plain `onnxruntime` must never land in it: both wheels install the same
#     `onnxruntime/` import folder and the last one wins.
#
# Idempotent: apt is skipped when Mesa >= 25 lavapipe is installed, pip is skipped when
# the environment already passes its checks (FORCE=1 reinstalls).
#
# usage:  bash scripts/setup-webgpu.sh [VENV_DIR]
# env:    WEBGPU_VENV=DIR    where the environment goes (the argument wins; default
#                            <repo>/.venv-webgpu, git-ignored by the `.venv*/` rule)
#         PYTHON=python3.12  interpreter for a new environment (onnxruntime-webgpu 1.27.0
#                            ships cp311/cp312/cp313 wheels only; default: the first of
#                            python3.12, python3.11, python3.13, python3 that fits)
#         SKIP_APT=1         never touch apt (Mesa 25 lavapipe or a GPU driver is there)
#         FORCE=1            reinstall the Python packages even if the checks pass
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${WEBGPU_VENV:-$repo/.venv-webgpu}}"
ORT_WEBGPU="onnxruntime-webgpu==1.27.0"
GENAI="onnxruntime-genai==0.18.0"
# The engine's pure-Python dependencies (pyproject.toml), without onnxruntime.
DEPS=("numpy>=1.26" "onnx==1.23.2" "onnx-ir>=1.1,<2" "onnxscript>=0.7.2,<0.8"
      "safetensors>=0.4" "ml_dtypes>=0.5" "tqdm>=4.66" "pytest>=8")
t0=$(date +%s)
say() { echo "[setup-webgpu +$(($(date +%s) - t0))s] $*"; }
die() { echo "setup-webgpu: ERROR: $*" >&2; exit 1; }

# ------------------------------------------------------------------ Mesa 25 lavapipe
bash "$repo/scripts/install-lavapipe.sh"

# ------------------------------------------------------------------ the environment
pick_python() {
  local p
  for p in ${PYTHON:-} python3.12 python3.11 python3.13 python3; do
    command -v "$p" >/dev/null 2>&1 || continue
    if "$p" -c 'import sys; raise SystemExit(not ((3, 11) <= sys.version_info[:2] <= (3, 13)))' 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no Python 3.11-3.13 found (onnxruntime-webgpu 1.27.0 has cp311/cp312/cp313 wheels only); set PYTHON="
}

# Exit status 0 when the environment has everything at the right versions, with the
# WebGPU build of onnxruntime and no plain onnxruntime distribution.
check_env() {
  "$venv/bin/python" - "$repo" <<'EOF'
import importlib, importlib.metadata as md, pathlib, sys
repo = pathlib.Path(sys.argv[1]).resolve()
problems = []
dists = {d.metadata["Name"].lower() for d in md.distributions()}
if "onnxruntime" in dists:
    problems.append("plain 'onnxruntime' is installed (it overwrites onnxruntime-webgpu)")
try:
    if md.version("onnxruntime-webgpu") != "1.27.0":
        problems.append(f"onnxruntime-webgpu {md.version('onnxruntime-webgpu')} != 1.27.0")
    import onnxruntime
    if "WebGpuExecutionProvider" not in onnxruntime.get_available_providers():
        problems.append("onnxruntime does not offer WebGpuExecutionProvider")
except md.PackageNotFoundError:
    problems.append("onnxruntime-webgpu missing")
except ImportError as exc:
    problems.append(f"import onnxruntime: {exc}")
for mod in ("numpy", "onnx", "onnx_ir", "onnxscript", "ml_dtypes", "safetensors", "tqdm",
            "pytest", "onnxruntime_genai", "engine"):
    try:
        m = importlib.import_module(mod)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"import {mod}: {exc}")
        continue
    if mod == "engine" and repo not in pathlib.Path(m.__file__).resolve().parents:
        problems.append(f"engine comes from {m.__file__}, not {repo}")
if problems:
    print("\n".join("  - " + p for p in problems))
    raise SystemExit(1)
EOF
}

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
  say "reusing $venv ($("$venv/bin/python" --version 2>&1))"
else
  [ -e "$venv" ] && die "$venv exists but has no working bin/python; remove it first"
  py=$(pick_python)
  say "creating $venv with $py ($("$py" --version 2>&1))"
  "$py" -m venv "$venv"
fi

if [ "${FORCE:-0}" != "1" ] && check_env >/dev/null 2>&1; then
  say "environment already good: skipping pip"
else
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  say "pip install $ORT_WEBGPU ${DEPS[*]}"
  "${pip[@]}" "$ORT_WEBGPU" "${DEPS[@]}"
  say "pip install --no-deps -e $repo (the engine) and --no-deps $GENAI"
  "${pip[@]}" --no-deps -e "$repo"
  "${pip[@]}" --no-deps "$GENAI"
  if ! out=$(check_env); then
    echo "$out" >&2
    die "the environment at $venv is not right (see above)"
  fi
fi

# ------------------------------------------------------------------ proof of the adapter
say "smoke test: a MatMul with CPU fallback disabled"
"$venv/bin/python" - <<'EOF' 2> >(grep -v "artificially reduced" >&2)
import os
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

print("onnxruntime", ort.__version__, ort.get_available_providers())
vi = helper.make_tensor_value_info
graph = helper.make_graph(
    [helper.make_node("MatMul", ["A", "B"], ["Y"])], "mm",
    [vi("A", TensorProto.FLOAT, [64, 512]), vi("B", TensorProto.FLOAT, [512, 256])],
    [vi("Y", TensorProto.FLOAT, [64, 256])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
model.ir_version = 10  # onnx 1.23 writes IR 14; onnxruntime-webgpu 1.27 reads <= 13
so = ort.SessionOptions()
so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
try:  # only WebGPU listed: creation fails instead of falling back when there is no adapter
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["WebGpuExecutionProvider"])
except Exception as exc:
    print("NO WEBGPU ADAPTER:", str(exc).strip().splitlines()[-1])
    os._exit(1)
rng = np.random.default_rng(0)
a = rng.standard_normal((64, 512), dtype=np.float32)
b = rng.standard_normal((512, 256), dtype=np.float32)
err = float(np.abs(s.run(None, {"A": a, "B": b})[0] - a.astype(np.float64) @ b).max())
print(f"MatMul on WebGpuExecutionProvider: max |err| vs numpy {err:.1e}")
os._exit(0 if err < 1e-3 else 1)
EOF
say "done. The tests find it at $venv/bin/python"
[ "$venv" = "$repo/.venv-webgpu" ] || echo "  export EXPORT_STUDIO_WEBGPU_PYTHON=$venv/bin/python"
