// The forward of one continuously batched inference step over a block KV cache (vLLM's paged
// attention): the tokens of several sequences, each at its own positions, run through the model
// together as one (N, C) batch, and each sequence's keys and values live in fixed-size cache
// blocks that its block table names, so sequences of any length share one pool without copying.
//
// The blocks are the training blocks (gpt_block.h, BlockForward) with the attention step swapped
// for one that writes the step's keys and values into the cache and attends over it; every
// GEMM, LayerNorm and GELU is the training code's. Which sequences run, at which positions, and
// which cache blocks they own is the serving scheduler's decision (worker/serving/
// batch_scheduler.h); this class only computes.
//
// A token's result depends only on its own sequence (the attention is per token and head, in
// position order), so greedy output does not depend on what else is in the batch — up to the
// GEMMs, whose rounding may depend on how many rows they multiply.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_block.h"

namespace shardline::model {

struct PagedCacheOptions {
  int num_blocks = 0;           // cache blocks (each block_size positions of every layer)
  int block_size = 16;          // positions per block
  int max_tokens_per_step = 0;  // N at most
  int max_seqs_per_step = 0;    // sequences (rows of block_tables) and logit rows at most
};

// One step's work, flattened over its sequences. Every span is read during Forward only.
struct PagedStep {
  std::span<const int32_t> tokens;     // (N)
  std::span<const int32_t> positions;  // (N): each token's position in its sequence
  std::span<const int32_t> token_seq;  // (N): the row of block_tables of each token's sequence
  // (num_seqs, max_blocks_per_seq): the cache block of each block_size positions of a sequence;
  // entries past a sequence's last position are ignored.
  std::span<const int32_t> block_tables;
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  // Rows of the N tokens whose next-token logits are wanted, in the order they are returned.
  std::span<const int32_t> logit_rows;
};

class PagedGptForward {
 public:
  // A cache and step buffers for `model`, from its allocator. InvalidArgument names a bad option;
  // ResourceExhausted when the cache does not fit. The model must outlive this and its
  // parameters must not change while it is used (the cache holds keys computed with them).
  static absl::StatusOr<std::unique_ptr<PagedGptForward>> Create(const GptModel& model,
                                                                 const PagedCacheOptions& options);
  // The cache bytes one block takes for `config`: keys and values of every layer.
  static int64_t BytesPerBlock(const GptConfig& config, int block_size);

  // Writes the keys and values of every token of `step` into its cache slot, then returns the
  // logits (R, V) of step.logit_rows (R rows, row-major), valid until the next Forward.
  // InvalidArgument, before any work, for sizes past the options, a token outside the
  // vocabulary, a position past max_seq_len, or a block or row index out of range.
  absl::StatusOr<std::span<const float>> Forward(const PagedStep& step);

  const PagedCacheOptions& options() const { return options_; }
  const GptConfig& config() const { return model_.config(); }

 private:
  PagedGptForward(const GptModel& model, const PagedCacheOptions& options)
      : model_(model), options_(options) {}
  absl::Status Validate(const PagedStep& step) const;
  float* KeyCache(int layer);
  float* ValueCache(int layer);

  const GptModel& model_;
  const PagedCacheOptions options_;
  kernels::Tensor cache_;   // per layer: keys (num_blocks, block_size, NH, HS), then values
  kernels::Tensor buffer_;  // the step's activations, carved in Create
  float* residual_[2] = {nullptr, nullptr};  // (N, C) in and out of a block, alternating
  BlockActivations acts_;                    // one block's, reused by every layer
  float* head_in_ = nullptr;                 // (R, C): the residual of the logit rows
  float* lnf_ = nullptr;                     // (R, C)
  float* lnf_stats_ = nullptr;               // (2R)
  float* logits_ = nullptr;                  // (R, V)
};

}  // namespace shardline::model
