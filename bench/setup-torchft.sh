#!/usr/bin/env bash
# Installs TorchFT (PyPI `torchft`: per-step fault tolerance for PyTorch, a Rust lighthouse and
# manager, the torchft_lighthouse binary) into the PyTorch 2 venv of bench/setup-torch2.sh, the
# second peer named by the recovery benchmark (bench/recovery_compare.py runs torchrun's
# restart-all; TorchFT heals a replica group without restarting the others). The wheel is small
# (a few MB plus opentelemetry); it needs torch >= 2.7, which the venv already holds.
# Benchmark-only: nothing in ctest needs it.
#
#   bench/setup-torchft.sh [VENV]     default /opt/shardline-bench/torch2
#
# Idempotent: a venv that already imports torchft is left as it is.
set -euo pipefail

VENV=${1:-/opt/shardline-bench/torch2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version() { "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torchft"))'; }
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import torchft' 2>/dev/null; then
  echo "setup-torchft: $VENV already holds torchft $(version)"
  exit 0
fi
"$HERE/setup-torch2.sh" "$VENV"
"$VENV/bin/pip" install -q torchft
echo "setup-torchft: $VENV holds torchft $(version) (lighthouse: $VENV/bin/torchft_lighthouse)"
