// The BLAS the CPU kernels multiply with, chosen by measurement (bench/gemm_compare.py: oneMKL,
// oneDNN, BLIS, OpenBLAS old and new, against PyTorch 2's MKL on the GPT-2 GEMM shapes), by the
// CPU's vendor and vector width:
//
//  1. On Intel CPUs (and any CPU but AMD's): Intel oneMKL, from the prefix scripts/install-deps.sh
//     fills (the CMake cache variable SHARDLINE_MKL_DIR, default /opt/shardline/deps/mkl),
//     through libmkl_rt with the LP64 interface and the GNU OpenMP threading layer: MKL's GEMM
//     runs on the same libgomp pool as our own kernels (no second pool spinning against it),
//     sized by OMP_NUM_THREADS, as the agent sets per actor; MKL_NUM_THREADS, if set, overrides
//     it for MKL alone. MKL picks its kernels from the CPU's features (AVX-512 on the Xeons
//     here; the log line names the code path), not from a table of CPU models: on a 2-core
//     AVX-512 Xeon it made 0.93-1.12x PyTorch 2's MKL, where Debian's OpenBLAS 0.3.21 does not
//     know the CPU and runs its generic Prescott kernels (37-57 GFLOP/s against MKL's 300).
//  2. On AMD CPUs with AVX-512 (Zen 4 and later): Debian's oneDNN (libdnnl2, built on GNU OpenMP:
//     the same libgomp pool), through dnnl_sgemm. On a 2-core Zen 4 EPYC (2026-12-05, medians of
//     5 rounds against PyTorch 2.15's MKL in the same run) it made 1.10-1.26x on the three GPT-2
//     GEMM shapes where OpenBLAS 0.3.21 made 0.93-1.16x (its fc_proj below 0.95x in both runs),
//     and a GPT-2-small training step ran 1.43x PyTorch 2.15 (bench/train_step_compare.py); the
//     one-thread products of bench/dp_compare.py 493.9 against 505.7 ms a step.
//  3. On other AMD CPUs: Debian's OpenBLAS, its OpenMP build (libopenblas0-openmp: the same
//     libgomp pool), when its own detection gives it kernels for this CPU (an AVX2 core or better;
//     0.3.21 calls Zen 1-4 "Zen"). MKL takes its generic code path on AMD: on a 2-core Zen 4 EPYC
//     (2026-12-03) its GPT-2 GEMMs ran at 0.91-0.95x PyTorch 2.15's MKL, and its products of a
//     few rows were slower still (skinny_matmul.h); on a 2-core Zen 3 EPYC (2026-12-04) MKL made
//     0.78-0.86x and OpenBLAS 1.00-1.11x, and a GPT-2-small training step ran 1.24x PyTorch 2.15
//     with OpenBLAS against 1.13x with MKL (oneDNN was not measured there). Not everywhere: the
//     one-thread products of a small model (bench/sharded_step_bench --layout 1x1x2, d_model 256)
//     ran faster on MKL there, 711 against 819 ms a step (medians of 3, alternating). An AMD CPU
//     that neither suits gets MKL (the log line says why).
//  4. Else the system OpenBLAS (Debian's libopenblas0), with a warning naming what was missing.
// SHARDLINE_BLAS=mkl, =openblas or =onednn forces one (for comparisons and tests; unset in
// production). The library and its version are logged once, at the first GEMM.
//
// Loaded with dlopen at the first GEMM rather than linked, for three reasons:
//  - The choice above is made where the binary runs, not where it was built.
//  - Processes that never multiply (coordinator, agent) never load 700 MB of MKL or start
//    OpenBLAS's threads.
//  - A BLAS loaded at start-up has its thread-local storage placed in the static TLS block, which
//    glibc carves out of the top of EVERY thread's stack. OpenBLAS 0.3.21's is 60 KiB (its TLS
//    segment's memsz is 0xf000), and Debian's civetweb gives its worker threads fixed 100 KiB
//    stacks (built with USE_STACK_SIZE=102400): with libopenblas linked or LD_PRELOADed a worker
//    keeps 36 KB of stack instead of 98 KB, and civetweb's error path (mg_send_http_error ->
//    vsnprintf) overflows it. Any request for a path other than /metrics then kills the process,
//    and so does a scrape while the endpoint stops, because prometheus-cpp's Exposer removes its
//    /metrics handler before it stops civetweb, so those scrapes get a 404. That was the
//    coordinator's "crash in civetweb's worker threads when the metrics endpoint stopped". A
//    dlopen'ed library's TLS is allocated per thread on first use instead, so actors, which load
//    the BLAS and serve metrics too, are safe whichever library they get.
//    tests/unit/kernels_blas_test.cc checks that a 100 KiB-stack thread keeps its stack after
//    the BLAS is loaded. (oneMKL's own TLS is 16 bytes; linking it would also be safe.)
#pragma once

#include <cblas.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/tensor.h"

namespace shardline::kernels::cpu {

using SgemmFn = decltype(&cblas_sgemm);

// cblas_sgemm from the library chosen above. The first call loads it (thread-safe); if no BLAS
// can be loaded the process stops with a message naming the libraries tried: the BLAS is a
// dependency of the installation (scripts/install-deps.sh), not an input a caller can fix.
SgemmFn Sgemm();

// The library Sgemm() uses: name, version, path, threading and (MKL) code path, or (OpenBLAS)
// core. Loads it if no call has yet.
std::string BlasDescription();

// A weight matrix (OC, C), as MatmulForward takes it, packed once into MKL's own layout for
// products of up to max_rows rows (cblas_sgemm_pack / cblas_sgemm_compute): a decode step's few
// rows then do not pay for repacking the weight on every call — 1.6x faster at 8 rows on GPT-2
// small's layers (2-core Xeon, MKL 2026.2). Only MKL has it (so not on AMD CPUs, items 2-3);
// the packed copy is as large as the weight, and the weight must stay as it was packed.
class PackedWeight {
 public:
  // nullptr when the BLAS has no packed GEMM (OpenBLAS) or a size is not positive;
  // ResourceExhausted when the copy does not fit in `allocator`.
  static absl::StatusOr<std::unique_ptr<PackedWeight>> Pack(const float* weight, int C, int OC,
                                                            int max_rows, Allocator& allocator);
  // out (N, OC) = inp (N, C) · weightᵀ + beta · out, for 1 <= N <= max_rows().
  void Multiply(float* out, const float* inp, int N, float beta) const;
  int max_rows() const { return max_rows_; }

 private:
  PackedWeight(int C, int OC, int max_rows) : C_(C), OC_(OC), max_rows_(max_rows) {}
  int C_, OC_, max_rows_;
  Tensor buffer_;  // MKL's packed matrix; it must not move once packed
};

// The threads this process's CPU kernels and GEMM run on: OpenMP's pool, which MKL's GNU OpenMP
// layer and OpenBLAS's OpenMP build share (OMP_NUM_THREADS, as the agent sets it per actor; the
// pthreads OpenBLAS of the fallback gets the same count).
int CpuThreads();

}  // namespace shardline::kernels::cpu
