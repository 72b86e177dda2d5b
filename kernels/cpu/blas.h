// The BLAS the CPU kernels multiply with: OpenBLAS, loaded with dlopen on first use rather than
// linked. Linked in, OpenBLAS 0.3.21 (Debian 12) is loaded into every `shardline` process, and the
// coordinator, which never multiplies a matrix, then crashed in civetweb's worker threads (the
// Prometheus endpoint) with a null thread pointer; reproduced by LD_PRELOADing libopenblas alone.
// Loading it only where a GEMM runs keeps the daemons free of it.
#pragma once

#include <cblas.h>

#include <string>

namespace shardline::kernels::cpu {

using SgemmFn = decltype(&cblas_sgemm);

// cblas_sgemm from the system's OpenBLAS. The first call loads the library (thread-safe); if no
// BLAS can be loaded the process stops with a message naming the libraries tried: OpenBLAS is
// a dependency of the installation (scripts/install-deps.sh), not an input a caller can fix.
SgemmFn Sgemm();

// The library Sgemm() uses, with its version (loads it if no call has yet).
std::string BlasDescription();

}  // namespace shardline::kernels::cpu
