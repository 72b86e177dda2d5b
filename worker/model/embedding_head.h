// The two ends of the model, as Megatron's vocab-parallel layers, shared by training (ShardedGpt)
// and inference (PagedGptForward) on any backend: the token and position embedding at the start,
// and the final norm, the head and the cross-entropy at the end.
//
// Vocab parallel: a tensor-parallel rank holds the rows [vocab_begin, vocab_end) of the token
// embedding and of the head. The embedding gives zero for the other tokens and the group sums it
// (one all-reduce); the head gives the rank's columns of the logits only, and the cross-entropy
// needs three numbers per row from the group (a max and two sums), so no rank ever holds the full
// logits. Without tensor parallelism the reductions are empty and the ranges the whole vocabulary.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "worker/model/gpt_block.h"

namespace shardline::model {

struct EmbeddingWeights {
  const float* wte = nullptr;  // (vocab_end - vocab_begin, C)
  const float* wpe = nullptr;  // (max_seq_len, C); null without learned positions
  int vocab_begin = 0, vocab_end = 0;
};

// x (N,C) = wte[tokens] summed over the group by `all_reduce` (empty: one rank) + wpe[positions]
// (when the model has wpe); positions null means N / T sequences of T tokens at positions 0..T-1.
absl::Status EmbeddingForward(kernels::Backend& backend, const EmbeddingWeights& weights,
                              const int32_t* tokens, const int32_t* positions, int N, int T, int C,
                              float* x, const AllReduceFn& all_reduce);
// dwte, dwpe accumulate the gradient dx (N,C) of a training batch (positions 0..T-1). Either may
// be null.
absl::Status EmbeddingBackward(kernels::Backend& backend, const EmbeddingWeights& weights,
                               float* dwte, float* dwpe, const float* dx, const int32_t* tokens,
                               int N, int T, int C);

struct HeadWeights {
  const float* norm_w = nullptr;  // (C): the final norm
  const float* norm_b = nullptr;  // (C); null for RMSNorm
  NormKind norm = NormKind::kLayerNorm;
  const float* head = nullptr;    // (vocab_end - vocab_begin, C): wte's rows when tied
  const kernels::cpu::PackedWeight* packed = nullptr;  // Backend::PackWeight's copy, or null
  int vocab_begin = 0, vocab_end = 0;
  float eps = 1e-5f;
  int vocab_shard() const { return vocab_end - vocab_begin; }
};

// What the head's forward keeps for its backward, for N rows.
struct HeadActivations {
  float* norm = nullptr;    // (N,C)
  float* mean = nullptr;    // (N): LayerNorm only
  float* rstd = nullptr;    // (N)
  float* logits = nullptr;  // (N, vocab shard)
};

// logits (N, vocab shard) = head · norm(x (N,C)).
absl::Status HeadForward(kernels::Backend& backend, const HeadWeights& weights, const float* x,
                         int N, int C, const HeadActivations& acts);

// The cross-entropy's per-row statistics over the group, each (N).
struct LossActivations {
  float* losses = nullptr;
  float* lse = nullptr;
  float* local_max = nullptr;
  float* global_max = nullptr;
  float* sumexp = nullptr;
  float* target_logit = nullptr;
};

// losses (N) = −log softmax(logits)[target] over the whole vocabulary, from the rank's columns:
// `sum` and `max` all-reduce over the tensor-parallel group (both empty on one rank). A negative
// target has loss 0 and no gradient.
absl::Status VocabParallelCrossEntropy(kernels::Backend& backend, const HeadWeights& weights,
                                       const float* logits, const int32_t* targets, int N,
                                       const LossActivations& acts, const AllReduceFn& sum,
                                       const AllReduceFn& max);

// The gradient of the loss (each row's weighted by dlosses (N)) back through the head: writes
// dnorm (N,C), the gradient of the final norm's output (this rank's part: sum it over the group
// with FinalNormBackward), and accumulates into dhead. `dlogits` (N, vocab shard) is scratch.
absl::Status HeadBackward(kernels::Backend& backend, const HeadWeights& weights, float* dhead,
                          float* dnorm, float* dlogits, const float* dlosses,
                          const int32_t* targets, int N, int C, const HeadActivations& acts,
                          const LossActivations& loss);
// dx (N,C) = the gradient of the head's input x from dnorm (summed over the group first by
// `all_reduce`: the input was replicated); accumulates into the norm's dweight and dbias.
absl::Status FinalNormBackward(kernels::Backend& backend, const HeadWeights& weights,
                               float* dnorm_w, float* dnorm_b, float* dnorm, const float* x,
                               float* dx, int N, int C, const HeadActivations& acts,
                               const AllReduceFn& all_reduce);

}  // namespace shardline::model
