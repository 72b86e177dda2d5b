// Per-device memory allocators with byte accounting (in use, peak), which the memory planner's
// estimates are checked against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace shardline::kernels {

struct AllocatorStats {
  size_t bytes_in_use = 0;  // bytes requested by live allocations (not rounded up)
  size_t peak_bytes = 0;    // highest bytes_in_use since construction or the last ResetPeak()
  uint64_t allocations = 0;  // number of successful Allocate calls, ever
};

// Hands out raw device memory. Every method is thread-safe. An allocator must outlive every block
// (and so every Tensor) it handed out.
class Allocator {
 public:
  virtual ~Allocator() = default;

  // A block of at least `nbytes` (0 is allowed and still gives a unique pointer), or
  // ResourceExhausted naming the size when the device is out of memory.
  virtual absl::StatusOr<void*> Allocate(size_t nbytes) = 0;
  // Returns a block from Allocate; `nbytes` must be the size it was asked for. nullptr is a no-op.
  virtual void Deallocate(void* ptr, size_t nbytes) = 0;
  // Sets `nbytes` bytes at `ptr` (inside a block of this allocator) to zero.
  virtual absl::Status FillZero(void* ptr, size_t nbytes) = 0;

  virtual Device device() const = 0;
  virtual AllocatorStats stats() const = 0;
  // Starts a new peak window: peak_bytes becomes the current bytes_in_use.
  virtual void ResetPeak() = 0;
};

// The byte accounting every host allocator keeps, thread-safe: Allocated after a block is handed
// out, Freed when it comes back.
class AllocationCounter {
 public:
  void Allocated(size_t nbytes);
  void Freed(size_t nbytes);
  AllocatorStats stats() const;
  void ResetPeak();

 private:
  mutable std::mutex mu_;
  AllocatorStats stats_;  // guarded by mu_
};

// Host memory aligned to 64 bytes (a cache line, and the widest vector load), so that kernels and
// OpenBLAS never straddle a line at the start of a tensor.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;

  CpuAllocator() = default;
  CpuAllocator(const CpuAllocator&) = delete;
  CpuAllocator& operator=(const CpuAllocator&) = delete;

  absl::StatusOr<void*> Allocate(size_t nbytes) override;
  void Deallocate(void* ptr, size_t nbytes) override;
  absl::Status FillZero(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::kCpu; }
  AllocatorStats stats() const override { return counter_.stats(); }
  void ResetPeak() override { counter_.ResetPeak(); }

 private:
  AllocationCounter counter_;
};

}  // namespace shardline::kernels
