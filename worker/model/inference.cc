#include "worker/model/inference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "worker/model/activations.h"
#include "worker/model/counter_rng.h"

namespace shardline::model {
namespace cpu = kernels::cpu;

namespace {

// A stream id of its own, so sampling draws never coincide with initialisation draws.
constexpr uint64_t kSamplingStream = NameHash("sampling");

}  // namespace

absl::StatusOr<InferenceSession> InferenceSession::Create(const GptModel& model) {
  const GptConfig& c = model.config();
  InferenceSession session(model);
  const int64_t cache = 2 * int64_t{c.layers} * c.max_seq_len * c.d_model;
  ASSIGN_OR_RETURN(session.cache_,
                   kernels::Tensor::Zeros({cache}, DType::kFloat32, model.allocator()));
  const int64_t C = c.d_model;
  const int64_t F = c.ff();
  const int64_t scratch = 7 * C + 2 + 2 * F + c.max_seq_len + c.vocab;
  ASSIGN_OR_RETURN(session.scratch_,
                   kernels::Tensor::Zeros({scratch}, DType::kFloat32, model.allocator()));
  float* p = session.scratch_.data<float>();
  auto take = [&p](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  session.x_ = take(C);
  session.ln_ = take(C);
  session.stats_ = take(2);
  session.qkv_ = take(3 * C);
  session.atty_ = take(C);
  session.proj_ = take(C);
  session.fch_ = take(F);
  session.fch_gelu_ = take(F);
  session.scores_ = take(c.max_seq_len);
  session.logits_ = take(c.vocab);
  return session;
}

float* InferenceSession::KCache(int layer, int pos) {
  const GptConfig& c = model_->config();
  return cache_.data<float>() + (int64_t{layer} * c.max_seq_len + pos) * c.d_model;
}

float* InferenceSession::VCache(int layer, int pos) {
  const GptConfig& c = model_->config();
  return KCache(layer, pos) + int64_t{c.layers} * c.max_seq_len * c.d_model;
}

absl::Status InferenceSession::CheckRoom(int64_t count) const {
  const int max = model_->config().max_seq_len;
  if (position_ + count <= max) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("KV cache: ", count, " more token(s) at position ",
                                            position_, " would pass max_seq_len ", max));
}

absl::StatusOr<std::span<const float>> InferenceSession::Prefill(std::span<const int32_t> tokens) {
  const GptConfig& c = model_->config();
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: no tokens");
  RETURN_IF_ERROR(Annotate(cpu::ValidateTokens(tokens.data(), tokens.size(), c.vocab), "Prefill"));
  RETURN_IF_ERROR(CheckRoom(static_cast<int64_t>(tokens.size())));
  if (position_ > 0) {
    // Positions already cached cannot be expressed to the full-sequence attention kernel.
    std::span<const float> logits;
    for (int32_t token : tokens) {
      ASSIGN_OR_RETURN(logits, Step(token));
    }
    return logits;
  }
  const int T = static_cast<int>(tokens.size());
  ASSIGN_OR_RETURN(GptActivations acts,
                   GptActivations::Allocate(c, 1, T, /*with_grads=*/false, model_->allocator()));
  RETURN_IF_ERROR(model_->ForwardInto(acts, tokens, 1, T));
  const int64_t C = c.d_model;
  for (int l = 0; l < c.layers; ++l) {
    // qkv is (T,3,C): the keys and values of position t follow its query.
    for (int t = 0; t < T; ++t) {
      const float* row = acts.blocks[l].qkv + int64_t{t} * 3 * C;
      std::copy(row + C, row + 2 * C, KCache(l, t));
      std::copy(row + 2 * C, row + 3 * C, VCache(l, t));
    }
  }
  const float* last = acts.logits + int64_t{T - 1} * c.vocab;
  std::copy(last, last + c.vocab, logits_);
  position_ = T;
  return std::span<const float>(logits_, c.vocab);
}

absl::StatusOr<std::span<const float>> InferenceSession::Step(int32_t token) {
  const GptConfig& c = model_->config();
  RETURN_IF_ERROR(Annotate(cpu::ValidateTokens(&token, 1, c.vocab), "Step"));
  RETURN_IF_ERROR(CheckRoom(1));
  const int pos = position_;
  const int C = c.d_model;
  const int F = c.ff();
  const int NH = c.heads;
  const int HS = c.head_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const OuterParams o = model_->OuterParamsView();

  // x (C) = wte[token] + wpe[pos].
  for (int i = 0; i < C; ++i) x_[i] = o.wte[int64_t{token} * C + i] + o.wpe[int64_t{pos} * C + i];
  for (int l = 0; l < c.layers; ++l) {
    const BlockParams p = model_->BlockParamsView(l);
    cpu::LayerNormForward(ln_, stats_, stats_ + 1, x_, p.ln1_w, p.ln1_b, 1, C);
    cpu::MatmulForward(qkv_, ln_, p.qkv_w, p.qkv_b, 1, C, 3 * C);
    std::copy(qkv_ + C, qkv_ + 2 * C, KCache(l, pos));
    std::copy(qkv_ + 2 * C, qkv_ + 3 * C, VCache(l, pos));
    // One query per head against keys 0..pos: softmax(q·kᵀ/√HS)·v.
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv_ + h * HS;
      float max = -INFINITY;
      for (int j = 0; j <= pos; ++j) {
        const float* k = KCache(l, j) + h * HS;
        float dot = 0.0f;
        for (int d = 0; d < HS; ++d) dot += q[d] * scale * k[d];
        scores_[j] = dot;
        max = std::max(max, dot);
      }
      float sum = 0.0f;
      for (int j = 0; j <= pos; ++j) {
        scores_[j] = std::exp(scores_[j] - max);
        sum += scores_[j];
      }
      float* out = atty_ + h * HS;
      std::fill(out, out + HS, 0.0f);
      for (int j = 0; j <= pos; ++j) {
        const float w = scores_[j] / sum;
        const float* v = VCache(l, j) + h * HS;
        for (int d = 0; d < HS; ++d) out[d] += w * v[d];
      }
    }
    cpu::MatmulForward(proj_, atty_, p.attn_proj_w, p.attn_proj_b, 1, C, C);
    cpu::ResidualForward(x_, x_, proj_, C);
    cpu::LayerNormForward(ln_, stats_, stats_ + 1, x_, p.ln2_w, p.ln2_b, 1, C);
    cpu::MatmulForward(fch_, ln_, p.fc_w, p.fc_b, 1, C, F);
    cpu::GeluForward(fch_gelu_, fch_, F);
    cpu::MatmulForward(proj_, fch_gelu_, p.fc_proj_w, p.fc_proj_b, 1, F, C);
    cpu::ResidualForward(x_, x_, proj_, C);
  }
  cpu::LayerNormForward(ln_, stats_, stats_ + 1, x_, o.lnf_w, o.lnf_b, 1, C);
  cpu::MatmulForward(logits_, ln_, o.lm_head, nullptr, 1, C, c.vocab);
  position_ = pos + 1;
  return std::span<const float>(logits_, c.vocab);
}

absl::StatusOr<int32_t> SampleToken(std::span<const float> logits, const SamplingOptions& options,
                                    uint64_t draw) {
  if (logits.empty()) return absl::InvalidArgumentError("SampleToken: empty logits");
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", options.top_k));
  }
  const int V = static_cast<int>(logits.size());
  if (!(options.temperature > 0.0f)) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates by descending logit, ties by ascending id, so the order (and the draw) is fixed.
  const int k = options.top_k == 0 ? V : std::min(options.top_k, V);
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double max = logits[ids[0]];
  std::vector<double> weights(k);
  double sum = 0.0;
  for (int i = 0; i < k; ++i) {
    weights[i] = std::exp((logits[ids[i]] - max) / options.temperature);
    sum += weights[i];
  }
  const double u = UniformOpen(Hash3(options.seed, kSamplingStream, draw)) * sum;
  double acc = 0.0;
  for (int i = 0; i < k; ++i) {
    acc += weights[i];
    if (u < acc) return ids[i];
  }
  return ids[k - 1];  // u rounded past the last partial sum
}

absl::StatusOr<int> GenerateStreaming(const GptModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenSink& sink) {
  const GptConfig& c = model.config();
  if (prompt.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: max_new_tokens must be >= 0, got ", options.max_new_tokens));
  }
  if (options.sampling.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: top_k must be >= 0, got ", options.sampling.top_k));
  }
  RETURN_IF_ERROR(Annotate(cpu::ValidateTokens(prompt.data(), prompt.size(), c.vocab),
                           "Generate: prompt"));
  // The last new token is returned, never fed, so it needs no position.
  const int64_t positions = static_cast<int64_t>(prompt.size()) + options.max_new_tokens - 1;
  if (positions > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate: a prompt of ", prompt.size(), " tokens plus ", options.max_new_tokens,
        " new tokens needs ", positions, " positions, past max_seq_len ", c.max_seq_len));
  }
  if (options.max_new_tokens == 0) return 0;

  if (options.use_kv_cache) {
    ASSIGN_OR_RETURN(InferenceSession session, InferenceSession::Create(model));
    ASSIGN_OR_RETURN(std::span<const float> logits, session.Prefill(prompt));
    for (int i = 0; i < options.max_new_tokens; ++i) {
      ASSIGN_OR_RETURN(int32_t next, SampleToken(logits, options.sampling, i));
      if (!sink(next)) return i + 1;
      if (i + 1 < options.max_new_tokens) {
        ASSIGN_OR_RETURN(logits, session.Step(next));
      }
    }
    return options.max_new_tokens;
  }

  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int T = static_cast<int>(sequence.size());
    ASSIGN_OR_RETURN(GptActivations acts,
                     GptActivations::Allocate(c, 1, T, /*with_grads=*/false, model.allocator()));
    RETURN_IF_ERROR(model.ForwardInto(acts, sequence, 1, T));
    const std::span<const float> last(acts.logits + int64_t{T - 1} * c.vocab, c.vocab);
    ASSIGN_OR_RETURN(int32_t next, SampleToken(last, options.sampling, i));
    if (!sink(next)) return i + 1;
    sequence.push_back(next);
  }
  return options.max_new_tokens;
}

absl::StatusOr<std::vector<int32_t>> Generate(const GptModel& model,
                                              std::span<const int32_t> prompt,
                                              const GenerateOptions& options) {
  std::vector<int32_t> out;
  out.reserve(std::max(options.max_new_tokens, 0));
  RETURN_IF_ERROR(GenerateStreaming(model, prompt, options, [&out](int32_t token) {
                    out.push_back(token);
                    return true;
                  }).status());
  return out;
}

}  // namespace shardline::model
