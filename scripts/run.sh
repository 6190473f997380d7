#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, and runs one checked decode step of
# the default preset (arguments are passed to `mla run`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
preset=${MLA_PRESET:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "${MLA_JOBS:-$(nproc)}" --target mla_cli
if [ $# -eq 0 ]; then set -- --preset kimi-k3 --batch 16 --context 4096 --check; fi
exec "build/$preset/mla" run "$@"
