// Causal multi-head self-attention on the CPU (conventions: see matmul.h).
//
// Layout as llm.c, with grouped-query attention: qkv is (B,T,NH+2·KVH,HS) — for each token, the NH
// query heads, then the KVH key heads, then the KVH value heads (KVH = NH: (B,T,3,NH,HS), GPT-2's
// fused QKV) — out is (B,T,NH,HS). Each key/value head serves NH / KVH consecutive query heads
// (Hugging Face's repeat_kv). The kernels work on whichever heads qkv holds, so tensor parallelism
// splits heads by giving each rank the qkv of its own heads (the output of its column-parallel QKV
// projection, laid out per head group the same way) and NH, KVH = heads per rank.
//
// The forward is blocked with an online softmax (flash-attention style, as PyTorch 2's CPU
// kernel): per (b, head), a tile of 64 queries walks the tiles of 64 keys at or before it, so K and
// V tiles stay in L1/L2 and the (T,T) score matrix is never stored. Each tile's products (scores
// Q·Kᵀ, output P·V; in the backward also dO·Vᵀ, Pᵀ·dO, dSᵀ·Q, dS·K) are BLAS calls. Only the
// log-sum-exp per query row is kept (B·NH·T floats); the backward recomputes the probabilities
// from it. Threads (OpenMP) take whole (b, head) pairs, so each head's work is private and the
// result does not depend on the thread count.
#pragma once

namespace shardline::kernels::cpu {

// out (B,T,NH,HS) = softmax(q·kᵀ/√HS + causal mask)·v per (b, head); lse (B,NH,T) is written for
// the backward pass.
// KVH divides NH.
void AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH,
                      int HS);

// dout is (B,T,NH,HS); dqkv (B,T,NH+2·KVH,HS) accumulates. out and lse are the forward's.
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int B, int T, int NH, int KVH, int HS);

}  // namespace shardline::kernels::cpu
