#!/usr/bin/env bash
# The README's test command: installs what is missing, builds (CUDA code too where nvcc is found)
# and runs the test suite. GPU tests skip with a message where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
preset=${MLA_PRESET:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "${MLA_JOBS:-$(nproc)}"
ctest --preset "$preset" "$@"
