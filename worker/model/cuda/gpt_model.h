// CudaGptModel: the GPT of worker/model/gpt.h trained on one CUDA device — the same parameters
// (ParamLayout order, GPT-2's initialisation), the same forward, backward and AdamW step, computed
// by the kernels of kernels/cuda/ops.h on one stream.
//
// Precision (DESIGN.md: "bf16 compute with fp32 master weights"): the parameters, gradients, AdamW
// moments and activations are f32 on the device; in kBFloat16 every GEMM rounds its operands to
// bf16 and multiplies them on tensor cores with f32 accumulation (kernels/cuda/blas.h), which is
// where nearly all of a step's FLOPs are. The optimizer updates the f32 master weights, so updates
// smaller than bf16's resolution are not lost. kFloat32 runs f32 GEMMs (no TF32): the mode that
// matches the CPU model to rounding, for checks.
//
// Synchronisation: Forward returns the loss, so it waits for the forward (the losses are averaged
// on the host, as the CPU model does); AdamWStep waits for the gradient norm (clipping needs it on
// the host to decide, and the caller wants it). Everything else only queues work.
//
// Not deterministic to the last bit: the token embedding's backward adds with atomics, so repeated
// tokens can sum in a different order from run to run (kernels/cuda/ops.h).
//
// Errors: the argument checks come before any work and leave the model as it was; an error from
// CUDA itself (a fault is sticky) leaves it unusable, and the caller stops rather than retries.
//
// Thread-safety: none; one thread drives a model. The model makes its device current in every
// call that touches it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/tensor.h"
#include "worker/model/activations.h"
#include "worker/model/trainable_gpt.h"

namespace shardline::model {

class CudaGptModel final : public TrainableGpt {
 public:
  // A model of `config` with zeroed parameters on CUDA device `device`. Errors before any device
  // memory is taken: InvalidArgument for an invalid config or a head size the fused attention
  // kernel does not take (> 128); FailedPrecondition, with CUDA's reason, when the device is not
  // usable (no driver, no GPU) or cuBLAS cannot be loaded; ResourceExhausted when the parameters
  // and optimizer state do not fit.
  static absl::StatusOr<std::unique_ptr<CudaGptModel>> Create(
      const ModelConfig& config, int device, kernels::cuda::GemmPrecision precision);
  ~CudaGptModel() override;

  CudaGptModel(const CudaGptModel&) = delete;
  CudaGptModel& operator=(const CudaGptModel&) = delete;

  const ModelConfig& config() const override { return config_; }
  const ParamLayout& layout() const override { return layout_; }
  kernels::cuda::GemmPrecision precision() const { return blas_->precision(); }
  int64_t num_params() const { return layout_.total(); }

  void InitGpt2(uint64_t seed) override;
  void ZeroGrad() override;
  absl::StatusOr<float> Forward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                int B, int T) override;
  absl::Status Backward() override;
  absl::StatusOr<double> AdamWStep(const AdamWOptions& options, int64_t step) override;
  absl::StatusOr<std::span<const float>> HostParams() override;
  absl::Status CopyState(std::span<float> out) override;
  // E.g. from a checkpoint or a CPU model: copied to the device before it returns.
  absl::Status LoadState(std::span<const float> params, std::span<const float> exp_avg,
                         std::span<const float> exp_avg_sq) override;
  int64_t PeakBytes() const override;

  // The gradients accumulated so far, copied to the host (for checks against the CPU model).
  absl::StatusOr<std::vector<float>> HostGrads();
  // (B,T,V) logits of the last Forward, copied to the host.
  absl::StatusOr<std::vector<float>> HostLogits();
  // Waits for the work queued so far (for timing); reports a fault of any of it.
  absl::Status Synchronize();

 private:
  CudaGptModel(const ModelConfig& config,
               std::unique_ptr<kernels::cuda::CudaCachingAllocator> alloc);

  absl::Status PrepareBatch(int B, int T);
  // Errors mentioning `what` for a failed CUDA call.
  absl::Status Check(cudaError_t error, const char* what) const;
  absl::StatusOr<std::vector<float>> CopyToHost(const float* device_data, int64_t n,
                                                const char* what);
  // The same into a host buffer of n floats.
  absl::Status CopyToHost(const float* device_data, std::span<float> out, const char* what);
  // `host` (num_params floats) into `device`, waiting for the copy (the host buffer may die).
  absl::Status CopyToDevice(std::span<const float> host, void* device, const char* what);

  ModelConfig config_;
  ParamLayout layout_;
  std::unique_ptr<kernels::cuda::CudaCachingAllocator> allocator_;  // outlives every tensor below
  std::unique_ptr<kernels::cuda::Blas> blas_;
  cudaStream_t stream_ = nullptr;

  kernels::Tensor params_;  // (num_params) f32, the master weights
  kernels::Tensor grads_;   // (num_params) f32, same layout
  kernels::Tensor adam_m_;  // (num_params) f32, allocated at the first AdamWStep
  kernels::Tensor adam_v_;
  kernels::Tensor norm_sum_;  // one double: the gradients' sum of squares

  GptActivations acts_;      // on the device, sized for the current batch
  kernels::Tensor tokens_;   // (B,T) i32 on the device
  kernels::Tensor targets_;  // (B,T) i32 on the device
  std::vector<float> host_losses_, host_dlosses_;
  std::vector<float> host_params_;  // HostParams' copy
  bool have_loss_ = false;
};

}  // namespace shardline::model
