#!/usr/bin/env bash
# Everything that needs a GPU, in one go, for a session that is lent one: builds with CUDA
# (Release) into build-gpu, runs the `gpu`-labelled tests (every CUDA kernel against its CPU twin,
# the CUDA allocator), the NCCL communicator tests, and the GPU benchmarks that exist.
#
# Usage: scripts/gpu-check.sh [BUILD_DIR]          (default build-gpu)
#   OUT=DIR                 where the logs go (default gpu-check-out/)
#   GPU_CHECK_TARGETS="..." build only these targets instead of everything (saves device time;
#                           gpu-labelled tests of targets left out are then not run)
#   GPU_CHECK_ALLOW_NO_GPU=1  exit 0 even when no GPU is visible (the GPU tests then only skip)
# The first line printed says which GPU(s) `nvidia-smi -L` sees, or that none is visible. Exits
# non-zero when a step fails, or when no GPU is visible (a run that checked nothing is no pass).
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-gpu}
out_dir=${OUT:-gpu-check-out}
mkdir -p "$out_dir"

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

jobs=$(nproc)
step "configure (CUDA, Release)" "$out_dir/configure.log" \
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDLINE_CUDA=ON
# The root CMakeLists prints "CUDA <version>, NCCL <library>" when the CUDA paths are on.
if ! grep -q -- '-- CUDA .*NCCL' "$out_dir/configure.log"; then
  echo "CUDA is not enabled in $build_dir (is nvcc under /usr/local/cuda?)"
  exit 1
fi
if [[ -n "${GPU_CHECK_TARGETS:-}" ]]; then
  # shellcheck disable=SC2086  # a list of targets
  step "build ($GPU_CHECK_TARGETS)" "$out_dir/build.log" \
    cmake --build "$build_dir" -j "$jobs" --target ${GPU_CHECK_TARGETS}
else
  step "build (everything)" "$out_dir/build.log" cmake --build "$build_dir" -j "$jobs"
fi
if [[ ${#failures[@]} -gt 0 ]]; then
  echo "gpu-check: the build failed; nothing was run"
  exit 1
fi

step "ctest -L gpu" "$out_dir/ctest-gpu.log" \
  ctest --test-dir "$build_dir" -L gpu --output-on-failure --timeout 600
grep -E 'tests passed|tests failed' "$out_dir/ctest-gpu.log" | sed 's/^/   /'
step "ctest -R Nccl" "$out_dir/ctest-nccl.log" \
  ctest --test-dir "$build_dir" -R Nccl --output-on-failure --timeout 600
grep -E 'tests passed|tests failed|No tests were found' "$out_dir/ctest-nccl.log" | sed 's/^/   /'

# GPU benchmarks: the Google Benchmark binaries whose name says GPU or CUDA.
shopt -s nullglob
for bench in "$build_dir"/bench/gpu_* "$build_dir"/bench/*cuda*; do
  [[ -f "$bench" && -x "$bench" ]] || continue
  name=$(basename "$bench")
  step "benchmark $name" "$out_dir/$name.log" timeout 600 "$bench" \
    --benchmark_out="$out_dir/$name.json" --benchmark_out_format=json
  # Google Benchmark exits 0 when a benchmark reports an error; with a GPU present that is a failure.
  if [[ -n "$gpus" ]] && grep -q 'ERROR OCCURRED' "$out_dir/$name.log"; then
    grep 'ERROR OCCURRED' "$out_dir/$name.log" | sed 's/^/   | /'
    failures+=("benchmark $name (errors)")
  fi
done

if [[ ${#failures[@]} -gt 0 ]]; then
  echo "gpu-check: FAILED: ${failures[*]} (logs in $out_dir/)"
  exit 1
fi
if [[ -z "$gpus" && "${GPU_CHECK_ALLOW_NO_GPU:-0}" != 1 ]]; then
  echo "gpu-check: no GPU visible, so the GPU tests only skipped: nothing was checked"
  exit 2
fi
echo "gpu-check: all passed (logs in $out_dir/)"
