#!/usr/bin/env bash
# Everything that needs a GPU, in one go, for a session that is lent one: the GPU tests (every CUDA
# kernel and every CUDA backend operation against its CPU twin; the engine on the CUDA backend at
# 1x1x1 against the CPU engine for 10 steps in fp32 and bf16; two ranks on the one GPU as tp=2 and
# as pp=2 over host shared memory, as NCCL refuses two ranks on one device; the NCCL communicator
# at one rank), the GPU kernel benchmarks, one training step of GPT-2 small and medium, the engine
# against PyTorch eager on the same GPU (tokens/s and MFU, bench/train_step_compare.py --device
# cuda), and `shardline train --device cuda` on examples/gpt-tiny.yaml followed by `shardline
# generate` from its checkpoint on the GPU and on the CPU (the greedy text must be the same; the
# paged KV-cache forward against the CPU's is InferenceOnCudaTest in model_engine_cuda_test; a tp 2 and
# a pp 2 serving group sharing the GPU against the CPU's tokens is serving_sharded_test's
# ServingOnOneGpuTest).
#
# Two ways to get the binaries:
#   scripts/gpu-check.sh [BUILD_DIR]        builds with CUDA (Release) into BUILD_DIR (default
#                                           build-gpu) on this machine: needs our apt dependencies
#   scripts/gpu-check.sh --pack FILE        unpacks what scripts/gpu-pack.sh built elsewhere (the
#                                           device machines reach no package registry, and their
#                                           minutes are few: build and pack here, run there)
# Environment:
#   OUT=DIR                   where the logs go (default gpu-check-out/)
#   GPU_CHECK_ROUNDS=N        rounds of each side in the PyTorch comparison (default 2)
#   GPU_CHECK_ALLOW_NO_GPU=1  exit 0 even when no GPU is visible (the GPU tests then only skip)
# The first line printed says which GPU(s) `nvidia-smi -L` sees, or that none is visible. Exits
# non-zero when a step fails, or when no GPU is visible (a run that checked nothing is no pass).
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${OUT:-gpu-check-out}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)

gpus=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | paste -sd ';' - || true)
fi
if [[ -n "$gpus" ]]; then
  echo "GPU: $gpus"
else
  echo "GPU: none visible (nvidia-smi -L found none or is missing); GPU tests will report skipped"
fi

failures=()
step() {  # step NAME LOGFILE COMMAND... : runs COMMAND, logs it, records a failure
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  echo "== $name (log: $log)"
  if "$@" >"$log" 2>&1; then
    echo "   ok ($((SECONDS - start)) s)"
  else
    echo "   FAILED ($((SECONDS - start)) s); last lines:"
    tail -n 30 "$log" | sed 's/^/   | /'
    failures+=("$name")
  fi
}

if [[ "${1:-}" == "--pack" ]]; then
  pack=${2:?"--pack needs the archive scripts/gpu-pack.sh wrote"}
  build_dir=$(mktemp -d /tmp/shardline-pack.XXXXXX)
  tar -C "$build_dir" -xJf "$pack" || { echo "gpu-check: cannot unpack $pack"; exit 1; }
  echo "pack: $pack, built from $(cat "$build_dir/COMMIT")"
  # cuBLAS, NCCL and the CUDA runtime come from this machine (a CUDA toolkit, or the nvidia-*
  # wheels of its PyTorch); the pack's own libraries after them.
  cuda_dirs=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /opt /usr/lib /usr/local/lib \
                -maxdepth 10 \( -name 'libcublas.so.1*' -o -name 'libnccl.so.2' -o \
                -name 'libcudart.so.1*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u |
              paste -sd: -)
  echo "CUDA libraries from: ${cuda_dirs:-(none found)}"
  export LD_LIBRARY_PATH="${cuda_dirs:+$cuda_dirs:}$build_dir/lib:$build_dir/lib-fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  build_dir=${1:-build-gpu}
  step "configure (CUDA, Release)" "$out_dir/configure.log" \
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDLINE_CUDA=ON
  if ! grep -q '^SHARDLINE_CUDA:BOOL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null; then
    echo "CUDA is not enabled in $build_dir (is nvcc under /usr/local/cuda?)"
    exit 1
  fi
  step "build" "$out_dir/build.log" cmake --build "$build_dir" -j "$(nproc)" --target \
    kernels_cuda_test kernels_backend_test model_engine_cuda_test serving_sharded_test comm_nccl_test \
    gpu_train_step_bench train_step_gpu_bench shardline
  if [[ ${#failures[@]} -gt 0 ]]; then
    echo "gpu-check: the build failed; nothing was run"
    exit 1
  fi
fi

# The GPU tests, run as binaries (the same tests `ctest -L gpu` and `ctest -R Nccl` run) so that a
# pack needs no CMake tree. A test that skips says why in its log.
# The engine's forked two-ranks-on-one-GPU test runs in a process of its own: CUDA does not survive
# fork(), so its parent must not have touched the GPU (ctest runs every test alone anyway).
for test in kernels_cuda_test kernels_backend_test model_engine_cuda_test:-*Forked* \
            model_engine_cuda_test:*Forked* serving_sharded_test:*OnOneGpu* comm_nccl_test; do
  binary=${test%%:*}
  filter=${test#"$binary"}
  log="$out_dir/$binary${filter:+-$( [[ $filter == :-* ]] && echo rest || echo forked )}.log"
  step "$binary${filter:+ (${filter#:})}" "$log" "$build_dir/tests/$binary" \
    ${filter:+--gtest_filter=${filter#:}}
  grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ test' "$log" | sed 's/^/   /'
done

# GPU kernel benchmarks (Google Benchmark). It exits 0 when a benchmark reports an error; with a
# GPU present that is a failure. (Logs only: the device tool brings back at most 8 files.)
step "gpu_train_step_bench" "$out_dir/gpu_train_step_bench.log" timeout 300 \
  "$build_dir/bench/gpu_train_step_bench"
if [[ -n "$gpus" ]] && grep -q 'ERROR OCCURRED' "$out_dir/gpu_train_step_bench.log"; then
  grep 'ERROR OCCURRED' "$out_dir/gpu_train_step_bench.log" | sed 's/^/   | /'
  failures+=("gpu_train_step_bench (errors)")
fi

# One training step of GPT-2 small and medium, the engine on the CUDA backend against PyTorch's
# eager step on the same GPU, in the same run (tokens/s and MFU).
torch_python=python3
[[ -x /usr/bin/python3 ]] && ! python3 -c 'import torch' 2>/dev/null && torch_python=/usr/bin/python3
for shape in small medium; do
  rounds=${GPU_CHECK_ROUNDS:-2}
  [[ $shape == medium ]] && rounds=1
  step "train step vs PyTorch (cuda, bf16, GPT-2 $shape)" \
    "$out_dir/train_step_compare_$shape.log" timeout 300 \
    python3 bench/train_step_compare.py "$build_dir" --device cuda --precision bf16 \
    --shape "$shape" --torch-python "$torch_python" --rounds "$rounds"
  sed -n '/^config /,/^(best/p' "$out_dir/train_step_compare_$shape.log" | sed 's/^/   /'
done

# `shardline train` on the GPU as a user runs it, then greedy text from its checkpoint on the GPU
# and on the CPU: the same text.
ckpt=$(mktemp -d /tmp/shardline-gpu-ckpt.XXXXXX)
step "shardline train --device cuda" "$out_dir/train_cuda.log" timeout 300 \
  "$build_dir/cli/shardline" train examples/gpt-tiny.yaml --device cuda --checkpoint-dir "$ckpt"
grep -E '^(Training|step .*/300|Final)' "$out_dir/train_cuda.log" | sed 's/^/   /' | tail -n 4
step "shardline generate --device cuda" "$out_dir/generate.log" timeout 120 \
  "$build_dir/cli/shardline" generate --checkpoint "$ckpt" --prompt "the cat " --max-new-tokens 40 \
  --device cuda
sed 's/^/   /' "$out_dir/generate.log" | head -n 3
step "shardline generate (cpu)" "$ckpt/generate_cpu.log" timeout 120 \
  "$build_dir/cli/shardline" generate --checkpoint "$ckpt" --prompt "the cat " --max-new-tokens 40
if [[ -n "$gpus" ]] && ! cmp -s "$out_dir/generate.log" "$ckpt/generate_cpu.log"; then
  echo "   the GPU's greedy text differs from the CPU's:"
  sed 's/^/   cpu: /' "$ckpt/generate_cpu.log" | head -n 3
  failures+=("generate (cuda != cpu)")
fi

if [[ ${#failures[@]} -gt 0 ]]; then
  echo "gpu-check: FAILED: ${failures[*]} (logs in $out_dir/)"
  exit 1
fi
if [[ -z "$gpus" && "${GPU_CHECK_ALLOW_NO_GPU:-0}" != 1 ]]; then
  echo "gpu-check: no GPU visible, so the GPU tests only skipped: nothing was checked"
  exit 2
fi
echo "gpu-check: all passed (logs in $out_dir/)"
