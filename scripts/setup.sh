#!/usr/bin/env bash
# Installs everything mla-decode needs on a fresh Debian 12 machine. Idempotent.
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache pkg-config libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
      libopenblas-dev libopenblas0-pthread libdnnl-dev python3 python3-pip python3-dev pybind11-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Python side: numpy for the Python module's tests (tests/python) and, with safetensors, to read back
# the files `mla run --dump` writes (tests use it). pybind11-dev above builds the module.
python3 -c 'import safetensors, numpy' 2>/dev/null || python3 -m pip install -q safetensors numpy
