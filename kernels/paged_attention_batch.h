// One step of a continuously batched inference forward, as the paged KV-cache attention of either
// backend reads it (kernels/cpu/paged_attention.h says how; Backend::PagedAttention). Plain C++17
// (nvcc reads it too). The arrays are in the memory of the backend that runs the step.
#pragma once

#include <cstdint>

namespace shardline::kernels {

struct PagedAttentionBatch {
  int num_tokens = 0;                     // N
  const int32_t* token_seq = nullptr;     // (N): the sequence (row of block_tables) of each token
  const int32_t* positions = nullptr;     // (N): each token's position in its sequence
  const int32_t* block_tables = nullptr;  // (num_seqs, max_blocks_per_seq): cache block of each
                                          // block_size positions of a sequence
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  int block_size = 0;  // positions per block
  int num_blocks = 0;  // blocks in the cache (for bounds checks in debug)
};

}  // namespace shardline::kernels
