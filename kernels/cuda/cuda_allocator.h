// CudaCachingAllocator: device memory for one CUDA device, with a cache of freed blocks.
//
// cudaMalloc and cudaFree are slow (cudaFree synchronises the whole device), and a training step
// allocates and frees the same activation sizes every micro-batch. So freed blocks are kept in
// free lists keyed by their rounded size and handed out again; memory goes back to the driver only
// on EmptyCache(), on destruction, or when cudaMalloc fails and the cache is emptied to retry.
//
// Size classes: requests below 1 MiB are rounded up to a multiple of 512 B, larger ones to a
// multiple of 2 MiB (the large-page granularity of the driver, as PyTorch's caching allocator).
// A cached block serves a request whose rounded size is at most the block's and no less than half
// of it, so a huge block is never tied up by a small tensor. Blocks are never split.
//
// Stream semantics: a block is reused as soon as Deallocate returns, with no event recorded. That
// is safe when every kernel touching the allocator's memory runs on ONE stream (the actor's compute
// stream): the next user's kernels are ordered after the last user's. A caller that uses a block on
// another stream must synchronise that stream before the Tensor holding the block dies.
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/allocator.h"

namespace shardline::kernels::cuda {

// Empty when CUDA device `device` is usable, else why not (e.g. "cudaGetDeviceCount: CUDA driver
// version is insufficient for CUDA runtime version"), which tests print when they skip.
std::string CudaUnavailableReason(int device = 0);

// What a caching allocator adds to AllocatorStats.
struct CudaAllocatorStats {
  AllocatorStats base;        // bytes_in_use counts requested bytes, as every allocator's
  size_t bytes_reserved = 0;  // bytes currently obtained from cudaMalloc (in use + cached)
  size_t peak_reserved = 0;   // highest bytes_reserved since construction or ResetPeak()
  size_t bytes_cached = 0;    // reserved bytes sitting in the free lists
  uint64_t cache_hits = 0;    // Allocate calls served from the free lists
  uint64_t cuda_mallocs = 0;  // Allocate calls that had to call cudaMalloc
};

class CudaCachingAllocator final : public Allocator {
 public:
  static constexpr size_t kSmallRounding = 512;
  static constexpr size_t kLargeThreshold = size_t{1} << 20;
  static constexpr size_t kLargeRounding = size_t{2} << 20;

  // An allocator for CUDA device `device`. FailedPrecondition (with the CUDA error string) when no
  // CUDA device is usable at all, e.g. no driver; InvalidArgument when `device` is not one of the
  // visible devices.
  static absl::StatusOr<std::unique_ptr<CudaCachingAllocator>> Create(int device);

  // Frees the cached blocks. Blocks still handed out are a caller bug (the Allocator contract) and
  // are left alone rather than freed under a live tensor.
  ~CudaCachingAllocator() override;
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  // ResourceExhausted with cudaMalloc's error string when the device is out of memory even after
  // emptying the cache.
  absl::StatusOr<void*> Allocate(size_t nbytes) override;
  // The block goes to the free lists (see "Stream semantics" above).
  void Deallocate(void* ptr, size_t nbytes) override;
  // cudaMemset on the legacy default stream, which orders it with work on blocking streams.
  absl::Status FillZero(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::kCuda; }
  AllocatorStats stats() const override;
  void ResetPeak() override;

  CudaAllocatorStats cuda_stats() const;
  int device_index() const { return device_; }
  // Returns every cached block to the driver (cudaFree synchronises the device).
  absl::Status EmptyCache();

  // The size a request of `nbytes` occupies (its size class).
  static size_t RoundSize(size_t nbytes);

 private:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  // Both require mu_ held and the allocator's device current.
  absl::Status EmptyCacheLocked();
  void UpdatePeaksLocked();

  const int device_;
  mutable std::mutex mu_;
  // Guarded by mu_.
  std::multimap<size_t, void*> free_blocks_;       // block size -> block, best fit by lower_bound
  std::unordered_map<void*, size_t> live_blocks_;  // block -> its (rounded) size
  CudaAllocatorStats stats_;
};

}  // namespace shardline::kernels::cuda
