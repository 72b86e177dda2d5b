// The free list of a paged KV cache: `num_blocks` fixed-size blocks, handed out by index. The
// cache memory itself lives in the model; this only says which block belongs to whom. No I/O, no
// threads, no locks: its one owner (the batch scheduler) calls it from one thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace shardline::serving {

class KvBlockPool {
 public:
  // num_blocks >= 0 (the scheduler's Create checks its limits before making one).
  explicit KvBlockPool(int num_blocks);

  int num_blocks() const { return static_cast<int>(allocated_.size()); }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  bool allocated(int32_t block) const;

  // Appends `count` (>= 0) free blocks to `out_append`, lowest index first, or returns false and
  // takes none when fewer are free. Deterministic: the same calls hand out the same blocks.
  bool Allocate(int count, std::vector<int32_t>& out_append);

  // Returns `blocks` to the pool. Each must be allocated: a block freed twice (or one outside the
  // pool) is a bug in the caller that would hand one block to two sequences, so it aborts.
  void Free(std::span<const int32_t> blocks);

 private:
  std::vector<bool> allocated_;  // by block index
  std::vector<int32_t> free_;    // a min-heap (std::greater) of the free indices
};

}  // namespace shardline::serving
