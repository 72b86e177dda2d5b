#include "worker/model/embedding_head.h"

#include "common/status_macros.h"

namespace shardline::model {

absl::Status EmbeddingForward(kernels::Backend& be, const EmbeddingWeights& w,
                              const int32_t* tokens, const int32_t* positions, int N, int T, int C,
                              float* x, const AllReduceFn& all_reduce) {
  RETURN_IF_ERROR(be.TokenEmbedding(x, tokens, w.wte, N, C, w.vocab_begin, w.vocab_end));
  if (all_reduce) {
    RETURN_IF_ERROR(Annotate(all_reduce(x, int64_t{N} * C), "all-reduce of the embedding"));
  }
  if (w.wpe == nullptr) return absl::OkStatus();  // rotary positions act inside the blocks
  return be.PositionEmbedding(x, w.wpe, positions, N, T, C);
}

absl::Status EmbeddingBackward(kernels::Backend& be, const EmbeddingWeights& w, float* dwte,
                               float* dwpe, const float* dx, const int32_t* tokens, int N, int T,
                               int C) {
  if (dwte != nullptr) {
    RETURN_IF_ERROR(be.TokenEmbeddingBackward(dwte, dx, tokens, N, C, w.vocab_begin, w.vocab_end));
  }
  if (dwpe != nullptr) RETURN_IF_ERROR(be.PositionEmbeddingBackward(dwpe, dx, N / T, T, C));
  return absl::OkStatus();
}

absl::Status HeadForward(kernels::Backend& be, const HeadWeights& w, const float* x, int N, int C,
                         const HeadActivations& a) {
  RETURN_IF_ERROR(
      NormForward(be, w.norm, a.norm, a.mean, a.rstd, x, w.norm_w, w.norm_b, N, C, w.eps));
  return be.Linear(a.logits, a.norm, w.head, w.packed, nullptr, N, C, w.vocab_shard());
}

absl::Status VocabParallelCrossEntropy(kernels::Backend& be, const HeadWeights& w,
                                       const float* logits, const int32_t* targets, int N,
                                       const LossActivations& a, const AllReduceFn& sum,
                                       const AllReduceFn& max) {
  RETURN_IF_ERROR(be.CrossEntropyLocalStats(a.local_max, a.sumexp, a.target_logit, logits, targets,
                                            N, w.vocab_shard(), w.vocab_begin));
  RETURN_IF_ERROR(be.Copy(a.global_max, a.local_max, N));
  if (max) RETURN_IF_ERROR(Annotate(max(a.global_max, N), "all-reduce (max) of the logits' rows"));
  RETURN_IF_ERROR(be.CrossEntropyRescaleSumExp(a.sumexp, a.local_max, a.global_max, N));
  if (sum) {
    RETURN_IF_ERROR(Annotate(sum(a.sumexp, N), "all-reduce of the softmax denominators"));
    RETURN_IF_ERROR(Annotate(sum(a.target_logit, N), "all-reduce of the target logits"));
  }
  return be.CrossEntropyLossFromStats(a.losses, a.lse, a.global_max, a.sumexp, a.target_logit,
                                      targets, N);
}

absl::Status HeadBackward(kernels::Backend& be, const HeadWeights& w, float* dhead, float* dnorm,
                          float* dlogits, const float* dlosses, const int32_t* targets, int N,
                          int C, const HeadActivations& a, const LossActivations& loss) {
  const int Vs = w.vocab_shard();
  RETURN_IF_ERROR(be.Fill(dlogits, int64_t{N} * Vs, 0.0f));
  RETURN_IF_ERROR(be.CrossEntropyBackwardShard(dlogits, a.logits, loss.lse, targets, dlosses, N, Vs,
                                               w.vocab_begin));
  RETURN_IF_ERROR(be.Fill(dnorm, int64_t{N} * C, 0.0f));
  return be.LinearBackward(dnorm, dhead, nullptr, dlogits, a.norm, w.head, N, C, Vs);
}

absl::Status FinalNormBackward(kernels::Backend& be, const HeadWeights& w, float* dnorm_w,
                               float* dnorm_b, float* dnorm, const float* x, float* dx, int N,
                               int C, const HeadActivations& a, const AllReduceFn& all_reduce) {
  if (all_reduce) {
    RETURN_IF_ERROR(
        Annotate(all_reduce(dnorm, int64_t{N} * C), "all-reduce of the head's input gradient"));
  }
  RETURN_IF_ERROR(be.Fill(dx, int64_t{N} * C, 0.0f));
  return NormBackward(be, w.norm, dx, dnorm_w, dnorm_b, dnorm, x, w.norm_w, a.mean, a.rstd, N, C);
}

}  // namespace shardline::model
