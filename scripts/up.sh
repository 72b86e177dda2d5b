#!/usr/bin/env bash
# Installs the dependencies, builds the `shardline` binary and runs the main job: a local
# cluster on this machine's CPUs (`shardline up`). Extra arguments go to `shardline up`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)" --target shardline
exec build/cli/shardline up "$@"
