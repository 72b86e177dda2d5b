// One transformer block (pre-LayerNorm, as GPT-2), forward and backward, over raw buffers in the
// memory of the backend that runs it (kernels/backend.h: the CPU's or CUDA's):
//
//   x (B,T,C) ─ ln1 ─ qkv linear ─ causal attention ─ attn_proj linear ─(+x)→ r (B,T,C)
//   r ─ ln2 ─ fc linear ─ GELU ─ fc_proj linear ─(+r)→ y (B,T,C)
//
// Written as Megatron's parallel layers so that tensor parallelism reuses it unchanged: qkv and fc
// are column-parallel (a rank holds NH of the heads and F of the MLP columns), attn_proj and
// fc_proj are row-parallel (their partial outputs are summed across ranks by `all_reduce` before
// their bias is added once). On one device `all_reduce` is empty and NH, F are the full sizes.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "placement/parallel_layout.h"
#include "worker/model/param_layout.h"

namespace shardline::model {

// Sums `n` floats in place across the tensor-parallel group. Empty on a single device.
using AllReduceFn = std::function<absl::Status(float* data, int64_t n)>;

// The attention step of a block: atty (N,NH,HS) from qkv (N,3,NH,HS). Empty means causal
// self-attention over each (B,T) row (training, and a whole-prompt forward); inference with a KV
// cache passes one that writes the step's keys and values into the cache and attends over it, so
// that training and serving share every other line of the block.
using AttentionFn = std::function<absl::Status(const float* qkv, float* atty)>;

struct BlockDims {
  int B = 0;
  int T = 0;
  int C = 0;   // d_model: the residual stream is never split
  int NH = 0;  // heads held here
  int HS = 0;  // channels per head
  int F = 0;   // MLP columns held here
  float eps = 1e-5f;  // the norms' epsilon (ModelConfig::norm_eps)
  int64_t N() const { return int64_t{B} * T; }
  int Attn() const { return NH * HS; }  // attention width held here (C on one device)
};

// What one block's forward keeps for its backward.
struct BlockActivations {
  float* ln1 = nullptr;        // (B,T,C)
  float* ln1_mean = nullptr;   // (B,T)
  float* ln1_rstd = nullptr;   // (B,T)
  float* qkv = nullptr;        // (B,T,3,NH,HS): the attention kernel's layout
  float* atty = nullptr;       // (B,T,NH,HS)
  float* att_lse = nullptr;    // (B,NH,T)
  float* resid_mid = nullptr;  // (B,T,C): x + attention branch
  float* ln2 = nullptr;        // (B,T,C)
  float* ln2_mean = nullptr;   // (B,T)
  float* ln2_rstd = nullptr;   // (B,T)
  float* fch = nullptr;        // (B,T,F): before GELU
  float* fch_gelu = nullptr;   // (B,T,F)
};

// Scratch for one block's backward, reused by every block (it is zeroed on entry).
struct BlockGradScratch {
  float* dresid_mid = nullptr;  // (B,T,C)
  float* dln = nullptr;         // (B,T,C): dln2, then dln1
  float* dfch_gelu = nullptr;   // (B,T,F)
  float* dfch = nullptr;        // (B,T,F)
  float* datty = nullptr;       // (B,T,NH,HS)
  float* dqkv = nullptr;        // (B,T,3,NH,HS)
};

// y (B,T,C) = block(x (B,T,C)), filling `acts`. y may not alias x (the backward needs x). With
// an `attention` step, acts.att_lse is not written (and the backward is not available).
absl::Status BlockForward(kernels::Backend& backend, const BlockDims& dims,
                          const BlockParams& params, const float* x, float* y,
                          const BlockActivations& acts, const AllReduceFn& all_reduce = nullptr,
                          const AttentionFn& attention = nullptr);

// Refills what a block run under `mode` did not keep from its forward (CarveKeptBlockActivations
// in carver.h), so that BlockBackward can run: kSelective recomputes both LayerNorms' outputs,
// the attention output with its log-sum-exp, and the GELU, from x and the kept q/k/v, residual
// and MLP pre-activation (no matrix multiply, no communication); kFull reruns the whole forward
// from x into `acts`, with its tensor-parallel all-reduces, writing the block's output to y (the
// caller may pass the forward's own output buffer: the values are the same bits). kNone: nothing.
// The recomputed values equal the forward's bit for bit (same kernels, same inputs).
absl::Status RecomputeBlock(kernels::Backend& backend, placement::RecomputeMode mode,
                            const BlockDims& dims, const BlockParams& params, const float* x,
                            float* y, const BlockActivations& acts,
                            const AllReduceFn& all_reduce = nullptr);

// dy (B,T,C) is the gradient of y. Accumulates into dx (B,T,C) and every tensor of `grads`.
// x and `acts` are the forward's.
absl::Status BlockBackward(kernels::Backend& backend, const BlockDims& dims,
                           const BlockParams& params, const BlockParams& grads, const float* x,
                           const float* dy, float* dx, const BlockActivations& acts,
                           const BlockGradScratch& scratch,
                           const AllReduceFn& all_reduce = nullptr);

}  // namespace shardline::model
