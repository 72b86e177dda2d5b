#include "kernels/cuda/blas.h"

#include "kernels/cuda/cublas_loader.h"
#include "kernels/cuda/cuda_status.h"

namespace shardline::kernels::cuda {

absl::StatusOr<std::unique_ptr<Blas>> Blas::Create(Allocator& scratch, GemmPrecision precision) {
  if (scratch.device() != Device::kCuda) {
    return absl::InvalidArgumentError("cuda::Blas needs a CUDA allocator for its scratch memory");
  }
  absl::StatusOr<const CublasApi*> api = Cublas();
  if (!api.ok()) return api.status();
  cublasHandle_t handle = nullptr;
  // Without a device, cublasCreate reports NOT_INITIALIZED, which CublasStatus makes
  // FailedPrecondition.
  absl::Status status = CublasStatus((*api)->create(&handle), "cublasCreate");
  if (!status.ok()) return status;
  return std::unique_ptr<Blas>(new Blas(**api, handle, scratch, precision));
}

Blas::~Blas() {
  // The scratch block may still be read by queued GEMMs; handing it back is stream-ordered with
  // them under the single-stream rule of CudaCachingAllocator.
  if (scratch_ != nullptr) allocator_.Deallocate(scratch_, scratch_bytes_);
  api_.destroy(handle_);
}

absl::StatusOr<void*> Blas::Scratch(size_t nbytes) {
  if (nbytes <= scratch_bytes_) return scratch_;
  if (scratch_ != nullptr) {
    allocator_.Deallocate(scratch_, scratch_bytes_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  // Grow by at least half again, so that a run of slightly larger GEMMs does not reallocate each
  // time.
  const size_t want = nbytes + nbytes / 2;
  absl::StatusOr<void*> block = allocator_.Allocate(want);
  if (!block.ok()) return block.status();
  scratch_ = *block;
  scratch_bytes_ = want;
  return scratch_;
}

}  // namespace shardline::kernels::cuda
