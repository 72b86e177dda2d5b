#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ with ASan + UBSan and runs each for SECONDS (default 60)
# on a copy of its committed corpus, one at a time on one core.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]     e.g. scripts/fuzz.sh 600 manifest envelope
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 7200     each harness until 10^7 executions or 2 h
#
# The build is its own folder (build-fuzz, clang-14; $FUZZ_BUILD_DIR, $FUZZ_CC and $FUZZ_CXX
# override) with only the harnesses and the libraries they link. Per harness it prints the
# executions reached and their rate. A crash, leak, timeout or broken promise keeps its input as
# build-fuzz/artifacts/HARNESS/crash-* (or leak-*, timeout-*, oom-*) and makes the script exit
# non-zero once every harness has run; replay one with build-fuzz/fuzz/HARNESS_fuzzer FILE, and
# commit it under fuzz/regressions/HARNESS/ with the fix, so the ctest replays it.
set -euo pipefail

seconds=${1:-60}
shift || true
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
cc=${FUZZ_CC:-clang-14}
cxx=${FUZZ_CXX:-clang++-14}
jobs=${FUZZ_BUILD_JOBS:-$(nproc)}
# An execution count to stop at (libFuzzer's -runs), SECONDS staying the cap.
runs_limit=${FUZZ_RUNS:-}

all_harnesses=(envelope safetensors manifest spec_yaml gpt2_tokenizer_files gpt2_tokenizer_encode
               completion_request)
harnesses=("$@")
if [[ ${#harnesses[@]} -eq 0 ]]; then harnesses=("${all_harnesses[@]}"); fi

for tool in "$cc" "$cxx" cmake ninja; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz.sh: $tool not found (Debian: apt-get install clang-14 libclang-rt-14-dev cmake ninja-build)" >&2
    exit 2
  fi
done

# Coverage instrumentation and both sanitizers in every library of ours, not only in the
# harnesses: the bugs are in the decoders. Assertions stay on (no NDEBUG).
sanitize="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
flags="$sanitize -fno-omit-frame-pointer -g -O2"
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_C_FLAGS_FUZZ="$flags" -DCMAKE_CXX_FLAGS_FUZZ="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize" -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" \
  -DSHARDLINE_CUDA=OFF -DSHARDLINE_FUZZ=ON >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 2; }
ninja -C "$build" -j "$jobs" $(printf '%s_fuzzer ' "${harnesses[@]}")

# Inputs above these sizes add time, not coverage; the tokenizer's files and the example specs
# are a few KiB.
max_len() {
  case "$1" in
    gpt2_tokenizer_files|spec_yaml) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

# Symbolized stack traces need llvm-symbolizer (Debian's llvm-14).
if [[ -z ${ASAN_SYMBOLIZER_PATH:-} && -x /usr/lib/llvm-14/bin/llvm-symbolizer ]]; then
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
summary=()
for name in "${harnesses[@]}"; do
  corpus="$build/corpus/$name"
  artifacts="$build/artifacts/$name"
  rm -rf "$corpus"
  mkdir -p "$corpus" "$artifacts"
  cp -r "$root/fuzz/corpus/$name/." "$corpus/"
  if [[ -d "$root/fuzz/regressions/$name" ]]; then cp -r "$root/fuzz/regressions/$name/." "$corpus/"; fi
  before=$(ls "$artifacts")
  log="$build/$name.log"
  echo "== $name: ${seconds}s${runs_limit:+ or $runs_limit executions}"
  status=0
  limit=(-max_total_time="$seconds")
  if [[ -n $runs_limit ]]; then limit+=(-runs="$runs_limit"); fi
  "$build/fuzz/${name}_fuzzer" "$corpus" "${limit[@]}" -max_len="$(max_len "$name")" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  line=$(printf '%-24s %12s executions %8s exec/s' "$name" "${runs:-?}" "${rate:-?}")
  if [[ $status -ne 0 ]]; then
    failed+=("$name")
    found=$(comm -13 <(echo "$before") <(ls "$artifacts") | sed "s|^|$artifacts/|" | tr '\n' ' ')
    line+="  FAILED (exit $status): ${found:-no input kept}"
    grep -m1 -E 'ERROR: |runtime error|broken promise' "$log" >&2 || true
    echo "   log: $log" >&2
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "== summary (${seconds}s each)"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: failures in ${failed[*]}" >&2
  exit 1
fi
