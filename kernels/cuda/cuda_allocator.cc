#include "kernels/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "kernels/cuda/cuda_status.h"

namespace shardline::kernels::cuda {

std::string CudaUnavailableReason(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(error);
  }
  if (count == 0) return "no usable CUDA device: cudaGetDeviceCount found none";
  if (device < 0 || device >= count) {
    return "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
           " visible)";
  }
  return "";
}

absl::StatusOr<std::unique_ptr<CudaCachingAllocator>> CudaCachingAllocator::Create(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        "CUDA allocator for device " + std::to_string(device) +
        ": no usable CUDA device: cudaGetDeviceCount: " + cudaGetErrorString(error));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("CUDA allocator for device " + std::to_string(device) +
                                         ": cudaGetDeviceCount found no CUDA device");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError("CUDA allocator: device " + std::to_string(device) +
                                      " does not exist (" + std::to_string(count) + " visible)");
  }
  return std::unique_ptr<CudaCachingAllocator>(new CudaCachingAllocator(device));
}

CudaCachingAllocator::~CudaCachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  // Nothing to report to: a failure here means the context is already gone, and the memory with it.
  if (guard.status().ok()) (void)EmptyCacheLocked();
}

size_t CudaCachingAllocator::RoundSize(size_t nbytes) {
  if (nbytes == 0) return kSmallRounding;  // a distinct pointer for an empty tensor
  if (nbytes < kLargeThreshold)
    return (nbytes + kSmallRounding - 1) / kSmallRounding * kSmallRounding;
  const size_t blocks = nbytes / kLargeRounding + (nbytes % kLargeRounding != 0 ? 1 : 0);
  return blocks * kLargeRounding;  // overflow is caught by the caller (rounded < nbytes)
}

absl::StatusOr<void*> CudaCachingAllocator::Allocate(size_t nbytes) {
  const size_t rounded = RoundSize(nbytes);
  if (rounded < nbytes) {
    return absl::ResourceExhaustedError("CUDA allocation of " + std::to_string(nbytes) +
                                        " bytes overflows size_t");
  }
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  size_t block_size = rounded;
  // Best fit: the smallest cached block that is large enough, if it is not more than twice the
  // request (a 1 GiB block must not end up holding a 2 MiB tensor).
  auto it = free_blocks_.lower_bound(rounded);
  if (it != free_blocks_.end() && it->first / 2 <= rounded) {
    block_size = it->first;
    ptr = it->second;
    free_blocks_.erase(it);
    stats_.bytes_cached -= block_size;
    stats_.cache_hits += 1;
  } else {
    DeviceGuard guard(device_);
    if (!guard.status().ok()) return guard.status();
    cudaError_t error = cudaMalloc(&ptr, rounded);
    if (error == cudaErrorMemoryAllocation && !free_blocks_.empty()) {
      // The memory may be sitting in the cache in the wrong sizes: give it back and try once more.
      cudaGetLastError();
      absl::Status emptied = EmptyCacheLocked();
      if (!emptied.ok()) return emptied;
      error = cudaMalloc(&ptr, rounded);
    }
    if (error != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          "CUDA allocation of " + std::to_string(nbytes) + " bytes on device " +
          std::to_string(device_) + " failed: " + cudaGetErrorString(error) + " (" +
          std::to_string(stats_.base.bytes_in_use) + " bytes in use, " +
          std::to_string(stats_.bytes_reserved) + " reserved)");
    }
    stats_.bytes_reserved += rounded;
    stats_.cuda_mallocs += 1;
  }
  live_blocks_.emplace(ptr, block_size);
  stats_.base.bytes_in_use += nbytes;
  stats_.base.allocations += 1;
  UpdatePeaksLocked();
  return ptr;
}

void CudaCachingAllocator::Deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_blocks_.find(ptr);
  // A pointer this allocator never handed out is a caller bug; ignoring it keeps the accounting
  // consistent instead of corrupting the free lists with a foreign block.
  if (it == live_blocks_.end()) return;
  const size_t block_size = it->second;
  live_blocks_.erase(it);
  free_blocks_.emplace(block_size, ptr);
  stats_.bytes_cached += block_size;
  stats_.base.bytes_in_use -= nbytes;
}

absl::Status CudaCachingAllocator::FillZero(void* ptr, size_t nbytes) {
  if (nbytes == 0) return absl::OkStatus();
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  return CudaStatus(cudaMemset(ptr, 0, nbytes),
                    "cudaMemset of " + std::to_string(nbytes) + " bytes");
}

AllocatorStats CudaCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.base;
}

CudaAllocatorStats CudaCachingAllocator::cuda_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CudaCachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.base.peak_bytes = stats_.base.bytes_in_use;
  stats_.peak_reserved = stats_.bytes_reserved;
}

absl::Status CudaCachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  return EmptyCacheLocked();
}

absl::Status CudaCachingAllocator::EmptyCacheLocked() {
  absl::Status first_error;
  for (auto& [size, ptr] : free_blocks_) {
    const cudaError_t error = cudaFree(ptr);
    if (error != cudaSuccess && first_error.ok()) {
      first_error =
          CudaStatus(error, "cudaFree of a cached block of " + std::to_string(size) + " bytes");
    }
    stats_.bytes_reserved -= size;
  }
  free_blocks_.clear();
  stats_.bytes_cached = 0;
  return first_error;
}

void CudaCachingAllocator::UpdatePeaksLocked() {
  if (stats_.base.bytes_in_use > stats_.base.peak_bytes)
    stats_.base.peak_bytes = stats_.base.bytes_in_use;
  if (stats_.bytes_reserved > stats_.peak_reserved) stats_.peak_reserved = stats_.bytes_reserved;
}

}  // namespace shardline::kernels::cuda
