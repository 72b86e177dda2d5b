#include "worker/serving/kv_block_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace shardline::serving {

KvBlockPool::KvBlockPool(int num_blocks) : allocated_(std::max(num_blocks, 0), false) {
  free_.reserve(allocated_.size());
  // Ascending order is already a valid min-heap.
  for (int32_t b = 0; b < num_blocks; ++b) free_.push_back(b);
}

bool KvBlockPool::allocated(int32_t block) const {
  return block >= 0 && block < num_blocks() && allocated_[block];
}

bool KvBlockPool::Allocate(int count, std::vector<int32_t>& out_append) {
  if (count < 0 || count > free_blocks()) return false;
  for (int i = 0; i < count; ++i) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<>());
    const int32_t block = free_.back();
    free_.pop_back();
    allocated_[block] = true;
    out_append.push_back(block);
  }
  return true;
}

void KvBlockPool::Free(std::span<const int32_t> blocks) {
  for (const int32_t block : blocks) {
    if (!allocated(block)) {
      // Not a Status: the caller's bookkeeping is already wrong, and going on would let two
      // sequences write the same cache block.
      std::fprintf(stderr, "KvBlockPool::Free: block %d of %d is not allocated (double free?)\n",
                   block, num_blocks());
      std::abort();
    }
    allocated_[block] = false;
    free_.push_back(block);
    std::push_heap(free_.begin(), free_.end(), std::greater<>());
  }
}

}  // namespace shardline::serving
