#!/usr/bin/env bash
# Installs everything mla-decode needs on a fresh Debian 12 machine. Idempotent.
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache pkg-config libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
      libopenblas-dev libopenblas0-pthread libdnnl-dev python3 python3-pip)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Python side: only to read back the .safetensors files `mla run --dump` writes (tests use it).
python3 -c 'import safetensors, numpy' 2>/dev/null || python3 -m pip install -q safetensors numpy
