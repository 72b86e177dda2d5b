#include "worker/model/paged_inference.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/paged_attention.h"
#include "worker/model/embedding_head.h"

namespace shardline::model {
namespace cpu = kernels::cpu;
using enum TensorRole;

InferenceWeights InferenceWeights::Of(const ModelParams& model) {
  const ModelConfig& c = model.config();
  InferenceWeights w;
  w.config = c;
  w.heads = c.heads;
  w.kv_heads = c.kv();
  w.ff = c.ff();
  w.vocab_end = c.vocab;
  w.last_layer = c.layers;
  for (int l = 0; l < c.layers; ++l) w.blocks.push_back(model.Block(l));
  const OuterParams outer = model.Outer();
  w.wte = outer.wte;
  w.wpe = outer.wpe;
  w.lnf_w = outer.lnf_w;
  w.lnf_b = outer.lnf_b;
  w.lm_head = outer.lm_head;
  return w;
}

std::pair<int, int> InferenceStageLayers(int layers, int pp, int stage) {
  const int base = layers / pp, extra = layers % pp;
  const int first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

absl::StatusOr<std::unique_ptr<ShardWeights>> ShardWeights::Load(const ModelConfig& config,
                                                                 int tp_size, int tp_index,
                                                                 const BoxReader& read,
                                                                 kernels::Backend& backend,
                                                                 int pp_size, int stage) {
  if (pp_size < 1 || stage < 0 || stage >= pp_size || pp_size > config.layers) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stage ", stage, " of ", pp_size,
                                                   " for a model of ", config.layers, " layers"));
  }
  const auto [first_layer, last_layer] = InferenceStageLayers(config.layers, pp_size, stage);
  ASSIGN_OR_RETURN(ShardLayout layout,
                   ShardLayout::Create(config, ShardPlace{
                                                   .tp_size = tp_size,
                                                   .tp_index = tp_index,
                                                   .chunks = {{first_layer, last_layer}},
                                                   .first_stage = stage == 0,
                                                   .last_stage = stage == pp_size - 1,
                                               }));
  std::unique_ptr<ShardWeights> shard(new ShardWeights(std::move(layout)));
  const ShardLayout& l = shard->layout_;
  ASSIGN_OR_RETURN(shard->params_,
                   kernels::Tensor::Zeros({l.total()}, DType::kFloat32, backend.allocator()));
  float* base = shard->params_.data<float>();
  for (const ShardTensor& t : l.tensors()) {
    ASSIGN_OR_RETURN(std::vector<float> values, read(t.name, t.box_offsets, t.box_shape));
    if (static_cast<int64_t>(values.size()) != t.numel) {
      return absl::InvalidArgumentError(absl::StrCat("loading ", t.name, ": got ", values.size(),
                                                     " values for a box of ", t.numel));
    }
    RETURN_IF_ERROR(backend.ToDevice(base + l.units()[t.unit].begin + t.offset, values.data(),
                                     values.size() * sizeof(float)));
  }
  RETURN_IF_ERROR(backend.Synchronize());  // `values` are gone once the loop moves on
  auto unit = [&](int u) { return base + l.units()[u].begin; };
  InferenceWeights& w = shard->weights_;
  w.config = config;
  w.tp_size = tp_size;
  w.heads = l.heads();
  w.kv_heads = l.kv_heads();
  w.ff = l.ff();
  w.vocab_begin = l.vocab_begin();
  w.vocab_end = l.vocab_end();
  w.pp_size = pp_size;
  w.stage = stage;
  w.first_layer = first_layer;
  w.last_layer = last_layer;
  for (int layer = first_layer; layer < last_layer; ++layer) {
    w.blocks.push_back(l.Block(unit(l.layer_unit(layer))));
  }
  if (w.first_stage()) {
    w.wte = unit(l.wte_unit());
    w.wpe = l.wpe_unit() >= 0 ? unit(l.wpe_unit()) : nullptr;
  }
  if (w.last_stage()) {
    w.lnf_w = unit(l.lnf_unit());
    w.lnf_b = config.norm == NormKind::kLayerNorm ? w.lnf_w + config.d_model : nullptr;
    // Tied on one stage the head reads wte; tied on several, the last stage's copy of its rows.
    w.lm_head = l.head_unit() >= 0 ? unit(l.head_unit()) : w.wte;
  }
  return shard;
}

BoxReader ModelBoxReader(const ModelParams& model) {
  return [&model](const std::string& name, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& shape) -> absl::StatusOr<std::vector<float>> {
    // The global view of checkpoint boxes is the tensor's own row-major memory (qkv.w viewed as
    // (3, C, C) is the (3C, C) matrix), so the shape of the whole tensor is that of a one-rank
    // layout.
    ASSIGN_OR_RETURN(
        ShardLayout whole,
        ShardLayout::Create(model.config(),
                            ShardPlace{.chunks = {{0, static_cast<int>(model.config().layers)}}}));
    const ShardTensor* tensor = nullptr;
    for (const ShardTensor& t : whole.tensors()) {
      if (t.name == name) tensor = &t;
    }
    if (tensor == nullptr) return absl::NotFoundError(absl::StrCat("no tensor ", name));
    const std::vector<int64_t>& global = tensor->global_shape;
    if (offsets.size() != global.size() || shape.size() != global.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": a box of ", shape.size(), " dimensions for a tensor of ", global.size()));
    }
    int64_t numel = 1;
    for (size_t d = 0; d < global.size(); ++d) {
      if (offsets[d] < 0 || shape[d] < 0 || offsets[d] + shape[d] > global[d]) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": the box leaves dimension ", d));
      }
      numel *= shape[d];
    }
    ASSIGN_OR_RETURN(std::span<const float> values, model.Tensor(name));
    std::vector<float> out;
    out.reserve(numel);
    // Row by row of the innermost dimension: `index` walks the box's outer dimensions.
    const size_t D = global.size();
    std::vector<int64_t> index(D, 0);
    const int64_t rows = shape[D - 1] == 0 ? 0 : numel / shape[D - 1];
    for (int64_t row = 0; row < rows; ++row) {
      int64_t flat = 0;
      for (size_t d = 0; d < D; ++d) flat = flat * global[d] + offsets[d] + index[d];
      out.insert(out.end(), values.begin() + flat, values.begin() + flat + shape[D - 1]);
      for (size_t d = D - 1; d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
    return out;
  };
}

int64_t PagedGptForward::BytesPerBlock(const ModelConfig& config, int block_size, int tp_size,
                                       int pp_size) {
  const auto [first, last] = InferenceStageLayers(config.layers, pp_size, 0);  // the most layers
  const int64_t kv_heads = std::max<int64_t>(config.kv() / tp_size, 1);  // ShardLayout::kv_heads
  return 2 * int64_t{last - first} * block_size * kv_heads * config.head_size() *
         static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<PagedGptForward>> PagedGptForward::Create(
    const InferenceWeights& weights, const PagedCacheOptions& options, kernels::Backend& backend,
    comm::Communicator* tp) {
  const ModelConfig& c = weights.config;
  kernels::Allocator& allocator = backend.allocator();
  const bool on_device = backend.device() != kernels::Device::kCpu;
  if (tp != nullptr && tp->device_buffers() != on_device) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged forward on ", backend.Describe(), ": the tensor-parallel communicator ",
                     "reduces ", tp->device_buffers() ? "device" : "host", " memory"));
  }
  const int tp_size = tp == nullptr ? 1 : tp->size();
  if (tp_size != weights.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("paged forward: weights cut for tp ",
                                                   weights.tp_size, " on a group of ", tp_size));
  }
  if (weights.pp_size < 1 || weights.stage < 0 || weights.stage >= weights.pp_size) {
    return absl::InvalidArgumentError(absl::StrCat("paged forward: weights of stage ",
                                                   weights.stage, " of ", weights.pp_size));
  }
  auto positive = [](const char* name, int value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("paged cache: ", name, " must be > 0, got ", value));
  };
  RETURN_IF_ERROR(positive("num_blocks", options.num_blocks));
  RETURN_IF_ERROR(positive("block_size", options.block_size));
  RETURN_IF_ERROR(positive("max_tokens_per_step", options.max_tokens_per_step));
  RETURN_IF_ERROR(positive("max_seqs_per_step", options.max_seqs_per_step));
  std::unique_ptr<PagedGptForward> f(new PagedGptForward(weights, options, backend, tp));
  const int64_t A = int64_t{weights.heads} * c.head_size();  // attention width held here
  const int64_t KA = int64_t{weights.kv_heads} * c.head_size();  // a cache slot's width
  const int64_t layers = weights.last_layer - weights.first_layer;
  const int64_t cache = 2 * layers * options.num_blocks * options.block_size * KA;
  ASSIGN_OR_RETURN(f->cache_, kernels::Tensor::Zeros({cache}, DType::kFloat32, allocator));

  const int64_t N = options.max_tokens_per_step, R = options.max_seqs_per_step;
  const int64_t C = c.d_model, F = weights.ff, V = weights.vocab_end - weights.vocab_begin;
  const int64_t QKV = A + 2 * KA;                              // a row of q/k/v
  const int64_t MLP = c.mlp == MlpKind::kSwiGlu ? 2 * F : F;   // a row of fch
  const int64_t total = N * (2 * C                             // the two residuals
                             + 3 * C + 4 + QKV + A + MLP + F)  // ln1, resid_mid, ln2, stats, ...
                        + R * (2 * C + 2 + V);
  ASSIGN_OR_RETURN(f->buffer_, kernels::Tensor::Zeros({total}, DType::kFloat32, allocator));
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
  a.qkv = take(N * QKV);
  a.atty = take(N * A);
  a.resid_mid = take(N * C);
  a.ln2 = take(N * C);
  a.ln2_mean = take(N);
  a.ln2_rstd = take(N);
  a.fch = take(N * MLP);
  a.fch_gelu = take(N * F);
  f->head_in_ = take(R * C);
  f->lnf_ = take(R * C);
  f->lnf_stats_ = take(2 * R);
  f->logits_ = take(R * V);
  const int64_t table = R * ((c.max_seq_len + options.block_size - 1) / options.block_size);
  ASSIGN_OR_RETURN(f->step_ints_,
                   kernels::Tensor::Zeros({3 * N + table}, DType::kInt32, allocator));
  f->tokens_ = f->step_ints_.data<int32_t>();
  f->positions_ = f->tokens_ + N;
  f->token_seq_ = f->positions_ + N;
  f->block_tables_ = f->token_seq_ + N;
  if (on_device) f->host_in_.resize(static_cast<size_t>(N * C));
  if (const std::vector<float> inv_freq = RotaryFrequencies(c); !inv_freq.empty()) {
    ASSIGN_OR_RETURN(f->rope_inv_freq_,
                     kernels::Tensor::Zeros({static_cast<int64_t>(inv_freq.size())},
                                            DType::kFloat32, allocator));
    RETURN_IF_ERROR(backend.ToDevice(f->rope_inv_freq_.data<float>(), inv_freq.data(),
                                     sizeof(float) * inv_freq.size()));
  }

  // MKL-packed copies for the products of few rows (none with OpenBLAS: Pack gives null).
  const int rows = std::min(options.max_tokens_per_step, kPackedRows);
  auto pack = [&](const float* w, int C_in, int C_out) -> absl::StatusOr<const cpu::PackedWeight*> {
    ASSIGN_OR_RETURN(auto packed, backend.PackWeight(w, C_in, C_out, rows));
    if (packed == nullptr) return nullptr;
    f->packed_.push_back(std::move(packed));
    return f->packed_.back().get();
  };
  f->blocks_ = weights.blocks;
  for (BlockParams& b : f->blocks_) {
    // q/k/v as one matrix: the fused qkv.w, or q.w, k.w and v.w back to back (gpt_block.cc).
    const TensorRole qkv = b[kQkv] != nullptr ? kQkv : kQuery;
    ASSIGN_OR_RETURN(b.packed(qkv), pack(b[qkv], C, QKV));
    ASSIGN_OR_RETURN(b.packed(kAttnOut), pack(b[kAttnOut], A, C));
    if (b[kMlpGate] != nullptr) {
      ASSIGN_OR_RETURN(b.packed(kMlpGate), pack(b[kMlpGate], C, F));
    }
    ASSIGN_OR_RETURN(b.packed(kMlpUp), pack(b[kMlpUp], C, F));
    ASSIGN_OR_RETURN(b.packed(kMlpDown), pack(b[kMlpDown], F, C));
  }
  if (weights.last_stage()) {
    ASSIGN_OR_RETURN(f->head_packed_, pack(weights.lm_head, C, V));
  }
  return f;
}

std::span<float> PagedGptForward::StageInput(int num_tokens) {
  if (num_tokens < 0 || num_tokens > options_.max_tokens_per_step) return {};
  const size_t n = static_cast<size_t>(num_tokens) * weights_.config.d_model;
  return {on_host() ? residual_[0] : host_in_.data(), n};
}

absl::StatusOr<std::span<const float>> PagedGptForward::OnHost(const float* data, size_t n,
                                                               std::vector<float>& staging) {
  if (on_host()) return std::span<const float>(data, n);
  staging.resize(n);
  RETURN_IF_ERROR(backend_.ToHost(staging.data(), data, n * sizeof(float)));
  return std::span<const float>(staging);
}

float* PagedGptForward::KeyCache(int layer) {
  const int64_t A = int64_t{weights_.kv_heads} * weights_.config.head_size();
  const int64_t per = int64_t{options_.num_blocks} * options_.block_size * A;
  return cache_.data<float>() + 2 * int64_t{layer} * per;
}

float* PagedGptForward::ValueCache(int layer) {
  const int64_t A = int64_t{weights_.kv_heads} * weights_.config.head_size();
  return KeyCache(layer) + int64_t{options_.num_blocks} * options_.block_size * A;
}

absl::Status PagedGptForward::TpAllReduce(float* data, int64_t n, const char* what) {
  if (tp_ == nullptr) return absl::OkStatus();
  return Annotate(tp_->AllReduce(data, n, DType::kFloat32, comm::ReduceOp::kSum), what);
}

absl::Status PagedGptForward::Validate(const PagedStep& s) const {
  const ModelConfig& c = weights_.config;
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
  const int64_t table_capacity = step_ints_.numel() - 3 * int64_t{options_.max_tokens_per_step};
  if (static_cast<int64_t>(s.block_tables.size()) > table_capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged step: block tables of ", s.block_tables.size(),
                     " entries, more than the ", table_capacity, " of ", options_.max_seqs_per_step,
                     " sequences of max_seq_len ", c.max_seq_len));
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
  const ModelConfig& c = weights_.config;
  const InferenceWeights& w = weights_;
  const int N = static_cast<int>(s.tokens.size());
  const int C = c.d_model;
  // One "sequence" of N rows, each at its own position (the rotary turn reads positions_).
  BlockDims dims = BlockDims::Of(c, 1, N, w.heads, w.kv_heads, w.ff);
  if (rope_inv_freq_.defined()) dims.rope_inv_freq = rope_inv_freq_.data<float>();
  dims.rope_positions = positions_;

  AllReduceFn all_reduce;
  if (tp_ != nullptr) {
    all_reduce = [this](float* data, int64_t n) -> absl::Status {
      RETURN_IF_ERROR(backend_.Synchronize());  // the communicator reads what the backend queued
      return tp_->AllReduce(data, n, DType::kFloat32, comm::ReduceOp::kSum);
    };
  }
  // The step's integers into the backend's memory (on the CPU a copy of a few hundred bytes).
  const auto to_backend = [this](int32_t* dst, std::span<const int32_t> src) {
    return backend_.ToDevice(dst, src.data(), src.size_bytes());
  };
  RETURN_IF_ERROR(to_backend(tokens_, s.tokens));
  RETURN_IF_ERROR(to_backend(positions_, s.positions));
  RETURN_IF_ERROR(to_backend(token_seq_, s.token_seq));
  RETURN_IF_ERROR(to_backend(block_tables_, s.block_tables));
  if (w.first_stage()) {
    // The training embedding, each token at its own position.
    RETURN_IF_ERROR(EmbeddingForward(backend_,
                                     EmbeddingWeights{w.wte, w.wpe, w.vocab_begin, w.vocab_end},
                                     tokens_, positions_, N, N, C, residual_[0], all_reduce));
  } else if (!on_host()) {  // StageInput(N) holds the stage before's residual
    RETURN_IF_ERROR(backend_.ToDevice(residual_[0], host_in_.data(),
                                      static_cast<size_t>(N) * C * sizeof(float)));
  }

  const kernels::PagedAttentionBatch batch{
      .num_tokens = N,
      .token_seq = token_seq_,
      .positions = positions_,
      .block_tables = block_tables_,
      .num_seqs = s.num_seqs,
      .max_blocks_per_seq = s.max_blocks_per_seq,
      .block_size = options_.block_size,
      .num_blocks = options_.num_blocks,
  };
  const int layers = w.last_layer - w.first_layer;
  for (int l = 0; l < layers; ++l) {
    float* k = KeyCache(l);
    float* v = ValueCache(l);
    const AttentionFn attention = [&](const float* qkv, float* atty) {
      RETURN_IF_ERROR(backend_.PagedKvWrite(k, v, qkv, batch, dims.NH, dims.KVH, dims.HS));
      return backend_.PagedAttention(atty, qkv, k, v, batch, dims.NH, dims.KVH, dims.HS);
    };
    RETURN_IF_ERROR(Annotate(BlockForward(backend_, dims, blocks_[l], residual_[l % 2],
                                          residual_[(l + 1) % 2], acts_, all_reduce, attention),
                             absl::StrCat("layer ", w.first_layer + l)));
  }
  const float* out = residual_[layers % 2];
  if (!w.last_stage()) return OnHost(out, static_cast<size_t>(N) * C, host_out_);

  // The head only for the rows whose logits are wanted: a prefill chunk needs its last row only.
  const int R = static_cast<int>(s.logit_rows.size());
  if (R == 0) return std::span<const float>();
  for (int r = 0; r < R; ++r) {
    RETURN_IF_ERROR(
        backend_.Copy(head_in_ + int64_t{r} * C, out + int64_t{s.logit_rows[r]} * C, C));
  }
  const int Vs = w.vocab_end - w.vocab_begin;
  const HeadWeights head{.norm_w = w.lnf_w,
                         .norm_b = w.lnf_b,
                         .norm = c.norm,
                         .head = w.lm_head,
                         .packed = head_packed_,
                         .vocab_begin = w.vocab_begin,
                         .vocab_end = w.vocab_end,
                         .eps = static_cast<float>(c.norm_eps)};
  RETURN_IF_ERROR(HeadForward(backend_, head, head_in_, R, C,
                              HeadActivations{lnf_, lnf_stats_, lnf_stats_ + R, logits_}));
  return OnHost(logits_, static_cast<size_t>(R) * Vs, host_out_);
}

}  // namespace shardline::model
