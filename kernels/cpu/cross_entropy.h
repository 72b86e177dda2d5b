// Softmax cross-entropy over the vocabulary, written as pieces that also make the vocab-parallel
// version (Megatron's): each tensor-parallel rank holds the logits of its vocabulary shard
// [v0, v0+Vs) and the ranks exchange three numbers per row (conventions: see matmul.h).
//
// Vocab-parallel forward, per rank (N rows, Vs = columns of this rank's shard):
//   CrossEntropyLocalStats(max, sumexp, target, logits_shard, targets, N, Vs, v0);
//   global_max = copy of max; all-reduce MAX(global_max);
//   CrossEntropyRescaleSumExp(sumexp, max, global_max, N);
//   all-reduce SUM(sumexp); all-reduce SUM(target);
//   CrossEntropyLossFromStats(losses, lse, global_max, sumexp, target, targets, N);
// backward, with no communication:
//   CrossEntropyBackwardShard(dlogits_shard, logits_shard, lse, targets, dlosses, N, Vs, v0);
// A single device is the one-shard case (CrossEntropyForward / CrossEntropyBackward).
//
// Targets are global token ids in [0, V) (check with ValidateTokens), or negative to ignore a row
// (padding): its loss is 0 and it has no gradient.
#pragma once

#include <cstdint>

namespace shardline::kernels::cpu {

// logits is (N,Vs), the columns [v0, v0+Vs) of the full (N,V) logits; targets is (N).
// local_max (N) = max over the shard; local_sumexp (N) = Σ exp(logit − local_max); target_logit (N)
// = the target's logit when the target lies in the shard, else 0 (so a sum over shards gives it).
void CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                            const float* logits, const int32_t* targets, int N, int Vs, int v0);

// sumexp (N) *= exp(local_max − global_max), re-basing each shard's sum on the global max so the
// shards' sums can be added.
void CrossEntropyRescaleSumExp(float* sumexp, const float* local_max, const float* global_max,
                               int N);

// From the combined statistics: lse (N) = global_max + log(global_sumexp), the log-normaliser kept
// for the backward; losses (N) = lse − target_logit, or 0 for an ignored row.
void CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                               const float* global_sumexp, const float* target_logit,
                               const int32_t* targets, int N);

// dlogits (N,Vs) += dlosses[n]·(softmax − onehot(target)) over the shard's columns, with
// softmax = exp(logit − lse[n]). dlosses (N) is typically 1/N per row for a mean loss.
void CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                               const int32_t* targets, const float* dlosses, int N, int Vs, int v0);

// Single device: logits (N,V) → losses (N) and lse (N).
void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int N, int V);
// dlogits (N,V) accumulates.
void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                          const int32_t* targets, const float* dlosses, int N, int V);

}  // namespace shardline::kernels::cpu
