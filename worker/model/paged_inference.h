// The forward of one continuously batched inference step over a block KV cache (vLLM's paged
// attention): the tokens of several sequences, each at its own positions, run through the model
// together as one (N, C) batch, and each sequence's keys and values live in fixed-size cache
// blocks that its block table names, so sequences of any length share one pool without copying.
//
// The blocks are the training blocks (gpt_block.h, BlockForward) with the attention step swapped
// for one that writes the step's keys and values into the cache and attends over it; every
// GEMM, LayerNorm and GELU is the training code's, and so is the tensor-parallel cut (Megatron's,
// shard_layout.h): a rank holds its heads (and caches only their keys and values), its MLP
// columns and its vocabulary rows; the embedding and the two row-parallel outputs per block are
// all-reduced over the tensor-parallel group, and the head gives the rank's vocabulary slice of
// the logits only (sample them with SampleVocabParallel). Pipeline parallel: a stage holds a
// range of layers; the first also embeds, the last also runs the head, and the residual stream
// of the step's tokens goes from stage to stage: a stage's Forward returns it, and the caller
// moves it into the next stage's StageInput (the serving engine's pipeline ring,
// worker/serving/step_message.h, with several steps in flight).
// Which sequences run, at which positions, and which cache blocks they own is the serving
// scheduler's decision (worker/serving/batch_scheduler.h); this class only computes.
//
// A token's result depends only on its own sequence (the attention is per token and head, in
// position order), so greedy output does not depend on what else is in the batch — up to the
// GEMMs, whose rounding may depend on how many rows they multiply.
//
// A step's products of up to kernels::cpu::SkinnyMatmulMaxRows(the weight's bytes) rows (decodes,
// with a short prompt chunk beside them on AVX-512 CPUs for a model that no cache holds) run on
// kernels::cpu::SkinnyMatmulForward where the CPU has AVX-512 or AVX2 (it streams each weight
// once). With MKL, the matrices of the blocks and the head
// are also packed once into MKL's layout (kernels::cpu::PackedWeight) for products of 17 to
// kPackedRows rows, which then run ~1.6x faster than plain sgemm (on the Xeon); that copy doubles
// the memory of those matrices on the rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"
#include "worker/model/gpt_block.h"
#include "worker/model/model_params.h"
#include "worker/model/shard_layout.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::model {

// The parameters one rank computes with, as pointers: into a ModelParams (the whole model), or into
// a ShardWeights' buffer (one tensor-parallel rank's part). They must outlive their users.
struct InferenceWeights {
  ModelConfig config;
  int tp_size = 1;
  int heads = 0;                        // query heads held here
  int kv_heads = 0;                     // key/value heads held here (ShardLayout::kv_heads)
  int ff = 0;                           // MLP columns held here
  int vocab_begin = 0, vocab_end = 0;   // rows of wte and of the head held here
  int pp_size = 1, stage = 0;           // this rank's pipeline stage
  int first_layer = 0, last_layer = 0;  // the stage's layers [first_layer, last_layer)
  std::vector<BlockParams> blocks;      // the stage's layers, from first_layer
  // The first stage's embeddings, the last stage's final norm and head (null elsewhere, and for
  // tensors the model has not: wpe under rotary positions, lnf_b for RMSNorm).
  const float* wte = nullptr;      // (vocab_end - vocab_begin, C)
  const float* wpe = nullptr;      // (max_seq_len, C)
  const float* lnf_w = nullptr;    // (C)
  const float* lnf_b = nullptr;    // (C)
  const float* lm_head = nullptr;  // (vocab_end - vocab_begin, C): wte's rows when tied

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp_size - 1; }

  // The whole model (tp 1), sharing its parameters.
  static InferenceWeights Of(const ModelParams& model);
};

// The layers [first, last) of pipeline stage `stage` of `pp` for inference: as even as they go,
// the earlier stages taking one more when pp does not divide the layers.
std::pair<int, int> InferenceStageLayers(int layers, int pp, int stage);

// One rank's parameters for inference (no gradients, no optimizer state): its tensor-parallel part
// of its pipeline stage, read box by box through `read` (e.g. training::ReadCheckpointBox), so a
// rank reads only its own part, into the memory of the backend that will compute with them.
class ShardWeights {
 public:
  // InvalidArgument when tp does not divide the heads and the MLP width, or there are more stages
  // than layers; read's errors name the tensor.
  static absl::StatusOr<std::unique_ptr<ShardWeights>> Load(const ModelConfig& config, int tp_size,
                                                            int tp_index, const BoxReader& read,
                                                            kernels::Backend& backend,
                                                            int pp_size = 1, int stage = 0);
  const InferenceWeights& weights() const { return weights_; }
  int64_t bytes() const { return layout_.total() * static_cast<int64_t>(sizeof(float)); }

 private:
  explicit ShardWeights(ShardLayout layout) : layout_(std::move(layout)) {}
  ShardLayout layout_;
  kernels::Tensor params_;
  InferenceWeights weights_;
};

// A BoxReader over a whole model's parameters (the global view of checkpoint boxes), for loading
// ShardWeights from a model in memory.
BoxReader ModelBoxReader(const ModelParams& model);

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
  // Products of up to this many rows (decode steps, short prompt chunks) use packed weights.
  static constexpr int kPackedRows = 64;

  // A cache and step buffers for `weights` (one pipeline stage's, or the whole model, in the
  // backend's memory: ShardWeights::Load's), from the backend's allocator; the step runs on
  // `backend`, the CPU's or CUDA's. `tp` is the tensor-parallel group (null for one rank; size
  // weights.tp_size), over the backend's memory (InvalidArgument for a host communicator on CUDA:
  // wrap it in comm::StagedCommunicator). InvalidArgument names a bad option; ResourceExhausted
  // when the cache does not fit. The weights must outlive this and not change while it is used (the
  // cache holds keys computed with them).
  static absl::StatusOr<std::unique_ptr<PagedGptForward>> Create(const InferenceWeights& weights,
                                                                 const PagedCacheOptions& options,
                                                                 kernels::Backend& backend,
                                                                 comm::Communicator* tp = nullptr);
  // The cache bytes one block takes on each rank of a tp × pp cut: keys and values of the most
  // layers a stage holds, for the rank's key/value heads.
  static int64_t BytesPerBlock(const ModelConfig& config, int block_size, int tp_size = 1,
                               int pp_size = 1);

  // Writes the keys and values of every token of `step` into its cache slot (the stage's layers),
  // then returns, on the last stage, this rank's logits (R, vocab_end - vocab_begin) of
  // step.logit_rows (R rows, row-major), and on any other stage the residual stream of the step's
  // tokens after its layers (N, C), for the next stage's StageInput; valid until the next
  // Forward. Both in host memory, whatever the backend (a device backend copies them back). A stage
  // other than the first reads its input from StageInput(N), which the caller fills first. The
  // ranks of a tensor-parallel group run the same step together. InvalidArgument, before any work,
  // for sizes past the options, a token outside the vocabulary, a position past max_seq_len, or a
  // block or row index out of range; a communicator error names the layer.
  absl::StatusOr<std::span<const float>> Forward(const PagedStep& step);

  // Where a stage other than the first takes the residual stream of a step of `num_tokens`
  // tokens (num_tokens, C) from the stage before, in host memory. Empty for a count past the
  // options.
  std::span<float> StageInput(int num_tokens);

  const PagedCacheOptions& options() const { return options_; }
  const InferenceWeights& weights() const { return weights_; }
  const ModelConfig& config() const { return weights_.config; }

 private:
  PagedGptForward(const InferenceWeights& weights, const PagedCacheOptions& options,
                  kernels::Backend& backend, comm::Communicator* tp)
      : weights_(weights), options_(options), backend_(backend), tp_(tp) {}
  absl::Status Validate(const PagedStep& step) const;
  // `n` floats of the backend's memory at `data` as host memory: themselves on the CPU, else
  // copied into `staging`.
  absl::StatusOr<std::span<const float>> OnHost(const float* data, size_t n,
                                                std::vector<float>& staging);
  bool on_host() const { return backend_.device() == kernels::Device::kCpu; }
  absl::Status TpAllReduce(float* data, int64_t n, const char* what);
  float* KeyCache(int layer);
  float* ValueCache(int layer);

  const InferenceWeights weights_;
  const PagedCacheOptions options_;
  kernels::Backend& backend_;
  // The stage's blocks as the forward uses them: weights_.blocks with their packed copies.
  std::vector<BlockParams> blocks_;
  std::vector<std::unique_ptr<kernels::cpu::PackedWeight>> packed_;
  const kernels::cpu::PackedWeight* head_packed_ = nullptr;
  comm::Communicator* const tp_;
  kernels::Tensor cache_;          // per layer: keys (num_blocks, block_size, KVH, HS), then values
  kernels::Tensor rope_inv_freq_;  // rotary positions: RotaryFrequencies in backend memory
  kernels::Tensor buffer_;  // the step's activations, carved in Create
  float* residual_[2] = {nullptr, nullptr};  // (N, C) in and out of a block, alternating
  BlockActivations acts_;                    // one block's, reused by every layer
  float* head_in_ = nullptr;                 // (R, C): the residual of the logit rows
  float* lnf_ = nullptr;                     // (R, C)
  float* lnf_stats_ = nullptr;               // (2R)
  float* logits_ = nullptr;                  // (R, vocab shard)
  // The step's integer arrays in the backend's memory: tokens, positions, token_seq (N each),
  // logit rows (R) and the block tables (R × blocks of max_seq_len).
  kernels::Tensor step_ints_;
  int32_t* tokens_ = nullptr;
  int32_t* positions_ = nullptr;
  int32_t* token_seq_ = nullptr;
  int32_t* block_tables_ = nullptr;
  // Host copies of what a device backend returns, and of a later stage's input.
  std::vector<float> host_out_, host_in_;
};

}  // namespace shardline::model
