#!/usr/bin/env bash
# Mesa 25's software Vulkan driver (lavapipe) from Debian bookworm-backports, for the WebGPU
# EP on a machine without a GPU. The WebGPU plugin (onnxruntime-ep-webgpu, the '.[webgpu]'
# extra) uses it when it finds no GPU adapter; Dawn rejects Debian 12's own Mesa 22
# lavapipe ("Vulkan shaderUniform*ArrayDynamicIndexing required"), and without any Vulkan
# driver there is no adapter at all.
#
# Idempotent: nothing is done when Mesa >= 25 lavapipe is installed. Needs root (or sudo)
# otherwise.
#
# usage:  bash scripts/install-lavapipe.sh
# env:    SKIP_APT=1   never touch apt (lavapipe or a GPU driver is installed another way)
set -euo pipefail
t0=$(date +%s)
say() { echo "[install-lavapipe +$(($(date +%s) - t0))s] $*"; }
die() { echo "install-lavapipe: ERROR: $*" >&2; exit 1; }

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
    || echo "install-lavapipe: WARNING: written for Debian bookworm, this is ${PRETTY_NAME:-unknown}" >&2
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

