#include "worker/model/cuda/gpt_model.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/ops.h"
#include "worker/model/cuda/gpt_block.h"

// Makes `device` current for the rest of the scope, or returns its error.
#define SHARDLINE_ON_DEVICE(device)     \
  k::DeviceGuard device_guard_(device); \
  RETURN_IF_ERROR(device_guard_.status())

namespace shardline::model {
namespace k = kernels::cuda;

CudaGptModel::CudaGptModel(const ModelConfig& config,
                           std::unique_ptr<k::CudaCachingAllocator> allocator)
    : config_(config), layout_(config), allocator_(std::move(allocator)) {}

CudaGptModel::~CudaGptModel() {
  k::DeviceGuard guard(allocator_->device_index());
  // The tensors give their blocks back to the allocator when they die; the stream must have
  // finished with them first (the allocator's "one stream" contract).
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

absl::StatusOr<std::unique_ptr<CudaGptModel>> CudaGptModel::Create(const ModelConfig& config,
                                                                   int device,
                                                                   k::GemmPrecision precision) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(config.EngineSupports());
  if (config.head_size() > k::launch::kAttentionMaxHeadSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaGptModel: head size ", config.head_size(), " (d_model ", config.d_model, " / heads ",
        config.heads, ") is past the fused attention kernel's ", k::launch::kAttentionMaxHeadSize));
  }
  ASSIGN_OR_RETURN(auto allocator, k::CudaCachingAllocator::Create(device));
  std::unique_ptr<CudaGptModel> model(new CudaGptModel(config, std::move(allocator)));
  SHARDLINE_ON_DEVICE(device);
  // A stream of our own rather than the legacy default stream, which would serialise with every
  // other user of the device in this process (NCCL's, a data loader's copies).
  RETURN_IF_ERROR(k::CudaStatus(cudaStreamCreateWithFlags(&model->stream_, cudaStreamNonBlocking),
                                "CudaGptModel: creating its stream"));
  ASSIGN_OR_RETURN(model->blas_, k::Blas::Create(*model->allocator_, precision));
  const int64_t n = model->layout_.total();
  ASSIGN_OR_RETURN(model->params_,
                   kernels::Tensor::Zeros({n}, DType::kFloat32, *model->allocator_));
  ASSIGN_OR_RETURN(model->grads_, kernels::Tensor::Zeros({n}, DType::kFloat32, *model->allocator_));
  ASSIGN_OR_RETURN(model->norm_sum_,
                   kernels::Tensor::Zeros({1}, DType::kFloat64, *model->allocator_));
  // Tensor::Zeros fills on the legacy stream; the model's stream does not wait for it by itself.
  RETURN_IF_ERROR(k::CudaStatus(cudaDeviceSynchronize(), "CudaGptModel: zeroing its parameters"));
  return model;
}

absl::Status CudaGptModel::Check(cudaError_t error, const char* what) const {
  return k::CudaStatus(
      error, absl::StrCat("CudaGptModel (device ", allocator_->device_index(), "): ", what));
}

absl::StatusOr<std::vector<float>> CudaGptModel::CopyToHost(const float* device_data, int64_t n,
                                                            const char* what) {
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  std::vector<float> host(static_cast<size_t>(n));
  RETURN_IF_ERROR(Check(cudaMemcpyAsync(host.data(), device_data, sizeof(float) * host.size(),
                                        cudaMemcpyDeviceToHost, stream_),
                        what));
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), what));
  return host;
}

int64_t CudaGptModel::PeakBytes() const {
  return static_cast<int64_t>(allocator_->stats().peak_bytes);
}

absl::Status CudaGptModel::CopyToHost(const float* device_data, std::span<float> out,
                                      const char* what) {
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  RETURN_IF_ERROR(Check(cudaMemcpyAsync(out.data(), device_data, out.size_bytes(),
                                        cudaMemcpyDeviceToHost, stream_),
                        what));
  return Check(cudaStreamSynchronize(stream_), what);
}

absl::Status CudaGptModel::CopyToDevice(std::span<const float> host, void* device,
                                        const char* what) {
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  RETURN_IF_ERROR(
      Check(cudaMemcpyAsync(device, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_),
            what));
  return Check(cudaStreamSynchronize(stream_), what);
}

absl::Status CudaGptModel::CopyState(std::span<float> out) {
  const auto n = static_cast<size_t>(num_params());
  if (out.size() != 3 * n) {
    return absl::InvalidArgumentError(absl::StrCat("CudaGptModel::CopyState: ", out.size(),
                                                   " floats for a state of ", 3 * n));
  }
  RETURN_IF_ERROR(CopyToHost(params_.data<float>(), out.first(n), "copying the parameters out"));
  for (const auto& [moment, at] : {std::pair{&adam_m_, n}, std::pair{&adam_v_, 2 * n}}) {
    if (moment->defined()) {
      RETURN_IF_ERROR(
          CopyToHost(moment->data<float>(), out.subspan(at, n), "copying the AdamW moments out"));
    } else {
      std::fill(out.begin() + at, out.begin() + at + n, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaGptModel::LoadState(std::span<const float> params,
                                     std::span<const float> exp_avg,
                                     std::span<const float> exp_avg_sq) {
  RETURN_IF_ERROR(
      CheckStateSizes(num_params(), params, exp_avg, exp_avg_sq, "CudaGptModel::LoadState"));
  RETURN_IF_ERROR(CopyToDevice(params, params_.raw_data(), "copying the parameters in"));
  // Moments of other weights would be meaningless for these ones.
  adam_m_ = kernels::Tensor();
  adam_v_ = kernels::Tensor();
  if (exp_avg.empty()) return absl::OkStatus();
  const int64_t n = num_params();
  ASSIGN_OR_RETURN(adam_m_, kernels::Tensor::Empty({n}, DType::kFloat32, *allocator_));
  ASSIGN_OR_RETURN(adam_v_, kernels::Tensor::Empty({n}, DType::kFloat32, *allocator_));
  RETURN_IF_ERROR(CopyToDevice(exp_avg, adam_m_.raw_data(), "copying the AdamW moments in"));
  return CopyToDevice(exp_avg_sq, adam_v_.raw_data(), "copying the AdamW moments in");
}

void CudaGptModel::InitGpt2(uint64_t seed) {
  // The values come from the host's counter-based generator, so a CUDA model and a CPU model of
  // the same seed start from the same bits.
  std::vector<float> host(static_cast<size_t>(num_params()));
  FillGpt2Init(layout_, config_.layers, seed, host);
  // The interface returns nothing here (the CPU's cannot fail); a failed copy is a dead device,
  // which the next call that synchronises reports.
  LoadState(host, {}, {}).IgnoreError();
}

void CudaGptModel::ZeroGrad() {
  k::DeviceGuard guard(allocator_->device_index());
  // As InitGpt2: an error here is a dead device, reported by the next synchronising call.
  cudaMemsetAsync(grads_.raw_data(), 0, grads_.nbytes(), stream_);
}

absl::Status CudaGptModel::PrepareBatch(int B, int T) {
  have_loss_ = false;
  if (acts_.B() == B && acts_.T() == T) return absl::OkStatus();
  // The old batch's buffers go back to the allocator before new ones are taken; the stream must
  // be done with them.
  RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "resizing the activations"));
  acts_ = GptActivations();
  tokens_ = targets_ = kernels::Tensor();
  ASSIGN_OR_RETURN(acts_,
                   GptActivations::Allocate(config_, B, T, /*with_grads=*/true, *allocator_));
  const int64_t N = int64_t{B} * T;
  ASSIGN_OR_RETURN(tokens_, kernels::Tensor::Empty({N}, DType::kInt32, *allocator_));
  ASSIGN_OR_RETURN(targets_, kernels::Tensor::Empty({N}, DType::kInt32, *allocator_));
  RETURN_IF_ERROR(Check(cudaDeviceSynchronize(), "zeroing the activations"));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaGptModel::Forward(std::span<const int32_t> tokens,
                                            std::span<const int32_t> targets, int B, int T) {
  // Every check before any work, as the CPU model's: the kernels trust their indices.
  RETURN_IF_ERROR(config_.CheckTokens(tokens, B, T));
  RETURN_IF_ERROR(config_.CheckTargets(targets, B, T));
  const int64_t N = int64_t{B} * T;
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  RETURN_IF_ERROR(PrepareBatch(B, T));

  const int C = config_.d_model, V = config_.vocab, L = config_.layers;
  const int rows = static_cast<int>(N);
  // Pageable host memory: cudaMemcpyAsync has staged the bytes when it returns, so the spans may
  // change afterwards.
  RETURN_IF_ERROR(Check(cudaMemcpyAsync(tokens_.raw_data(), tokens.data(), tokens.size_bytes(),
                                        cudaMemcpyHostToDevice, stream_),
                        "copying the tokens in"));
  RETURN_IF_ERROR(Check(cudaMemcpyAsync(targets_.raw_data(), targets.data(), targets.size_bytes(),
                                        cudaMemcpyHostToDevice, stream_),
                        "copying the targets in"));

  float* params = params_.data<float>();
  const OuterParams o = layout_.Outer(params);
  const int32_t* device_tokens = tokens_.data<int32_t>();
  RETURN_IF_ERROR(
      k::EncoderForward(acts_.residual[0], device_tokens, o.wte, o.wpe, B, T, C, V, stream_));
  const BlockDims dims{B,
                       T,
                       C,
                       static_cast<int>(config_.heads),
                       static_cast<int>(config_.head_size()),
                       static_cast<int>(config_.ff())};
  for (int l = 0; l < L; ++l) {
    RETURN_IF_ERROR(
        Annotate(cuda::BlockForward(*blas_, dims, layout_.Block(params, l), acts_.residual[l],
                                    acts_.residual[l + 1], acts_.blocks[l], stream_),
                 absl::StrCat("block ", l, " forward")));
  }
  RETURN_IF_ERROR(k::LayerNormForward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, acts_.residual[L],
                                      o.lnf_w, o.lnf_b, rows, C, kernels::cpu::kLayerNormEps,
                                      stream_));
  RETURN_IF_ERROR(
      k::MatmulForward(*blas_, acts_.logits, acts_.lnf, o.lm_head, nullptr, rows, C, V, stream_));
  RETURN_IF_ERROR(k::CrossEntropyForward(acts_.losses, acts_.lse, acts_.logits,
                                         targets_.data<int32_t>(), rows, V, stream_));

  // The mean over the counted positions on the host, as the CPU model takes it (MeanLoss); N
  // floats each way is little next to the step.
  ASSIGN_OR_RETURN(host_losses_, CopyToHost(acts_.losses, N, "reading the losses"));
  host_dlosses_.resize(static_cast<size_t>(N));
  const float loss = MeanLoss(host_losses_, targets, host_dlosses_);
  RETURN_IF_ERROR(
      Check(cudaMemcpyAsync(acts_.dlosses, host_dlosses_.data(),
                            sizeof(float) * host_dlosses_.size(), cudaMemcpyHostToDevice, stream_),
            "copying the loss gradient in"));
  have_loss_ = true;
  return loss;
}

absl::Status CudaGptModel::Backward() {
  if (!have_loss_) return absl::FailedPreconditionError("backward without a forward to the loss");
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  const int B = acts_.B(), T = acts_.T();
  const int C = config_.d_model, V = config_.vocab, L = config_.layers;
  const int rows = B * T;
  const int64_t NC = int64_t{rows} * C;
  float* params = params_.data<float>();
  float* grads = grads_.data<float>();
  const OuterParams o = layout_.Outer(params);
  const OuterParams g = layout_.Outer(grads);
  const int32_t* device_targets = targets_.data<int32_t>();

  // The kernels accumulate: the head's buffers start from zero.
  RETURN_IF_ERROR(
      Check(cudaMemsetAsync(acts_.dlogits, 0, sizeof(float) * int64_t{rows} * V, stream_),
            "zeroing dlogits"));
  RETURN_IF_ERROR(
      Check(cudaMemsetAsync(acts_.dlnf, 0, sizeof(float) * NC, stream_), "zeroing dlnf"));
  RETURN_IF_ERROR(Check(cudaMemsetAsync(acts_.dresidual[L], 0, sizeof(float) * NC, stream_),
                        "zeroing the head's input gradient"));
  RETURN_IF_ERROR(k::CrossEntropyBackward(acts_.dlogits, acts_.logits, acts_.lse, device_targets,
                                          acts_.dlosses, rows, V, stream_));
  // With tied embeddings g.lm_head is g.wte: the head's gradient and the embedding's add up there.
  RETURN_IF_ERROR(k::MatmulBackward(*blas_, acts_.dlnf, g.lm_head, nullptr, acts_.dlogits,
                                    acts_.lnf, o.lm_head, rows, C, V, stream_));
  RETURN_IF_ERROR(k::LayerNormBackward(acts_.dresidual[L], g.lnf_w, g.lnf_b, acts_.dlnf,
                                       acts_.residual[L], o.lnf_w, acts_.lnf_mean, acts_.lnf_rstd,
                                       rows, C, stream_));

  const BlockDims dims{B,
                       T,
                       C,
                       static_cast<int>(config_.heads),
                       static_cast<int>(config_.head_size()),
                       static_cast<int>(config_.ff())};
  for (int l = L - 1; l >= 0; --l) {
    RETURN_IF_ERROR(Check(cudaMemsetAsync(acts_.dresidual[l], 0, sizeof(float) * NC, stream_),
                          "zeroing a block's input gradient"));
    RETURN_IF_ERROR(Annotate(
        cuda::BlockBackward(*blas_, dims, layout_.Block(params, l), layout_.Block(grads, l),
                            acts_.residual[l], acts_.dresidual[l + 1], acts_.dresidual[l],
                            acts_.blocks[l], acts_.scratch, stream_),
        absl::StrCat("block ", l, " backward")));
  }
  return k::EncoderBackward(g.wte, g.wpe, acts_.dresidual[0], tokens_.data<int32_t>(), B, T, C, V,
                            stream_);
}

absl::StatusOr<double> CudaGptModel::AdamWStep(const AdamWOptions& options, int64_t step) {
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  const int64_t n = num_params();
  if (!adam_m_.defined()) {
    ASSIGN_OR_RETURN(adam_m_, kernels::Tensor::Zeros({n}, DType::kFloat32, *allocator_));
    ASSIGN_OR_RETURN(adam_v_, kernels::Tensor::Zeros({n}, DType::kFloat32, *allocator_));
    RETURN_IF_ERROR(Check(cudaDeviceSynchronize(), "zeroing the AdamW moments"));
  }
  const std::span<float> all_grads[] = {{grads_.data<float>(), size_t(n)}};
  auto* sum_sq = static_cast<double*>(norm_sum_.raw_data());
  double norm = 0.0;
  if (options.max_grad_norm > 0.0) {
    ASSIGN_OR_RETURN(norm, k::GlobalNormClip(all_grads, options.max_grad_norm, sum_sq, stream_));
  } else {
    const std::span<const float> read[] = {all_grads[0]};
    RETURN_IF_ERROR(k::GradSumOfSquares(read, sum_sq, stream_));
    double host_sum = 0.0;
    RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(&host_sum, sum_sq, sizeof(double), cudaMemcpyDeviceToHost, stream_),
              "reading the gradient norm"));
    RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "reading the gradient norm"));
    norm = std::sqrt(host_sum);
  }
  if (!std::isfinite(norm)) return norm;
  float* p = params_.data<float>();
  float* g = grads_.data<float>();
  float* m = adam_m_.data<float>();
  float* v = adam_v_.data<float>();
  for (const ParamTensorInfo& t : layout_.tensors()) {
    RETURN_IF_ERROR(Annotate(k::AdamWUpdate(p + t.offset, g + t.offset, m + t.offset, v + t.offset,
                                            t.numel, options.For(t), step, stream_),
                             "AdamW on " + t.name));
  }
  return norm;
}

absl::StatusOr<std::span<const float>> CudaGptModel::HostParams() {
  ASSIGN_OR_RETURN(host_params_,
                   CopyToHost(params_.data<float>(), num_params(), "copying the parameters out"));
  return std::span<const float>(host_params_);
}

absl::StatusOr<std::vector<float>> CudaGptModel::HostGrads() {
  return CopyToHost(grads_.data<float>(), num_params(), "copying the gradients out");
}

absl::Status CudaGptModel::Synchronize() {
  SHARDLINE_ON_DEVICE(allocator_->device_index());
  return Check(cudaStreamSynchronize(stream_), "synchronising");
}

absl::StatusOr<std::vector<float>> CudaGptModel::HostLogits() {
  if (!have_loss_) return absl::FailedPreconditionError("HostLogits before a Forward");
  return CopyToHost(acts_.logits, int64_t{acts_.B()} * acts_.T() * config_.vocab,
                    "copying the logits out");
}

}  // namespace shardline::model
