// Attention for inference over a paged KV cache (vLLM's PagedAttention), on the CPU (conventions:
// see matmul.h).
//
// A sequence's keys and values live in fixed-size cache blocks of block_size positions each,
// anywhere in the cache: row `seq` of the block table lists them, so position pos is in block
// block_tables[seq][pos / block_size] at offset pos % block_size. One step of a continuously
// batched forward is N tokens, flattened: prefill chunks (several consecutive positions of one
// sequence) and single-token decodes of many sequences, in any order. qkv is (N,NH+2·KVH,HS), the
// training kernel's (attention.h) layout with B·T = N; out is (N,NH,HS). The cache holds the KVH
// key/value heads (grouped-query attention's smaller cache).
//
// Batch invariance: a token's output depends only on its query and its own sequence's cached keys
// and values at positions 0..pos, never on the other tokens of the step, their order, the thread
// count, the block size or where the blocks sit. Each (token, head) pair is computed on one
// thread, with every sum in position order (the dot products over HS in a fixed lane order) and
// the online softmax rescaled at fixed positions (every 64), so the same token gets the same bits
// whether it is decoded alone, in a batch, or computed inside a prefill chunk.
#pragma once

#include <cstdint>

#include "kernels/paged_attention_batch.h"

namespace shardline::kernels::cpu {

// The step's tokens (kernels/paged_attention_batch.h), its arrays in host memory here.
using kernels::PagedAttentionBatch;

// One layer's cache: k_cache and v_cache are each (num_blocks, block_size, KVH, HS).
// Writes each token's keys and values (from qkv (N,NH+2·KVH,HS), the training kernel's layout) into
// its slot: block block_tables[seq][pos / block_size], offset pos % block_size. The tokens of a
// step must have distinct (seq, pos) slots.
void PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                  const PagedAttentionBatch& batch, int NH, int KVH, int HS);

// out (N,NH,HS): each token's query (from qkv) attends the keys/values at positions 0..pos of
// its own sequence in the cache (causal; so call PagedKvWrite for the step first: tokens of the
// same sequence in the same step see each other's keys as the causal mask allows).
// softmax(q·kᵀ/√HS)·v, fp32 with the max subtracted. Every slot at positions 0..pos must have
// been written, by this step or an earlier one.
void PagedAttentionForward(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                           const PagedAttentionBatch& batch, int NH, int KVH, int HS);

}  // namespace shardline::kernels::cpu
