// ShardedGpt: one rank's part of a decoder transformer — GPT-2's or Llama's family, as its
// ModelConfig's rows say (model/model_config.h) — trained with tensor, pipeline and data
// parallelism and ZeRO: the one engine every training path runs (a cluster actor, `shardline train` and
// OneRankGpt at tp = pp = dp = 1). On any plan its results equal the one-rank run's (same initial
// values, same global batch, same loss, same update) up to the order of floating-point sums; the
// one-rank run is checked against PyTorch (tests/unit/model_torch_reference_test.cc).
//
// Per training step (TrainStep):
//   * the rank's data-parallel share of the global batch is cut into micro-batches and run
//     through the pipeline by executing this stage's action list from the schedule the spec names
//     (placement/pipeline_schedule.h: 1F1B, or interleaved 1F1B over several chunks of layers per
//     stage): forwards and backwards of a micro-batch through a chunk, and the point-to-point
//     transfers of activations forward and gradients back (SendRecv where both directions are in
//     flight, as Megatron-LM's send_forward_recv_backward). The engine does not know which
//     schedule made the list;
//   * activation recomputation (parallel.recompute) decides what each block keeps between its
//     forward and backward (carver.h) and refills the rest before the backward (RecomputeBlock);
//   * inside a stage the tensor-parallel group runs Megatron's layers: one all-reduce after the
//     vocab-parallel embedding, two per block forward (after the row-parallel attention output and
//     MLP down-projection) and two per block backward (the column-parallel inputs' gradients), the
//     three per-row all-reduces of the vocab-parallel cross-entropy, and one for the head's input
//     gradient. No rank ever holds the full logits. Past kv_heads, the ranks that share a
//     key/value head sum its weight gradient (one more all-reduce per block backward);
//   * data parallelism is a strategy object chosen once (data_parallel.h: ZeRO 0-3): the passes
//     ask it for a unit's parameters (a unit is a layer, or an embedding table: see
//     shard_layout.h) and hand it each unit's gradient as soon as it is ready; it reduces them on
//     its communication thread, overlapping the rest of the backward pass, and keeps whole or
//     sharded what its stage says;
//   * tied embeddings on more than one stage: the first and last stage sum their wte gradients;
//   * the global gradient norm is one all-reduce over the world (each element counted once:
//     tensor-parallel replicas and the tied copy are skipped, each data-parallel rank counts the
//     part it owns); gradients are clipped and the strategy runs AdamW on what it updates.
//
// Every collective of the data-parallel group runs on the strategy's communication thread (a
// communicator is driven by one thread); the tensor-parallel, pipeline and world groups by the
// caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "kernels/tensor.h"
#include "placement/parallel_layout.h"
#include "placement/pipeline_schedule.h"
#include "worker/comm/communicator.h"
#include "worker/comm/shared_host_memory.h"
#include "worker/model/data_parallel.h"
#include "worker/model/embedding_head.h"
#include "worker/model/shard_layout.h"
#include "worker/model/state_piece.h"
#include "worker/model/training_recipe.h"

namespace shardline::model {

// This rank's communicators. Null stands for a group of one (nothing to communicate).
struct ShardedGroups {
  comm::Communicator* world = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* pp = nullptr;
  comm::Communicator* dp = nullptr;
  // The ranks of this rank's data-parallel replica (tp × pp, one dp index): under DiLoCo the
  // gradient norm and the loss are the replica's, and nothing but the outer step crosses replicas.
  comm::Communicator* replica = nullptr;
};

struct ShardedOptions {
  ModelConfig config;
  // tp, pp, dp, zero, micro_batch (resolved), stage_layers, schedule, virtual_stages, recompute
  placement::ParallelSpec parallel;
  placement::RankCoords coords;
  int64_t global_batch = 0;          // sequences per step over the whole data-parallel group
  int seq_len = 0;
  AdamWOptions adamw;                // learning_rate is given per step
  placement::DataParallelSpec data_parallel;  // buckets, compression, DiLoCo
  DataParallelTrace* trace = nullptr;         // optional, for tests (data_parallel.h)
};

// Writes the inputs and targets of `count` consecutive samples starting at global sample
// `first_sample` of the step's global batch, (count, seq_len) row-major.
using MicroBatchSource = std::function<absl::Status(int64_t first_sample, int64_t count,
                                                    std::vector<int32_t>& inputs,
                                                    std::vector<int32_t>& targets)>;

// Reads a box of a global tensor (offsets and shape in the ShardTensor's global view), e.g. from
// a checkpoint.
using BoxReader = std::function<absl::StatusOr<std::vector<float>>(
    const std::string& name, const std::vector<int64_t>& offsets,
    const std::vector<int64_t>& shape)>;

// The global shape of a checkpoint's tensor, or nullopt when it has none of that name.
using TensorShapeReader =
    std::function<std::optional<std::vector<int64_t>>(const std::string& name)>;

struct StepStats {
  float loss = 0;          // mean over the global batch (the same on every rank)
  double grad_norm = 0;    // before clipping (the same on every rank)
  bool skipped = false;    // the norm was not finite: parameters left untouched
  double seconds = 0;      // wall time of the step on this rank
  double compute_seconds = 0;  // the rest: kernels and the optimizer
  double comm_seconds = 0;     // tensor-parallel collectives, waiting for data-parallel ones,
                               // the gradient norm and ZeRO gathers
  double bubble_seconds = 0;   // pipeline send/receive: waiting for a neighbouring stage
};

struct ShardedMemory {
  int64_t param_bytes = 0;      // parameters kept between steps (ZeRO 3: the 1/dp shard)
  int64_t grad_bytes = 0;       // gradients kept between micro-batches (ZeRO 2/3: the shard)
  int64_t optimizer_bytes = 0;  // AdamW moments (ZeRO 1-3: the shard)
  // Activations kept from forward to backward (the micro-batch slots in flight), the backward's
  // working buffer, the recomputation scratch and the held gradients.
  int64_t activation_bytes = 0;
};

class ShardedGpt {
 public:
  // Validates the options against the config (see ShardLayout::Create, placement::
  // ValidateParallel) and allocates parameters, gradients and optimizer state from the backend's
  // allocator; every layer runs on `backend` (which must outlive the model): the CPU's with host
  // communicators, or CUDA's with nccl or staged ones (InvalidArgument names a group whose
  // buffers are another device's). Starts the communication thread.
  static absl::StatusOr<std::unique_ptr<ShardedGpt>> Create(const ShardedOptions& options,
                                                            const ShardedGroups& groups,
                                                            kernels::Backend& backend);
  ~ShardedGpt();
  ShardedGpt(const ShardedGpt&) = delete;
  ShardedGpt& operator=(const ShardedGpt&) = delete;

  const ShardLayout& layout() const { return layout_; }
  const placement::PipelineSchedule& schedule() const { return *schedule_; }
  ShardedMemory memory() const;
  // Bytes allocated outside the allocator given to Create, in memory the peers of a
  // shared-memory group map (the gradients over a shared-memory data-parallel group under
  // ZeRO 0-1; activations and backward scratch over a shared-memory tensor-parallel group).
  int64_t shared_bytes() const;

  // ModelParams::Gpt2Init's values, each rank drawing exactly the elements of its boxes (the draws
  // are indexed by global element, see counter_rng.h). Clears the optimizer state.
  absl::Status InitGpt2(uint64_t seed);
  // Loads the parameters and, `with_moments`, both AdamW moments (StateTensorName) by boxes from
  // `read`, reading only what this rank keeps: each parameter's whole box, but under ZeRO 3 only
  // the part of it this rank owns; moments whole under ZeRO 0, the owned part under ZeRO 1-3.
  // Without moments the optimizer state is cleared. Errors name the tensor. Needs no collective.
  // `shape_of` (optional) tells whether the checkpoint holds a tensor and its global shape: a
  // strategy's state (DiLoCo's, error feedback) that the checkpoint lacks, or holds for fewer
  // sites, is then loaded from its fallback or zeroed (SavedState); without it every tensor must
  // be there.
  absl::Status LoadState(const BoxReader& read, bool with_moments,
                         const TensorShapeReader& shape_of = nullptr);

  // The pieces of the training state this rank saves, parameters then exp_avg then exp_avg_sq:
  // of each tensor, the part this rank owns under its unit's data-parallel partition (ZeRO's, at
  // every stage, so that the data-parallel ranks share the writing), cut into boxes
  // (checkpoint::SplitFlatRange); tensor-parallel replicas only on tensor-parallel rank 0, the
  // tied copy of wte never. Together the world's pieces cover the whole state exactly once.
  //
  // kHeld instead: everything this rank keeps (LoadState's boxes: under ZeRO 0 its whole boxes
  // of every kind, under ZeRO 1-2 whole parameters and owned moments, under ZeRO 3 the owned
  // part; tensor-parallel replicas on every tensor-parallel rank). The world's pieces then cover
  // the state with identical replicas, so that the ranks of any node together hold what they
  // train with: the memory tier's copies (worker/training/memory_tier.h), from which the
  // surviving nodes' ranks alone can give a lost node's boxes back. Under DiLoCo, whose sites
  // train models of their own, kHeld is kSaved.
  enum class Share { kSaved, kHeld };
  std::vector<StatePiece> StatePieces(Share share = Share::kSaved) const;
  // Their values, back to back in StatePieces order; `out` holds the sum of their numel. No
  // collective: under ZeRO 3 each rank copies only what it owns.
  absl::Status CopyState(std::span<float> out, Share share = Share::kSaved) const;

  // One optimizer step on global step `step` (1-based: AdamW's bias correction) with the given
  // learning rate. Every rank of the job must call it together. Errors: a communicator failure
  // (naming the group and the operation) or a bad micro-batch from `source`.
  absl::StatusOr<StepStats> TrainStep(const MicroBatchSource& source, int64_t step,
                                      float learning_rate);

  // This rank's value of every tensor it holds, in layout().tensors() order. Under ZeRO 3 it
  // gathers every unit over the data-parallel group first, so all data-parallel ranks must call
  // it together.
  absl::StatusOr<std::vector<std::vector<float>>> TensorValues();

 private:
  struct Slot;

  ShardedGpt(const ShardedOptions& options, const ShardedGroups& groups, ShardLayout layout,
             kernels::Backend& backend);
  absl::Status Allocate();
  // The (micro-batch, T) dims of one block on this rank: its heads and MLP columns.
  BlockDims MicroBatchDims() const;
  // Writes one tensor's box (ZeRO 3: the part this rank owns) into the parameters.
  absl::Status StoreTensor(const ShardTensor& tensor, std::span<const float> values);
  // Calls fn(tensor, begin, end) for every tensor this rank saves of `kind`, [begin, end) being
  // the part of its box (flat, row-major) that it saves (DataParallelStrategy::SavedRange).
  template <typename Fn>
  void ForEachSavedRange(checkpoint::StateKind kind, Share share, Fn&& fn) const;

  // The unit holding the head's rows (wte's when tied on one stage), and the two ends' weights
  // from their units' parameters.
  int HeadUnit() const;
  EmbeddingWeights EmbeddingWeightsOf(const float* wte, const float* wpe) const;
  HeadWeights HeadWeightsOf(const float* lnf, const float* head) const;
  // Whether chunk c begins with the embedding / ends with the head and loss.
  bool HoldsEmbedding(int chunk) const;
  bool HoldsHead(int chunk) const;
  // The slot holding (micro_batch, chunk)'s activations, taken from the chunk's free ones at the
  // first use; Release gives it back after the backward.
  Slot& SlotFor(int micro_batch, int chunk);
  // The buffer of (micro_batch, chunk)'s input, taken at the first use (a receive, or the forward
  // that embeds it); released with its slot.
  float* InputFor(int micro_batch, int chunk);
  // Every slot and held-gradient buffer free, as at the start of a step.
  void ResetInFlight();
  void ReleaseSlot(int micro_batch, int chunk);

  absl::Status Forward(Slot& slot, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& targets, double& loss_sum);
  // `dy` is the gradient of the chunk's output (ignored for the chunk that holds the head).
  absl::Status Backward(Slot& slot, const float* dy, bool last_micro_batch);
  // Runs one transfer action of the schedule (its buffers found from the micro-batch and chunk).
  absl::Status Transfer(const placement::PipeAction& action);
  absl::Status SumTiedEmbeddings();
  absl::StatusOr<double> OwnedSumOfSquares() const;

  absl::Status TpAllReduce(float* data, int64_t n, comm::ReduceOp op = comm::ReduceOp::kSum);
  // Sums `n` floats (a gradient of this rank's key/value heads' weights) over the tensor-parallel
  // ranks that hold the same heads, when tp exceeds kv_heads (BlockBackward's kv_grad_sum).
  absl::Status SumSharedKeyValueGrads(float* data, int64_t n);

  ShardedOptions options_;
  ShardedGroups groups_;
  ShardLayout layout_;
  kernels::Backend& backend_;
  kernels::Allocator& allocator_;  // the backend's
  // Memory the peers of a shared-memory group map, so that their all-reduces read it with no
  // copy (shared_host_memory.h): the gradients under ZeRO 0-1 over a shared-memory data-parallel
  // group, the activations and backward scratch over a shared-memory tensor-parallel one. Null
  // when neither. Declared before the tensors it holds, so it outlives them.
  std::unique_ptr<comm::SharedHostAllocator> shared_memory_;
  int micro_batches_ = 1;
  int64_t micro_batch_ = 1;
  // Parameters, gradients and AdamW moments, and how the data-parallel group keeps them in step.
  std::unique_ptr<DataParallelStrategy> data_parallel_;

  std::optional<placement::PipelineSchedule> schedule_;
  // Activations of micro-batches in flight: the chunks without the head share one pool (the
  // schedule's MaxInFlightWithoutHead slots), the head's chunk has its own; which are free, and
  // which slot holds which (chunk, micro-batch).
  std::vector<std::unique_ptr<Slot>> body_slots_, head_slots_;
  std::vector<Slot*> free_body_slots_, free_head_slots_;
  // The slots' inputs (the schedule's MaxInputs), in the same two pools, and which holds what.
  kernels::Tensor body_input_buffer_, head_input_buffer_;
  std::vector<float*> body_inputs_, head_inputs_, free_body_inputs_, free_head_inputs_;
  std::vector<std::vector<float*>> input_of_;  // [chunk][micro-batch], null when none
  std::vector<std::vector<Slot*>> slot_of_;  // [chunk][micro-batch], null when none
  // Gradients received before the pass ahead of their backward (MaxEarlyGradients of them);
  // held_[chunk][micro-batch] is where one waits, null when none.
  kernels::Tensor held_buffer_;
  std::vector<float*> held_buffers_, free_held_;
  std::vector<std::vector<float*>> held_;
  // The one block's buffers that recomputation refills (carver.h).
  kernels::Tensor recompute_buffer_;
  BlockActivations recomputed_;
  kernels::Tensor backward_buffer_;           // one backward at a time: shared scratch
  std::vector<float*> dresidual_;             // the largest chunk's layers + 1
  BlockGradScratch scratch_;
  float* dlnf_ = nullptr;
  float* dlogits_ = nullptr;
  float* dlosses_ = nullptr;

  // The tensor-parallel all-reduces (sum: the blocks' and the ends'; max: the loss's); empty
  // without tp.
  AllReduceFn tp_all_reduce_, tp_all_reduce_max_;
  AllReduceFn kv_grad_sum_;        // set when key/value heads are shared by ranks
  kernels::Tensor kv_sum_buffer_;  // every key/value head's slot, for kv_grad_sum_
  kernels::Tensor rope_inv_freq_;  // rotary positions: RotaryFrequencies, in backend memory
  // tp collectives; pipeline transfers; waiting for data-parallel ones and the norm's all-reduce.
  double tp_seconds_ = 0, pp_seconds_ = 0, dp_wait_seconds_ = 0;
  std::vector<float> losses_;  // a micro-batch's losses, read back to the host
  kernels::Tensor totals_;     // the norm's and the loss's sums, for the world's all-reduce
};

}  // namespace shardline::model
