#!/usr/bin/env bash
# Runs the shared-memory communicator's threads-as-ranks tests under ThreadSanitizer: every rank is
# a thread of one process, so TSan sees each release/acquire pair of the control lines and every
# futex wake, and reports a data race in the synchronisation as a failure. Not in the default
# suite (a TSan build of the comm library and its tests takes minutes).
#
# Usage: scripts/tsan-comm.sh [BUILD_DIR]   (default build-tsan)
# Gloo (a system library, not instrumented) is only linked in; the filters below run shm alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-tsan}

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLINE_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build "$build_dir" --target comm_shm_test comm_collectives_test -j "$(nproc)"
# halt_on_error: the first race fails the run; second_deadlock_stack names both lock orders.
# suppressions: races inside uninstrumented system libraries only (the file says which).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan-comm.supp"
# The forked-process tests are out: TSan does not follow a fork that keeps running test code.
"$build_dir/tests/comm_shm_test" --gtest_filter='ShmTest.*:CpuTransportTest.*'
"$build_dir/tests/comm_collectives_test" --gtest_filter='Backends/WorldTest.*/shm_n*'
echo "tsan-comm: no data race reported"
