// Blas: the cuBLAS handle (and bf16 scratch) the CUDA matmuls run with.
//
// Precision. The kernels keep the CPU twins' f32 interface (f32 master weights and activations).
// GemmPrecision picks how a GEMM computes:
//   kFloat32   cublasSgemm: f32 inputs, f32 accumulation (no TF32: the handle keeps the default
//              math mode). Matches OpenBLAS to f32 rounding; the reference-check mode.
//   kBFloat16  the f32 operands are rounded to bf16 copies in scratch memory, then cublasGemmEx
//              multiplies bf16 × bf16 on tensor cores with f32 accumulation and an f32 output.
//              This is the training mode of DESIGN.md ("bf16 compute, fp32 master weights").
// A caller that already holds bf16 copies (the weights, cast once per step) uses the *Bf16 entry
// points in ops.h and skips the per-call casts.
//
// Thread-safety: one Blas per thread (a cuBLAS handle and the scratch block are not shared). Work
// is ordered on the stream each call names; the scratch block is reused by the next call, which is
// safe only when consecutive calls use the same stream (or the caller synchronises in between).
#pragma once

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/cuda/cublas_loader.h"

namespace shardline::kernels::cuda {

enum class GemmPrecision : uint8_t { kFloat32, kBFloat16 };

class Blas {
 public:
  // A handle on the calling thread's current device. `scratch` (a CUDA allocator that outlives
  // this Blas) provides the bf16 copies. FailedPrecondition when cuBLAS cannot be loaded or cannot
  // start (no device).
  static absl::StatusOr<std::unique_ptr<Blas>> Create(Allocator& scratch, GemmPrecision precision);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cublasHandle_t handle() const { return handle_; }
  // The loaded cuBLAS (cublas_loader.h) to call with handle().
  const CublasApi& api() const { return api_; }
  GemmPrecision precision() const { return precision_; }
  void set_precision(GemmPrecision precision) { precision_ = precision; }

  // At least `nbytes` of device memory, valid until the next Scratch call (see stream note above).
  absl::StatusOr<void*> Scratch(size_t nbytes);

 private:
  Blas(const CublasApi& api, cublasHandle_t handle, Allocator& scratch, GemmPrecision precision)
      : api_(api), handle_(handle), allocator_(scratch), precision_(precision) {}

  const CublasApi& api_;
  cublasHandle_t handle_;
  Allocator& allocator_;
  GemmPrecision precision_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace shardline::kernels::cuda
