// The buffers one forward (and backward) of a whole GPT over a (B,T) batch needs, carved out of one
// allocation so that the allocator's accounting shows the activation memory as one number.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/tensor.h"
#include "model/model_config.h"
#include "worker/model/gpt_block.h"

namespace shardline::model {

class GptActivations {
 public:
  // Sized for `config` (validated) at batch B, sequence T. Without `with_grads` only the forward's
  // buffers exist (inference) and the grad pointers below are null.
  static absl::StatusOr<GptActivations> Allocate(const ModelConfig& config, int B, int T,
                                                 bool with_grads, kernels::Allocator& allocator);

  GptActivations() = default;
  // Move-only: the pointers below point into buffer_, which a copy would share.
  GptActivations(GptActivations&&) = default;
  GptActivations& operator=(GptActivations&&) = default;
  GptActivations(const GptActivations&) = delete;
  GptActivations& operator=(const GptActivations&) = delete;

  int B() const { return B_; }
  int T() const { return T_; }
  bool with_grads() const { return with_grads_; }
  size_t nbytes() const { return buffer_.nbytes(); }

  // The residual stream at block boundaries: residual[l] (B,T,C) is block l's input, and
  // residual[layers] the last block's output. dresidual is their gradient (training only).
  std::vector<float*> residual;
  std::vector<float*> dresidual;
  std::vector<BlockActivations> blocks;
  BlockGradScratch scratch;  // shared by every block's backward
  float* lnf = nullptr;       // (B,T,C)
  float* lnf_mean = nullptr;  // (B,T)
  float* lnf_rstd = nullptr;  // (B,T)
  float* logits = nullptr;    // (B,T,V)
  float* losses = nullptr;    // (B,T)
  float* lse = nullptr;       // (B,T): log-sum-exp of each logits row, for the backward
  float* dlnf = nullptr;      // (B,T,C)
  float* dlogits = nullptr;   // (B,T,V)
  float* dlosses = nullptr;   // (B,T)

 private:
  kernels::Tensor buffer_;
  int B_ = 0;
  int T_ = 0;
  bool with_grads_ = false;
};

}  // namespace shardline::model
