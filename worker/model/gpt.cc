#include "worker/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "worker/model/counter_rng.h"

namespace shardline::model {
namespace cpu = kernels::cpu;

GptModel::GptModel(const ModelConfig& config, kernels::Allocator& allocator)
    : config_(config), layout_(config), allocator_(&allocator), backend_(allocator) {}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const ModelConfig& config,
                                                           kernels::Allocator& allocator) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(config.EngineSupports());
  if (allocator.device() != kernels::Device::kCpu) {
    return absl::InvalidArgumentError("GptModel runs on the CPU: it needs a CPU allocator");
  }
  std::unique_ptr<GptModel> model(new GptModel(config, allocator));
  const int64_t n = model->layout_.total();
  ASSIGN_OR_RETURN(model->params_, kernels::Tensor::Zeros({n}, DType::kFloat32, allocator));
  ASSIGN_OR_RETURN(model->grads_, kernels::Tensor::Zeros({n}, DType::kFloat32, allocator));
  return model;
}

absl::StatusOr<std::span<float>> GptModel::Param(const std::string& name) {
  const ParamTensorInfo* info = layout_.Find(name);
  if (info == nullptr) return absl::NotFoundError("GptModel has no parameter tensor '" + name + "'");
  return params().subspan(info->offset, info->numel);
}

absl::StatusOr<std::span<float>> GptModel::Grad(const std::string& name) {
  const ParamTensorInfo* info = layout_.Find(name);
  if (info == nullptr) return absl::NotFoundError("GptModel has no parameter tensor '" + name + "'");
  return grads().subspan(info->offset, info->numel);
}

absl::StatusOr<kernels::Tensor> GptModel::ParamTensor(const std::string& name) const {
  const ParamTensorInfo* info = layout_.Find(name);
  if (info == nullptr) return absl::NotFoundError("GptModel has no parameter tensor '" + name + "'");
  ASSIGN_OR_RETURN(kernels::Tensor slice, params_.Slice(0, info->offset, info->numel));
  return slice.Reshape(info->shape);
}

BlockParams GptModel::BlockParamsView(int layer) const {
  // The views carry non-const pointers because the same struct points into the gradients; the
  // forward only reads through them.
  return layout_.Block(const_cast<float*>(params_.data<float>()), layer);
}

OuterParams GptModel::OuterParamsView() const {
  return layout_.Outer(const_cast<float*>(params_.data<float>()));
}

void GptModel::InitGpt2(uint64_t seed) {
  FillGpt2Init(layout_, config_.layers, seed, params());
  // Moments of other weights would be meaningless for these ones.
  adam_m_ = kernels::Tensor();
  adam_v_ = kernels::Tensor();
}

absl::Status GptModel::CopyState(std::span<float> out) {
  const auto n = static_cast<size_t>(num_params());
  if (out.size() != 3 * n) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::CopyState: ", out.size(),
                                                   " floats for a state of ", 3 * n));
  }
  std::copy(params().begin(), params().end(), out.begin());
  for (const auto& [moment, at] : {std::pair{&adam_m_, n}, std::pair{&adam_v_, 2 * n}}) {
    if (moment->defined()) {
      std::copy(moment->data<float>(), moment->data<float>() + n, out.begin() + at);
    } else {
      std::fill(out.begin() + at, out.begin() + at + n, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::LoadState(std::span<const float> params, std::span<const float> exp_avg,
                                 std::span<const float> exp_avg_sq) {
  RETURN_IF_ERROR(
      CheckStateSizes(num_params(), params, exp_avg, exp_avg_sq, "GptModel::LoadState"));
  std::copy(params.begin(), params.end(), this->params().begin());
  adam_m_ = kernels::Tensor();
  adam_v_ = kernels::Tensor();
  if (exp_avg.empty()) return absl::OkStatus();
  const int64_t n = num_params();
  ASSIGN_OR_RETURN(adam_m_, kernels::Tensor::Empty({n}, DType::kFloat32, *allocator_));
  ASSIGN_OR_RETURN(adam_v_, kernels::Tensor::Empty({n}, DType::kFloat32, *allocator_));
  std::copy(exp_avg.begin(), exp_avg.end(), adam_m_.data<float>());
  std::copy(exp_avg_sq.begin(), exp_avg_sq.end(), adam_v_.data<float>());
  return absl::OkStatus();
}

void GptModel::ZeroGrad() {
  std::fill(grads().begin(), grads().end(), 0.0f);
}

absl::Status GptModel::CheckRange(int first, int last, const char* what) const {
  if (0 <= first && first <= last && last <= config_.layers) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": block range [", first, ", ", last,
                                                 ") is not inside [0, ", config_.layers, "]"));
}

BlockDims GptModel::Dims(int B, int T) const {
  return BlockDims{B,
                   T,
                   static_cast<int>(config_.d_model),
                   static_cast<int>(config_.heads),
                   static_cast<int>(config_.head_size()),
                   static_cast<int>(config_.ff()),
                   static_cast<float>(config_.norm_eps)};
}

absl::Status GptModel::PrepareBatch(int B, int T) {
  RETURN_IF_ERROR(config_.CheckBatch(B, T));
  have_logits_ = have_loss_ = false;
  if (acts_.B() == B && acts_.T() == T && acts_.with_grads()) return absl::OkStatus();
  acts_ = GptActivations();  // free the old batch's buffers before taking new ones
  ASSIGN_OR_RETURN(acts_, GptActivations::Allocate(config_, B, T, /*with_grads=*/true, *allocator_));
  return absl::OkStatus();
}

float* GptModel::Residual(int layer) {
  if (acts_.residual.empty() || layer < 0 || layer > config_.layers) return nullptr;
  return acts_.residual[layer];
}

float* GptModel::ResidualGrad(int layer) {
  if (acts_.dresidual.empty() || layer < 0 || layer > config_.layers) return nullptr;
  return acts_.dresidual[layer];
}

std::span<const float> GptModel::Logits() const {
  if (!have_logits_) return {};
  return {acts_.logits, size_t(int64_t{acts_.B()} * acts_.T() * config_.vocab)};
}

void GptModel::Embed(GptActivations& acts, const int32_t* tokens) const {
  const OuterParams o = OuterParamsView();
  cpu::EncoderForward(acts.residual[0], tokens, o.wte, o.wpe, acts.B(), acts.T(), config_.d_model,
                      config_.vocab);
}

void GptModel::Blocks(GptActivations& acts, int first, int last) const {
  const BlockDims dims = Dims(acts.B(), acts.T());
  for (int l = first; l < last; ++l) {
    // Without an all-reduce BlockForward cannot fail on the CPU.
    BlockForward(backend_, dims, BlockParamsView(l), acts.residual[l], acts.residual[l + 1],
                 acts.blocks[l])
        .IgnoreError();
  }
}

void GptModel::Head(GptActivations& acts) const {
  const OuterParams o = OuterParamsView();
  const int N = acts.B() * acts.T();
  // x (B,T,C) → lnf (B,T,C) → logits (B,T,V) = lnf · lm_headᵀ.
  cpu::LayerNormForward(acts.lnf, acts.lnf_mean, acts.lnf_rstd, acts.residual[config_.layers],
                        o.lnf_w, o.lnf_b, N, config_.d_model, static_cast<float>(config_.norm_eps));
  cpu::MatmulForward(acts.logits, acts.lnf, o.lm_head, nullptr, N, config_.d_model, config_.vocab);
}

absl::Status GptModel::EmbedForward(std::span<const int32_t> tokens, int B, int T) {
  RETURN_IF_ERROR(config_.CheckTokens(tokens, B, T));
  RETURN_IF_ERROR(PrepareBatch(B, T));
  tokens_.assign(tokens.begin(), tokens.end());
  Embed(acts_, tokens_.data());
  return absl::OkStatus();
}

absl::Status GptModel::BlocksForward(int first, int last) {
  RETURN_IF_ERROR(CheckRange(first, last, "BlocksForward"));
  if (acts_.residual.empty()) return absl::FailedPreconditionError("BlocksForward before PrepareBatch");
  Blocks(acts_, first, last);
  return absl::OkStatus();
}

absl::Status GptModel::HeadForward() {
  if (acts_.residual.empty()) return absl::FailedPreconditionError("HeadForward before PrepareBatch");
  Head(acts_);
  have_logits_ = true;
  have_loss_ = false;
  return absl::OkStatus();
}

absl::StatusOr<float> GptModel::LossForward(std::span<const int32_t> targets) {
  if (!have_logits_) return absl::FailedPreconditionError("LossForward before HeadForward");
  const int N = acts_.B() * acts_.T();
  RETURN_IF_ERROR(config_.CheckTargets(targets, acts_.B(), acts_.T()));
  targets_.assign(targets.begin(), targets.end());
  cpu::CrossEntropyForward(acts_.losses, acts_.lse, acts_.logits, targets_.data(), N,
                           config_.vocab);
  have_loss_ = true;
  return MeanLoss({acts_.losses, size_t(N)}, targets_, {acts_.dlosses, size_t(N)});
}

absl::StatusOr<float> GptModel::Forward(std::span<const int32_t> tokens,
                                        std::span<const int32_t> targets, int B, int T) {
  // Check the targets before any work, as the tokens are.
  RETURN_IF_ERROR(config_.CheckTargets(targets, B, T));
  RETURN_IF_ERROR(ForwardLogits(tokens, B, T));
  return LossForward(targets);
}

absl::Status GptModel::ForwardLogits(std::span<const int32_t> tokens, int B, int T) {
  RETURN_IF_ERROR(EmbedForward(tokens, B, T));
  Blocks(acts_, 0, config_.layers);
  return HeadForward();
}

absl::Status GptModel::HeadBackward() {
  if (!have_loss_) return absl::FailedPreconditionError("backward without a forward to the loss");
  const OuterParams o = OuterParamsView();
  const OuterParams g = layout_.Outer(grads_.data<float>());
  const int N = acts_.B() * acts_.T();
  const int C = config_.d_model;
  const int64_t NC = int64_t{N} * C;
  float* dx = acts_.dresidual[config_.layers];
  std::fill(acts_.dlogits, acts_.dlogits + int64_t{N} * config_.vocab, 0.0f);
  std::fill(acts_.dlnf, acts_.dlnf + NC, 0.0f);
  std::fill(dx, dx + NC, 0.0f);
  cpu::CrossEntropyBackward(acts_.dlogits, acts_.logits, acts_.lse, targets_.data(), acts_.dlosses,
                            N, config_.vocab);
  // With tied embeddings g.lm_head is g.wte: the head's gradient and the embedding's add up there.
  cpu::MatmulBackward(acts_.dlnf, g.lm_head, nullptr, acts_.dlogits, acts_.lnf, o.lm_head, N, C,
                      config_.vocab);
  cpu::LayerNormBackward(dx, g.lnf_w, g.lnf_b, acts_.dlnf, acts_.residual[config_.layers], o.lnf_w,
                         acts_.lnf_mean, acts_.lnf_rstd, N, C);
  return absl::OkStatus();
}

absl::Status GptModel::BlocksBackward(int first, int last) {
  RETURN_IF_ERROR(CheckRange(first, last, "BlocksBackward"));
  if (acts_.dresidual.empty()) return absl::FailedPreconditionError("BlocksBackward before PrepareBatch");
  const BlockDims dims = Dims(acts_.B(), acts_.T());
  const int64_t NC = dims.N() * dims.C;
  for (int l = last - 1; l >= first; --l) {
    float* dx = acts_.dresidual[l];
    std::fill(dx, dx + NC, 0.0f);
    RETURN_IF_ERROR(BlockBackward(backend_, dims, BlockParamsView(l),
                                  layout_.Block(grads_.data<float>(), l), acts_.residual[l],
                                  acts_.dresidual[l + 1], dx, acts_.blocks[l], acts_.scratch));
  }
  return absl::OkStatus();
}

absl::Status GptModel::EmbedBackward() {
  if (acts_.dresidual.empty() || tokens_.size() != size_t(acts_.B()) * acts_.T()) {
    return absl::FailedPreconditionError("EmbedBackward without an EmbedForward of this batch");
  }
  const OuterParams g = layout_.Outer(grads_.data<float>());
  cpu::EncoderBackward(g.wte, g.wpe, acts_.dresidual[0], tokens_.data(), acts_.B(), acts_.T(),
                       config_.d_model, config_.vocab);
  return absl::OkStatus();
}

absl::Status GptModel::Backward() {
  RETURN_IF_ERROR(HeadBackward());
  RETURN_IF_ERROR(BlocksBackward(0, config_.layers));
  return EmbedBackward();
}

absl::StatusOr<double> GptModel::AdamWStep(const AdamWOptions& options, int64_t step) {
  const int64_t n = num_params();
  if (!adam_m_.defined()) {
    ASSIGN_OR_RETURN(adam_m_, kernels::Tensor::Zeros({n}, DType::kFloat32, *allocator_));
    ASSIGN_OR_RETURN(adam_v_, kernels::Tensor::Zeros({n}, DType::kFloat32, *allocator_));
  }
  const std::span<float> all_grads[] = {grads()};
  double norm = 0.0;
  if (options.max_grad_norm > 0.0) {
    ASSIGN_OR_RETURN(norm, cpu::GlobalNormClip(all_grads, options.max_grad_norm));
  } else {
    const std::span<const float> read[] = {grads()};
    norm = std::sqrt(cpu::GradSumOfSquares(read));
  }
  if (!std::isfinite(norm)) return norm;
  float* p = params_.data<float>();
  float* g = grads_.data<float>();
  float* m = adam_m_.data<float>();
  float* v = adam_v_.data<float>();
  for (const ParamTensorInfo& t : layout_.tensors()) {
    RETURN_IF_ERROR(Annotate(cpu::AdamWUpdate(p + t.offset, g + t.offset, m + t.offset,
                                              v + t.offset, t.numel, options.For(t), step),
                             "AdamW on " + t.name));
  }
  return norm;
}

absl::Status GptModel::ForwardInto(GptActivations& acts, std::span<const int32_t> tokens, int B,
                                   int T) const {
  RETURN_IF_ERROR(config_.CheckTokens(tokens, B, T));
  if (acts.B() != B || acts.T() != T) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardInto: activations are for B=", acts.B(),
                                                   " T=", acts.T(), ", the batch is B=", B,
                                                   " T=", T));
  }
  Embed(acts, tokens.data());
  Blocks(acts, 0, config_.layers);
  Head(acts);
  return absl::OkStatus();
}

}  // namespace shardline::model
