#!/usr/bin/env bash
# Installs moed's build and test dependencies from Debian 12's packages.
# Idempotent: when everything is present it returns at once, without apt.
set -euo pipefail

packages=(
  build-essential cmake pkg-config python3
  libopenmpi-dev openmpi-bin
  libucx-dev ucx-utils
  libhwloc-dev hwloc
  libmetis-dev
  libtomlplusplus-dev libspdlog-dev
  libopenblas-dev
  libdnnl-dev  # oneDNN: the dense bf16 and int8 bounds of tests/bench/precision.sh (moed does not link it)
  nlohmann-json3-dev libcli11-dev
  libgtest-dev
  libssl-dev  # HMAC-SHA-256 of the network front door's challenge-response (client/auth.h)
  prometheus chromium
  slurm-wlm munge
  iproute2
  clang libclang-rt-14-dev clang-tidy
  python3-numpy python3-torch
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 2; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
# Another apt may hold the lock (unattended upgrades): wait for it.
$sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q "${missing[@]}"
