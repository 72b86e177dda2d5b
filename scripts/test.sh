#!/usr/bin/env bash
# Installs the dependencies, builds everything (CUDA code too when nvcc is found) and runs the
# whole test suite with ctest. Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

bash scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j "$(nproc)"
# Serially: the multi-process tests measure heartbeat timeouts on a 2-core machine.
ctest --test-dir "$build_dir" --output-on-failure --timeout 900
