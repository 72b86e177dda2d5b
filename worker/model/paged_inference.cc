#include "worker/model/paged_inference.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"

namespace shardline::model {
namespace cpu = kernels::cpu;

int64_t PagedGptForward::BytesPerBlock(const GptConfig& config, int block_size) {
  return 2 * int64_t{config.layers} * block_size * config.d_model *
         static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<PagedGptForward>> PagedGptForward::Create(
    const GptModel& model, const PagedCacheOptions& options) {
  const GptConfig& c = model.config();
  auto positive = [](const char* name, int value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("paged cache: ", name, " must be > 0, got ", value));
  };
  RETURN_IF_ERROR(positive("num_blocks", options.num_blocks));
  RETURN_IF_ERROR(positive("block_size", options.block_size));
  RETURN_IF_ERROR(positive("max_tokens_per_step", options.max_tokens_per_step));
  RETURN_IF_ERROR(positive("max_seqs_per_step", options.max_seqs_per_step));
  std::unique_ptr<PagedGptForward> f(new PagedGptForward(model, options));
  const int64_t cache = 2 * int64_t{c.layers} * options.num_blocks * options.block_size * c.d_model;
  ASSIGN_OR_RETURN(f->cache_, kernels::Tensor::Zeros({cache}, DType::kFloat32, model.allocator()));

  const int64_t N = options.max_tokens_per_step, R = options.max_seqs_per_step;
  const int64_t C = c.d_model, F = c.ff(), V = c.vocab;
  const int64_t total = N * (2 * C                         // the two residuals
                             + 4 * C + 4 + 3 * C + 2 * F)  // ln1, atty, resid_mid, ln2 + stats
                        + R * (2 * C + 2 + V);
  ASSIGN_OR_RETURN(f->buffer_, kernels::Tensor::Zeros({total}, DType::kFloat32, model.allocator()));
  float* p = f->buffer_.data<float>();
  auto take = [&p](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  f->residual_[0] = take(N * C);
  f->residual_[1] = take(N * C);
  BlockActivations& a = f->acts_;
  a.ln1 = take(N * C);
  a.ln1_mean = take(N);
  a.ln1_rstd = take(N);
  a.qkv = take(N * 3 * C);
  a.atty = take(N * C);
  a.resid_mid = take(N * C);
  a.ln2 = take(N * C);
  a.ln2_mean = take(N);
  a.ln2_rstd = take(N);
  a.fch = take(N * F);
  a.fch_gelu = take(N * F);
  f->head_in_ = take(R * C);
  f->lnf_ = take(R * C);
  f->lnf_stats_ = take(2 * R);
  f->logits_ = take(R * V);
  return f;
}

float* PagedGptForward::KeyCache(int layer) {
  const GptConfig& c = model_.config();
  const int64_t per = int64_t{options_.num_blocks} * options_.block_size * c.d_model;
  return cache_.data<float>() + 2 * int64_t{layer} * per;
}

float* PagedGptForward::ValueCache(int layer) {
  const GptConfig& c = model_.config();
  return KeyCache(layer) + int64_t{options_.num_blocks} * options_.block_size * c.d_model;
}

absl::Status PagedGptForward::Validate(const PagedStep& s) const {
  const GptConfig& c = model_.config();
  const size_t n = s.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("paged step: no tokens");
  if (n > static_cast<size_t>(options_.max_tokens_per_step)) {
    return absl::InvalidArgumentError(absl::StrCat("paged step: ", n, " tokens, more than the ",
                                                   options_.max_tokens_per_step, " of a step"));
  }
  if (s.positions.size() != n || s.token_seq.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("paged step: ", n, " tokens but ",
                                                   s.positions.size(), " positions and ",
                                                   s.token_seq.size(), " sequence indices"));
  }
  if (s.num_seqs < 1 || s.num_seqs > options_.max_seqs_per_step || s.max_blocks_per_seq < 1 ||
      s.block_tables.size() != static_cast<size_t>(s.num_seqs) * s.max_blocks_per_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged step: block tables of ", s.block_tables.size(), " entries for ",
                     s.num_seqs, " sequences × ", s.max_blocks_per_seq, " blocks (at most ",
                     options_.max_seqs_per_step, " sequences)"));
  }
  if (s.logit_rows.size() > static_cast<size_t>(options_.max_seqs_per_step)) {
    return absl::InvalidArgumentError(absl::StrCat("paged step: ", s.logit_rows.size(),
                                                   " logit rows, more than ",
                                                   options_.max_seqs_per_step));
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t token = s.tokens[i], pos = s.positions[i], seq = s.token_seq[i];
    if (token < 0 || token >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("paged step: token ", i, " (", token,
                                                     ") is outside the vocabulary of ", c.vocab));
    }
    if (pos < 0 || pos >= c.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("paged step: token ", i, " at position ", pos,
                                                     ", outside 0..", c.max_seq_len - 1));
    }
    if (seq < 0 || seq >= s.num_seqs) {
      return absl::InvalidArgumentError(absl::StrCat("paged step: token ", i, " of sequence ", seq,
                                                     ", outside 0..", s.num_seqs - 1));
    }
    // Every block the token attends over must exist: positions 0..pos of its sequence.
    const int last_block = pos / options_.block_size;
    if (last_block >= s.max_blocks_per_seq) {
      return absl::InvalidArgumentError(absl::StrCat("paged step: token ", i, " at position ", pos,
                                                     " needs block ", last_block, " of a table of ",
                                                     s.max_blocks_per_seq));
    }
    for (int b = 0; b <= last_block; ++b) {
      const int32_t block = s.block_tables[int64_t{seq} * s.max_blocks_per_seq + b];
      if (block < 0 || block >= options_.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("paged step: sequence ", seq, " block ", b,
                                                       " is ", block, ", outside the cache's 0..",
                                                       options_.num_blocks - 1));
      }
    }
  }
  for (int32_t row : s.logit_rows) {
    if (row < 0 || static_cast<size_t>(row) >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("paged step: logit row ", row, " outside 0..", n - 1));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::span<const float>> PagedGptForward::Forward(const PagedStep& s) {
  RETURN_IF_ERROR(Validate(s));
  const GptConfig& c = model_.config();
  const int N = static_cast<int>(s.tokens.size());
  const int C = c.d_model;
  const BlockDims dims{1, N, C, c.heads, c.head_size(), c.ff()};
  const OuterParams outer = model_.OuterParamsView();

  // The embedding at each token's own position (the training kernel assumes positions 0..T-1).
  for (int i = 0; i < N; ++i) {
    const float* te = outer.wte + int64_t{s.tokens[i]} * C;
    const float* pe = outer.wpe + int64_t{s.positions[i]} * C;
    float* x = residual_[0] + int64_t{i} * C;
    for (int j = 0; j < C; ++j) x[j] = te[j] + pe[j];
  }

  const cpu::PagedAttentionBatch batch{
      .num_tokens = N,
      .token_seq = s.token_seq.data(),
      .positions = s.positions.data(),
      .block_tables = s.block_tables.data(),
      .num_seqs = s.num_seqs,
      .max_blocks_per_seq = s.max_blocks_per_seq,
      .block_size = options_.block_size,
      .num_blocks = options_.num_blocks,
  };
  for (int l = 0; l < c.layers; ++l) {
    float* k = KeyCache(l);
    float* v = ValueCache(l);
    const AttentionFn attention = [&](const float* qkv, float* atty) {
      cpu::PagedKvWrite(k, v, qkv, batch, dims.NH, dims.HS);
      cpu::PagedAttentionForward(atty, qkv, k, v, batch, dims.NH, dims.HS);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(BlockForward(dims, model_.BlockParamsView(l), residual_[l % 2],
                                 residual_[(l + 1) % 2], acts_, /*all_reduce=*/nullptr, attention));
  }

  // The head only for the rows whose logits are wanted: a prefill chunk needs its last row only.
  const float* out = residual_[c.layers % 2];
  const int R = static_cast<int>(s.logit_rows.size());
  for (int r = 0; r < R; ++r) {
    std::copy_n(out + int64_t{s.logit_rows[r]} * C, C, head_in_ + int64_t{r} * C);
  }
  if (R == 0) return std::span<const float>();
  cpu::LayerNormForward(lnf_, lnf_stats_, lnf_stats_ + R, head_in_, outer.lnf_w, outer.lnf_b, R, C);
  cpu::MatmulForward(logits_, lnf_, outer.lm_head, nullptr, R, C, c.vocab);
  return std::span<const float>(logits_, static_cast<size_t>(R) * c.vocab);
}

}  // namespace shardline::model
