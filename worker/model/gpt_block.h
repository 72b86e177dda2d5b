// One pre-norm transformer block, forward and backward, over raw buffers in the memory of the
// backend that runs it (kernels/backend.h: the CPU's or CUDA's). GPT-2's and Llama's blocks are
// the same steps with other kernels, as the config's rows pick them (model/model_config.h):
//
//   x (B,T,C) ─ norm1 ─ q/k/v linear ─ [rotary q, k] ─ causal attention ─ attn_proj ─(+x)→ r
//   r ─ norm2 ─ MLP ─(+r)→ y (B,T,C)
//
// where a norm is LayerNorm or RMSNorm, the MLP is fc → GELU → fc_proj or
// down(silu(gate·x) · up·x) (SwiGLU), and attention is grouped-query: NH query heads over KVH
// key/value heads (KVH = NH: GPT-2's). Written as Megatron's parallel layers so that tensor
// parallelism reuses it unchanged: q/k/v, fc, gate and up are column-parallel (a rank holds NH of
// the heads, KVH of the key/value heads and F of the MLP columns), attn_proj and fc_proj/down are
// row-parallel (their partial outputs are summed across ranks by `all_reduce` before their bias is
// added once). On one device `all_reduce` is empty and NH, KVH, F are the full sizes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "model/model_config.h"
#include "placement/parallel_layout.h"
#include "worker/model/param_layout.h"

namespace shardline::model {

// Sums `n` floats in place across the tensor-parallel group. Empty on a single device.
using AllReduceFn = std::function<absl::Status(float* data, int64_t n)>;

// The attention step of a block: atty (N,NH,HS) from qkv (N,NH+2·KVH,HS), its queries and keys
// already turned by the rotary positions where the model has them. Empty means causal
// self-attention over each (B,T) row (training, and a whole-prompt forward); inference with a KV
// cache passes one that writes the step's keys and values into the cache and attends over it, so
// that training and serving share every other line of the block.
using AttentionFn = std::function<absl::Status(const float* qkv, float* atty)>;

struct BlockDims {
  int B = 0;
  int T = 0;
  int C = 0;   // d_model: the residual stream is never split
  int NH = 0;  // query heads held here
  int HS = 0;  // channels per head
  int F = 0;   // MLP columns held here
  float eps = 1e-5f;  // the norms' epsilon (ModelConfig::norm_eps)
  int KVH = 0;        // key/value heads held here; 0: NH
  NormKind norm = NormKind::kLayerNorm;
  MlpKind mlp = MlpKind::kGelu;
  // Rotary positions (null for learned ones): the inverse frequencies (HS/2), and each row's
  // position (N; null: the rows are B sequences at 0..T-1), both in the backend's memory.
  const float* rope_inv_freq = nullptr;
  const int32_t* rope_positions = nullptr;

  // A config's block over B rows of T with the heads, key/value heads and MLP columns a rank holds
  // (the whole model's on one device); the rotary pointers are the caller's to set.
  static BlockDims Of(const ModelConfig& config, int B, int T, int heads, int kv_heads, int ff) {
    return BlockDims{.B = B,
                     .T = T,
                     .C = static_cast<int>(config.d_model),
                     .NH = heads,
                     .HS = static_cast<int>(config.head_size()),
                     .F = ff,
                     .eps = static_cast<float>(config.norm_eps),
                     .KVH = kv_heads,
                     .norm = config.norm,
                     .mlp = config.mlp};
  }

  int64_t N() const { return int64_t{B} * T; }
  int Attn() const { return NH * HS; }  // attention output width held here
  int kv() const { return KVH > 0 ? KVH : NH; }
  int QkvWidth() const { return (NH + 2 * kv()) * HS; }                 // a row of qkv
  int MlpWidth() const { return mlp == MlpKind::kSwiGlu ? 2 * F : F; }  // a row of fch
};

// The rotary inverse frequencies (head_size / 2) of a config with rotary positions, with its
// rope_scaling, as transformers computes them; empty for learned positions.
std::vector<float> RotaryFrequencies(const ModelConfig& config);

// The block's norms (and the final one): LayerNorm (mean and rstd kept) or RMSNorm (rstd kept;
// mean and the bias unused). The backward accumulates into dinp, dweight and dbias.
absl::Status NormForward(kernels::Backend& backend, NormKind kind, float* out, float* mean,
                         float* rstd, const float* inp, const float* weight, const float* bias,
                         int N, int C, float eps);
absl::Status NormBackward(kernels::Backend& backend, NormKind kind, float* dinp, float* dweight,
                          float* dbias, const float* dout, const float* inp, const float* weight,
                          const float* mean, const float* rstd, int N, int C);

// What one block's forward keeps for its backward.
struct BlockActivations {
  float* ln1 = nullptr;        // (B,T,C)
  float* ln1_mean = nullptr;   // (B,T): LayerNorm only
  float* ln1_rstd = nullptr;   // (B,T)
  float* qkv = nullptr;        // (B,T,NH+2·KVH,HS): the attention kernel's layout, after rotary
  float* atty = nullptr;       // (B,T,NH,HS)
  float* att_lse = nullptr;    // (B,NH,T)
  float* resid_mid = nullptr;  // (B,T,C): x + attention branch
  float* ln2 = nullptr;        // (B,T,C)
  float* ln2_mean = nullptr;   // (B,T)
  float* ln2_rstd = nullptr;   // (B,T)
  float* fch = nullptr;        // (B,T,F) before GELU; SwiGLU: gate (B,T,F) then up (B,T,F)
  float* fch_gelu = nullptr;   // (B,T,F): the activation's output
};

// Scratch for one block's backward, reused by every block (it is zeroed on entry).
struct BlockGradScratch {
  float* dresid_mid = nullptr;  // (B,T,C)
  float* dln = nullptr;         // (B,T,C): dln2, then dln1
  float* dfch_gelu = nullptr;   // (B,T,F)
  float* dfch = nullptr;        // as fch
  float* datty = nullptr;       // (B,T,NH,HS)
  float* dqkv = nullptr;        // (B,T,NH+2·KVH,HS)
  // With key/value heads replicated over tensor-parallel ranks: this micro-batch's q/k/v weight
  // gradient (QkvWidth, C), its k and v rows summed over the ranks sharing them before it is
  // added; else null.
  float* dqkv_weight = nullptr;
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
// x and `acts` are the forward's. `kv_grad_sum`, when the rank's key/value heads are replicated
// over several tensor-parallel ranks (tp > kv_heads), sums a gradient of those heads' k and v
// weights (in scratch.dqkv_weight) over the ranks that hold the same heads, each of which saw only
// its own query heads' part; null otherwise.
absl::Status BlockBackward(kernels::Backend& backend, const BlockDims& dims,
                           const BlockParams& params, const BlockParams& grads, const float* x,
                           const float* dy, float* dx, const BlockActivations& acts,
                           const BlockGradScratch& scratch, const AllReduceFn& all_reduce = nullptr,
                           const AllReduceFn& kv_grad_sum = nullptr);

}  // namespace shardline::model
