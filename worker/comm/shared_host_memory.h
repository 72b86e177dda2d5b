// Host memory that the other processes of this host can map: NCCL's ncclMemAlloc and MPI's
// MPI_Alloc_mem for the shared-memory communicator. A buffer allocated here can be read by a peer
// rank straight from its own mapping, with no copy into a segment and no system call per block,
// so an all-reduce over such buffers on every rank moves each byte once (ShmCommunicator's
// single copy). Any other buffer works as before; only the speed differs.
//
// Every block is its own memfd, mapped MAP_SHARED: a peer opens it through
// /proc/<pid>/fd/<fd> (the same permission as opening the communicator's segment) while the block
// is alive. The memory goes away with the last mapping, so a rank killed at any moment leaves
// nothing behind. Blocks are page-rounded and zero-filled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"

namespace shardline::comm {

class SharedHostAllocator final : public kernels::Allocator {
 public:
  SharedHostAllocator() = default;
  SharedHostAllocator(const SharedHostAllocator&) = delete;
  SharedHostAllocator& operator=(const SharedHostAllocator&) = delete;

  absl::StatusOr<void*> Allocate(size_t nbytes) override;
  void Deallocate(void* ptr, size_t nbytes) override;
  absl::Status FillZero(void* ptr, size_t nbytes) override;
  kernels::Device device() const override { return kernels::Device::kCpu; }
  kernels::AllocatorStats stats() const override { return counter_.stats(); }
  void ResetPeak() override { counter_.ResetPeak(); }

 private:
  kernels::AllocationCounter counter_;
};

// Where a peer finds `bytes` bytes at `data` of this process: the block's descriptor in this
// process, a number naming the block for as long as the process lives (descriptors are reused),
// the block's size and the offset of `data` in it.
struct SharedBlockRef {
  int fd = -1;
  uint64_t id = 0;
  size_t block_bytes = 0;
  size_t offset = 0;
};
// nullopt when [data, data + bytes) is not wholly inside one live block of this process.
std::optional<SharedBlockRef> FindSharedBlock(const void* data, size_t bytes);

}  // namespace shardline::comm
