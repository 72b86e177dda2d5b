#!/usr/bin/env bash
# Builds the test suite with sanitizers and runs it (DESIGN.md, "Hostile input": sanitizer builds
# of the suite by a script). Not part of the default CI run: on a 2-core machine the ASan build
# alone takes 30-40 minutes and `all` about 50 (docs/sanitizers.md has the times measured and
# what the runs found).
#
#   scripts/sanitize.sh [asan|tsan|all] [CTEST_ARGS...]      (default: all)
#   e.g. scripts/sanitize.sh asan -j2 -R '^Checkpoint'       scripts/sanitize.sh tsan
#
# asan: every ctest test, in its own build folder (build-asan; $ASAN_BUILD_DIR), with
#   AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer (-fno-sanitize-recover: the
#   first UB ends the process) in every library and executable of ours, the `shardline` binary
#   that the multi-process tests start included.
# tsan: ThreadSanitizer (build-tsan; $TSAN_BUILD_DIR) on the threaded parts only: the
#   communicators' tests (comm_*), the sharded model with its communication thread
#   (model_sharded_test), and the trainers with the asynchronous checkpoint writer
#   (checkpoint_integrity_test, checkpoint_resume_test, training_test).
#
# clang-14 ($SANITIZE_CC, $SANITIZE_CXX), CPU only (-DSHARDLINE_CUDA=OFF), -O1 -g with frame
# pointers (kernels/ and worker/comm/ add their own -O3, as in every non-Debug build). Build jobs:
# $SANITIZE_JOBS (default nproc). CTEST_ARGS go to ctest after --output-on-failure.
#
# Every sanitizer report of every process (a test, or a coordinator, agent or actor that a test
# started, whose report its test may never see: a supervisor restarts a dead actor) goes to
# BUILD/sanitizer-reports/KIND.EXE.PID, not to stderr; the script prints them and fails when any
# is there after the run, even if ctest passed.
set -euo pipefail

mode=${1:-all}
shift || true
case "$mode" in
  asan|tsan|all) ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all] [CTEST_ARGS...]" >&2; exit 2 ;;
esac
ctest_args=("$@")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cc=${SANITIZE_CC:-clang-14}
cxx=${SANITIZE_CXX:-clang++-14}
jobs=${SANITIZE_JOBS:-$(nproc)}
asan_build=${ASAN_BUILD_DIR:-$root/build-asan}
tsan_build=${TSAN_BUILD_DIR:-$root/build-tsan}

for tool in "$cc" "$cxx" cmake ninja ctest; do
  if ! command -v "$tool" >/dev/null; then
    echo "sanitize.sh: $tool not found (Debian: apt-get install clang-14 libclang-rt-14-dev" \
      "lld cmake ninja-build)" >&2
    exit 2
  fi
done
symbolizer=${SANITIZE_SYMBOLIZER:-/usr/lib/llvm-14/bin/llvm-symbolizer}
if [[ ! -x $symbolizer ]]; then symbolizer=$(command -v llvm-symbolizer || true); fi
linker=""
# lld links the ~90 test binaries faster.
if command -v ld.lld >/dev/null; then linker="-fuse-ld=lld"; fi

# configure BUILD_DIR BUILD_TYPE SANITIZER_FLAGS LINK_FLAGS
configure() {
  local dir=$1 type=$2 sanitize=$3 link=$4
  local flags="$sanitize -fno-omit-frame-pointer -O1 -g"
  mkdir -p "$dir"
  local type_upper=${type^^}
  cmake -S "$root" -B "$dir" -G Ninja \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE="$type" \
    "-DCMAKE_C_FLAGS_${type_upper}=$flags" "-DCMAKE_CXX_FLAGS_${type_upper}=$flags" \
    "-DCMAKE_EXE_LINKER_FLAGS=$link $linker" "-DCMAKE_SHARED_LINKER_FLAGS=$link $linker" \
    -DSHARDLINE_CUDA=OFF >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log" >&2; exit 2; }
}

# reports_check BUILD_DIR: prints every report file and fails if there is one. Two kinds of
# line are notes, not reports, and a file of nothing else is counted apart:
# allocator_may_return_null's warning (an allocation refused, as a test asks; the test checks
# what the caller did with the null), and LeakSanitizer's "Unable to get registers from thread"
# (a thread that exited, or a process a test stopped, while the leak check stopped the world;
# the check goes on, and a leak it then finds is a report of its own).
reports_check() {
  local dir=$1/sanitizer-reports
  local f reports=() notes=0
  local note='^==.*==(WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes|'
  note+='Unable to get registers from thread [0-9]+\.)$'
  for f in $(find "$dir" -type f -size +0 2>/dev/null | sort); do
    if grep -qvE "$note" "$f"; then
      reports+=("$f")
    else
      notes=$((notes + 1))
    fi
  done
  if [[ $notes -gt 0 ]]; then
    echo "sanitize.sh: $notes process(es) left only notes (a refused allocation, a thread gone)"
  fi
  if [[ ${#reports[@]} -gt 0 ]]; then
    echo "sanitize.sh: ${#reports[@]} sanitizer report(s) in $dir:" >&2
    for f in "${reports[@]}"; do
      echo "---- $f" >&2
      head -60 "$f" >&2
    done
    return 1
  fi
  echo "sanitize.sh: no sanitizer report in $dir"
}

# LLVM's OpenMP runtime registers each process that starts it in /dev/shm
# (__KMP_REGISTERED_LIB_PID_*); the processes the fault tests kill with SIGKILL leave theirs
# behind. Removes those of dead PIDs.
clean_kmp_registrations() {
  local f pid
  for f in /dev/shm/__KMP_REGISTERED_LIB_*; do
    [[ -e $f ]] || continue
    pid=${f#/dev/shm/__KMP_REGISTERED_LIB_}
    pid=${pid%%_*}
    kill -0 "$pid" 2>/dev/null || rm -f "$f"
  done
}

elapsed() { local s=$(( $(date +%s) - $1 )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

status=0
summary=()

run_asan() {
  local dir=$asan_build start
  start=$(date +%s)
  configure "$dir" Asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
    "-fsanitize=address,undefined"
  # Every executable that a test is or runs: all of them but the benchmarks and the corpus writer.
  local targets
  targets=$(ninja -C "$dir" -t targets all |
            sed -n 's/^\([^:]*\): CXX_EXECUTABLE_LINKER.*/\1/p' |
            grep -v -e '^bench/' -e '/seed_corpus_writer$' -e '_tests\.cmake$' |
            sed 's|.*/||' | sort -u)
  mkdir -p "$dir/sanitizer-reports"
  rm -f "$dir"/sanitizer-reports/*
  # The build runs each test binary once (gtest_discover_tests), under the same options.
  asan_env "$dir"
  # shellcheck disable=SC2086
  ninja -C "$dir" -j "$jobs" $targets || { reports_check "$dir" || true; exit 1; }
  summary+=("asan build: $(elapsed "$start")")
  rm -f "$dir"/sanitizer-reports/*
  start=$(date +%s)
  local rc=0
  ctest --test-dir "$dir" --output-on-failure "${ctest_args[@]}" || rc=$?
  summary+=("asan ctest: $(elapsed "$start"), exit $rc")
  clean_kmp_registrations
  reports_check "$dir" || rc=1
  [[ $rc -eq 0 ]] || status=1
}

# The BLAS. clang builds our OpenMP code against LLVM's libomp; OpenBLAS's OpenMP build (what an
# AMD CPU loads first) and MKL's GNU layer are built for libgomp and reach libomp through its
# GOMP_* entry points. There OpenBLAS's threaded sgemm hangs, in both sanitizer builds: its master
# spins in sched_yield for a worker that libomp never starts (seen in every training test, each
# child killed at its deadline). The gcc builds have one OpenMP runtime and no such hang. So the
# sanitizer runs take MKL on one thread (SHARDLINE_BLAS=mkl MKL_NUM_THREADS=1: its GEMMs on the
# calling thread; MKL is not instrumented, so nothing of ours goes unchecked but the choice of
# library), or, where MKL is not installed, one OpenMP thread for everything.
# kernels_blas_test's *.openblas copy still forces OpenBLAS (its own ENVIRONMENT).
blas_env() {
  if compgen -G "${SHARDLINE_MKL_DIR:-/opt/shardline/deps/mkl}/lib/libmkl_rt.so.*" >/dev/null; then
    export SHARDLINE_BLAS=mkl MKL_NUM_THREADS=1
  else
    echo "sanitize.sh: no oneMKL: one OpenMP thread for everything (OMP_NUM_THREADS=1)" >&2
    export OMP_NUM_THREADS=1
  fi
}

asan_env() {
  local dir=$1
  export ASAN_SYMBOLIZER_PATH=$symbolizer
  # halt_on_error: the first error ends the process; detect_leaks: LeakSanitizer at every exit;
  # log_path: each process's reports also land in a file of its own (log_exe_name names it).
  # allocator_may_return_null: an impossible allocation returns null, as glibc's does, instead of
  # ending the process (CpuAllocator's ResourceExhausted path is tested with one).
  # intercept_tls_get_addr=0: clang 14's LeakSanitizer crashes walking the dynamic TLS blocks it
  # tracks through __tls_get_addr ("Tracer caught signal 11", and no leak check at all) in every
  # process that has dlopen'd MKL. glibc allocates those blocks with malloc, reachable from each
  # thread's static TLS, which is still scanned (use_tls stays on; use_tls=0 reported OpenSSL's
  # per-thread state as leaked). At worst a block seen only from dynamic TLS would be reported
  # as a leak: this can add a false report, not hide one.
  local asan="halt_on_error=1:detect_leaks=1:check_initialization_order=1"
  asan+=":allocator_may_return_null=1:intercept_tls_get_addr=0"
  asan+=":log_path=$dir/sanitizer-reports/asan:log_exe_name=1:external_symbolizer_path=$symbolizer"
  export ASAN_OPTIONS=$asan
  local ubsan="halt_on_error=1:print_stacktrace=1:log_path=$dir/sanitizer-reports/asan"
  ubsan+=":log_exe_name=1:external_symbolizer_path=$symbolizer"
  export UBSAN_OPTIONS=$ubsan
  blas_env
  # Leaks inside third-party libraries, each entry with the reason it is not ours.
  if [[ -s $root/scripts/sanitize-lsan.supp ]]; then
    export LSAN_OPTIONS="suppressions=$root/scripts/sanitize-lsan.supp:print_suppressions=0"
  fi
}

# The threaded parts' test binaries.
tsan_targets=(comm_store_test comm_collectives_test comm_shm_test comm_all_reduce_tuner_test
              comm_shared_host_memory_test comm_local_rank_group_test model_sharded_test
              checkpoint_integrity_test checkpoint_resume_test training_test)

run_tsan() {
  local dir=$tsan_build start
  start=$(date +%s)
  configure "$dir" Tsan "-fsanitize=thread" "-fsanitize=thread"
  mkdir -p "$dir/sanitizer-reports"
  rm -f "$dir"/sanitizer-reports/*
  tsan_env "$dir"
  ninja -C "$dir" -j "$jobs" "${tsan_targets[@]}" || { reports_check "$dir" || true; exit 1; }
  summary+=("tsan build: $(elapsed "$start")")
  rm -f "$dir"/sanitizer-reports/*
  # Only the tests of those binaries: the other test binaries of this build folder are not built
  # (ctest lists each as TARGET_NOT_BUILT). Their gtest suites, from the lists the build wrote.
  local suites t
  suites=$(for t in "${tsan_targets[@]}"; do
             sed -n 's/^add_test( *\[=*\[\([^].]*\)\..*/\1/p' "$dir"/tests/"$t"\[*\]_tests.cmake
           done | sed 's|^[^/]*/||' | sort -u | paste -sd'|')
  if [[ -z $suites ]]; then echo "sanitize.sh: no tests found in the TSan build" >&2; exit 2; fi
  start=$(date +%s)
  local rc=0
  ctest --test-dir "$dir" --output-on-failure -R "^([^/]*/)?($suites)\\." "${ctest_args[@]}" ||
    rc=$?
  summary+=("tsan ctest: $(elapsed "$start"), exit $rc")
  clean_kmp_registrations
  reports_check "$dir" || rc=1
  [[ $rc -eq 0 ]] || status=1
}

tsan_env() {
  local dir=$1
  # halt_on_error: the first race ends the process (a forked rank's exit code fails its test);
  # second_deadlock_stack names both lock orders. Suppressions: only races inside uninstrumented
  # system libraries (scripts/sanitize-tsan.supp says which and why).
  local tsan="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/sanitize-tsan.supp"
  tsan+=":log_path=$dir/sanitizer-reports/tsan:log_exe_name=1:external_symbolizer_path=$symbolizer"
  export TSAN_OPTIONS=$tsan
  # OpenMP: clang builds the kernels against LLVM's libomp, which is not instrumented, but which
  # loads Archer (libarcher.so, from the same package) when the program runs under TSan: Archer
  # tells TSan the happens-before edges of OpenMP's barriers, reductions and tasks, so the
  # kernels' parallel regions are checked with OMP_NUM_THREADS (2) threads and no false reports
  # (scripts/sanitize-tsan.supp has the one entry this needs, for libomp's own locks).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
  blas_env
}

if [[ $mode == asan || $mode == all ]]; then run_asan; fi
if [[ $mode == tsan || $mode == all ]]; then run_tsan; fi

echo
echo "== sanitize.sh $mode"
printf '%s\n' "${summary[@]}"
exit $status
