// Attention for inference over a paged KV cache (vLLM's PagedAttention), on the CPU (conventions:
// see matmul.h).
//
// A sequence's keys and values live in fixed-size cache blocks of block_size positions each,
// anywhere in the cache: row `seq` of the block table lists them, so position pos is in block
// block_tables[seq][pos / block_size] at offset pos % block_size. One step of a continuously
// batched forward is N tokens, flattened: prefill chunks (several consecutive positions of one
// sequence) and single-token decodes of many sequences, in any order. qkv is (N,3,NH,HS), the
// training kernel's (attention.h) layout with B·T = N; out is (N,NH,HS).
//
// Batch invariance: a token's output depends only on its query and its own sequence's cached keys
// and values at positions 0..pos, never on the other tokens of the step, their order, the thread
// count, the block size or where the blocks sit. Each (token, head) pair is computed on one
// thread, with every sum in position order (the dot products over HS in a fixed lane order) and
// the online softmax rescaled at fixed positions (every 64), so the same token gets the same bits
// whether it is decoded alone, in a batch, or computed inside a prefill chunk.
#pragma once

#include <cstdint>

namespace shardline::kernels::cpu {

// One step of a continuously batched forward: N tokens from several sequences, flattened.
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

// One layer's cache: k_cache and v_cache are each (num_blocks, block_size, NH, HS).
// Writes each token's key and value (from qkv (N,3,NH,HS), the training kernel's layout) into
// its slot: block block_tables[seq][pos / block_size], offset pos % block_size. The tokens of a
// step must have distinct (seq, pos) slots.
void PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                  const PagedAttentionBatch& batch, int NH, int HS);

// out (N,NH,HS): each token's query (from qkv) attends the keys/values at positions 0..pos of
// its own sequence in the cache (causal; so call PagedKvWrite for the step first: tokens of the
// same sequence in the same step see each other's keys as the causal mask allows).
// softmax(q·kᵀ/√HS)·v, fp32 with the max subtracted. Every slot at positions 0..pos must have
// been written, by this step or an earlier one.
void PagedAttentionForward(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                           const PagedAttentionBatch& batch, int NH, int HS);

}  // namespace shardline::kernels::cpu
