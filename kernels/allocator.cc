#include "kernels/allocator.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"

namespace shardline::kernels {

absl::StatusOr<void*> CpuAllocator::Allocate(size_t nbytes) {
  // aligned_alloc wants a size that is a multiple of the alignment, and a zero-byte request must
  // still give a distinct pointer so that empty tensors can be told apart.
  const size_t rounded = nbytes == 0 ? kAlignment : (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < nbytes) {
    return absl::ResourceExhaustedError("CPU allocation of " + std::to_string(nbytes) +
                                        " bytes overflows size_t");
  }
  void* ptr = std::aligned_alloc(kAlignment, rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError("CPU allocation of " + std::to_string(nbytes) +
                                        " bytes failed (" + std::to_string(stats().bytes_in_use) +
                                        " bytes already in use)");
  }
  counter_.Allocated(nbytes);
  return ptr;
}

void CpuAllocator::Deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::free(ptr);
  counter_.Freed(nbytes);
}

absl::Status CpuAllocator::FillZero(void* ptr, size_t nbytes) {
  if (nbytes > 0) std::memset(ptr, 0, nbytes);
  return absl::OkStatus();
}

void AllocationCounter::Allocated(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in_use += nbytes;
  stats_.allocations += 1;
  if (stats_.bytes_in_use > stats_.peak_bytes) stats_.peak_bytes = stats_.bytes_in_use;
}

void AllocationCounter::Freed(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_in_use -= nbytes;
}

AllocatorStats AllocationCounter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void AllocationCounter::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.bytes_in_use;
}

}  // namespace shardline::kernels
