#!/usr/bin/env bash
# Builds, on this machine, everything scripts/gpu-check.sh runs on a GPU machine, and packs it with
# the shared libraries such a machine lacks, into one archive.
#
# Why: the GPU machines lent to a session reach no package registry, so our apt dependencies
# (Abseil, spdlog, fmt, OpenBLAS, ...) cannot be installed there, and their minutes are too few to
# spend compiling. Binaries built here (Debian 12, glibc 2.36) run on any newer x86-64 Linux; the
# archive carries every library they load except the C/C++ runtime, the CUDA driver, cuBLAS and NCCL,
# which a GPU machine has (gpu-check.sh finds them there). cuBLAS and NCCL are also too large to
# carry (0.5 GB, 0.2 GB).
#
# Usage: scripts/gpu-pack.sh [BUILD_DIR]          (default build-gpu)
#   Writes .gpu-pack/pack.tar.xz (git-ignored; name `.gpu-pack` in the device tool's `carry`), then
#   on the GPU machine: OUT=DIR scripts/gpu-check.sh --pack .gpu-pack/pack.tar.xz
# Fails when a binary would load a library that is neither packed nor in the runtime set above, or
# when the archive is over 60 MiB (the device tool carries at most 64 MiB with the working tree).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-gpu}
pack_dir=.gpu-pack
# What gpu-check.sh runs: the gpu-labelled tests, the NCCL tests, the GPU benchmarks, the CLI.
targets=(kernels_cuda_test kernels_backend_test model_engine_cuda_test serving_sharded_test
         comm_nccl_test gpu_train_step_bench train_step_gpu_bench shardline)
# Loaded from the GPU machine itself (see above); everything else a binary needs is packed.
provided='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnccl\.so|libcublas|libcublasLt)'

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDLINE_CUDA=ON >/dev/null
if ! grep -q '^SHARDLINE_CUDA:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  echo "gpu-pack: CUDA is not enabled in $build_dir (is nvcc under /usr/local/cuda?)" >&2
  exit 1
fi
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
binaries=()
for target in "${targets[@]}"; do
  # At the same path under the pack as under the build dir (tests/, bench/, cli/), so that tools
  # that take a build dir (bench/train_step_compare.py) take the unpacked pack.
  path=$(cd "$build_dir" && find . -maxdepth 2 -type f -name "$target" -perm -u+x -print -quit)
  if [[ -z "$path" ]]; then
    echo "gpu-pack: $target was not built in $build_dir" >&2
    exit 1
  fi
  mkdir -p "$stage/$(dirname "$path")"
  strip -o "$stage/$path" "$build_dir/$path"
  binaries+=("$stage/$path")
done

# OpenBLAS is dlopen'ed (kernels/cpu/blas.h), so ldd of the binaries does not show it.
openblas=$(ldconfig -p | awk '/libopenblas\.so\.0 .*x86-64/ && !found {print $NF; found = 1}')
if [[ -z "$openblas" ]]; then
  echo "gpu-pack: libopenblas.so.0 not found; run scripts/install-deps.sh" >&2
  exit 1
fi
cp -L "$openblas" "$stage/lib/libopenblas.so.0"

copy_dependencies() {  # copy_dependencies FILE: the libraries FILE loads that are not provided
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $provided ]] && continue
    [[ -e "$stage/lib/$name" ]] && continue
    cp -L "$path" "$stage/lib/$name"
  done
}
for file in "${binaries[@]}" "$stage/lib/libopenblas.so.0"; do copy_dependencies "$file"; done
# The CUDA runtime is a fallback for a machine whose own is not found: gpu-check.sh puts the
# machine's libraries first.
mkdir -p "$stage/lib-fallback"
mv "$stage/lib"/libcudart.so.* "$stage/lib-fallback/" 2>/dev/null || true
for file in "$stage"/lib/*; do copy_dependencies "$file"; done

# Every library a packed binary loads must now resolve inside the pack or be provided.
missing=$(for file in "${binaries[@]}" "$stage"/lib/*; do
  LD_LIBRARY_PATH="$stage/lib:$stage/lib-fallback" ldd "$file" |
    awk '$2 == "=>" {print $1, $3}' | while read -r name path; do
      [[ "$name" =~ $provided ]] && continue
      [[ "$path" == "$stage"/* ]] || echo "$(basename "$file") needs $name ($path)"
    done
done | sort -u)
if [[ -n "$missing" ]]; then
  echo "gpu-pack: libraries that would not travel:" >&2
  echo "$missing" >&2
  exit 1
fi

git describe --always --dirty --abbrev=12 >"$stage/COMMIT"
mkdir -p "$pack_dir"
tar -C "$stage" -cJf "$pack_dir/pack.tar.xz" .
size=$(stat -c %s "$pack_dir/pack.tar.xz")
echo "gpu-pack: $pack_dir/pack.tar.xz, $((size / 1048576)) MiB, $(ls "$stage/lib" | wc -l) libraries," \
  "${#binaries[@]} binaries, commit $(cat "$stage/COMMIT")"
if ((size > 60 * 1048576)); then
  echo "gpu-pack: over 60 MiB: the device tool carries at most 64 MiB with the working tree" >&2
  exit 1
fi
