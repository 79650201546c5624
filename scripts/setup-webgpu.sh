#!/usr/bin/env bash
# Set up the WebGPU runtime environment that tests/engine/test_webgpu.py drives:
#
#   * Mesa 25 lavapipe (software Vulkan) from Debian bookworm-backports, when no Mesa >= 25
#     Vulkan driver is installed yet. Dawn (inside onnxruntime-webgpu) rejects Debian 12's
#     own Mesa 22 lavapipe ("Vulkan shaderUniform*ArrayDynamicIndexing required"); without
#     any Vulkan loader there is no adapter at all. In both cases onnxruntime silently
#     falls back to the CPU EP, so this script ends with a test that proves a node really
#     ran on WebGpuExecutionProvider.
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
# Then point the tests at it with EXPORT_STUDIO_WEBGPU_PYTHON=VENV_DIR/bin/python, or
# leave it at <repo>/.venv-webgpu where they look by default.
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
mesa_major() {
  local v
  v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  v=${v#*:}  # drop an epoch
  echo "${v%%.*}"
}
have_lavapipe() {
  local major
  major=$(mesa_major)
  [ -n "$major" ] && [ "$major" -ge 25 ] 2>/dev/null \
    && dpkg-query -W -f='${Status}' libvulkan1 2>/dev/null | grep -q "install ok installed" \
    && ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1
}

if [ "${SKIP_APT:-0}" = "1" ]; then
  say "SKIP_APT=1: not checking apt packages"
elif have_lavapipe; then
  say "Mesa $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) lavapipe already installed: skipping apt"
else
  command -v apt-get >/dev/null || die "no apt-get: install Mesa >= 25 lavapipe (or a Vulkan GPU driver) yourself, then rerun with SKIP_APT=1"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "installing Mesa 25 needs root (or sudo)"
    SUDO="sudo"
  fi
  . /etc/os-release
  [ "${VERSION_CODENAME:-}" = "bookworm" ] \
    || echo "setup-webgpu: WARNING: written for Debian bookworm, this is ${PRETTY_NAME:-unknown}" >&2
  if ! grep -rqsE '(^|[[:space:]])bookworm-backports([[:space:]]|$)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    say "adding the bookworm-backports apt source"
    $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  say "apt-get update"
  $SUDO apt-get update -q
  say "installing mesa-vulkan-drivers (bookworm-backports) and libvulkan1"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -t bookworm-backports mesa-vulkan-drivers libvulkan1
  have_lavapipe || die "Mesa >= 25 lavapipe still missing after apt (mesa-vulkan-drivers $(mesa_major))"
  say "Mesa $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) installed"
fi

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
