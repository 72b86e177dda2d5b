#!/usr/bin/env bash
# runtime-files.sh BINARY OUT: what the image's final stage needs to run BINARY (the `shardline`
# that the build stage made), found from the binary itself rather than listed by hand:
#   OUT/packages.txt   the Debian packages that own the libraries it links (ldd), and those it
#                      loads at run time with dlopen (kernels/cpu/blas.cc: OpenBLAS's OpenMP build,
#                      oneDNN; worker/serving/chat_template.cc: Python's jinja2)
#   OUT/rootfs/        the libraries no Debian package owns, at their own paths: the CUDA runtime
#                      and NCCL when it was built with CUDA (the binary's RUNPATH is
#                      /usr/local/cuda/lib64), cuBLAS (dlopen'ed by kernels/cuda/cublas_loader.cc),
#                      and oneMKL from scripts/install-deps.sh's prefix, whose path is baked in.
# The NVIDIA driver (libcuda.so.1) is never copied: on a GPU node the NVIDIA container toolkit
# mounts the node's own into the container.
set -euo pipefail
binary=$1
out=$2
mkdir -p "$out/rootfs"

declare -A packages=(
  [libopenblas0-openmp]=1 [libdnnl2]=1 [python3-jinja2]=1
)

owner() {  # the Debian package that owns a file, or nothing
  local file=$1 real
  real=$(readlink -f "$file")
  for candidate in "$file" "$real" "${real/#\/usr\/lib\//\/lib\/}"; do
    if pkg=$(dpkg-query -S "$candidate" 2>/dev/null | head -n 1); then
      echo "${pkg%%:*}"
      return
    fi
  done
}

copy() {  # the file a library path resolves to, at that path under rootfs/ (symlinks resolved)
  local file=$1
  mkdir -p "$out/rootfs$(dirname "$file")"
  cp -L "$file" "$out/rootfs$file"
}

missing=$(ldd "$binary" | grep "not found" || true)
if [[ -n "$missing" ]]; then
  echo "runtime-files: $binary links libraries that are not here:" >&2
  echo "$missing" >&2
  exit 1
fi

while read -r path; do
  pkg=$(owner "$path")
  if [[ -n "$pkg" ]]; then
    packages[$pkg]=1
  else
    copy "$path"
  fi
done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')

# cuBLAS, loaded by soname from the RUNPATH when a job runs on a GPU.
cuda_lib=/usr/local/cuda/lib64
for lib in "$cuda_lib"/libcublas.so.* "$cuda_lib"/libcublasLt.so.*; do
  if [[ -e "$lib" && ! "$lib" =~ \.so\.[0-9]+\.[0-9] ]]; then copy "$lib"; fi
done

# oneMKL: the prefix baked into the binary (SHARDLINE_MKL_DIR), when the build had one.
mkl_dir=${SHARDLINE_MKL_DIR:-/opt/shardline/deps/mkl}
if [[ -e "$mkl_dir/lib/libmkl_rt.so.3" ]]; then
  for lib in "$mkl_dir"/lib/libmkl_*.so.*; do copy "$lib"; done
fi

printf '%s\n' "${!packages[@]}" | sort > "$out/packages.txt"
echo "runtime-files: $(wc -l < "$out/packages.txt") Debian packages, $(find "$out/rootfs" -type f | wc -l) other files"
