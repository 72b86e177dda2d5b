#!/usr/bin/env bash
# Installs the benchmarks' PyTorch peer (this is the "bench/peers" script): a current PyTorch 2
# from PyPI (with its CUDA wheels, about 5 GB) in a venv of its own, never Debian's Python (whose
# python3-torch 1.13 the ctest reference checks use, and which has no
# torch.distributed.checkpoint.async_save). Its users: the checkpoint benchmark
# (bench/checkpoint_compare.py) and the recovery one's torchrun peer (bench/recovery_compare.py),
# which need it, and the data-parallel one's DDP-over-Gloo peer (bench/dp_compare.py running
# bench/ddp_peer.py under `python -m torch.distributed.run`), which uses it by default when it is
# present and Debian's torch otherwise, printing which version it compared against. The PyPI
# wheels carry Gloo and torchrun, all the DDP peer needs. It also holds Hugging Face
# transformers, the serving benchmark's peer (bench/serve_compare.py: GPT-2 `generate`).
# Benchmark-only: nothing in ctest needs it.
#
#   bench/setup-torch2.sh [VENV]     default /opt/shardline-bench/torch2
#
# Idempotent: a venv that already imports torch 2 keeps its torch; transformers is installed
# when it is not there at TRANSFORMERS' version.
set -euo pipefail

VENV=${1:-/opt/shardline-bench/torch2}
TRANSFORMERS=5.23.0
versions() {
  "$VENV/bin/python" -c 'import torch, transformers
print(f"torch {torch.__version__}, transformers {transformers.__version__}")'
}
if [[ -x "$VENV/bin/python" ]] &&
   "$VENV/bin/python" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' \
     2>/dev/null; then
  if ! "$VENV/bin/python" -c "import sys, transformers
sys.exit(transformers.__version__ != '$TRANSFORMERS')" 2>/dev/null; then
    "$VENV/bin/pip" install -q "transformers==$TRANSFORMERS"
  fi
  echo "setup-torch2: $VENV already holds torch; now $(versions)"
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch numpy "transformers==$TRANSFORMERS"
echo "setup-torch2: $VENV holds $(versions)"
