// The cost model behind the placement planner: what a model is (parameters, FLOPs, activation
// sizes), how many bytes one rank of a layout holds (weights, gradients, optimizer state,
// activations in flight under its pipeline schedule, communication buffers) and how long one
// training step takes (compute and recomputation, tensor-parallel all-reduces, pipeline sends and
// bubble, data-parallel reduction). A layout's schedule and recomputation are its ParallelSpec's
// (schedule, virtual_stages, recompute).
// Pure arithmetic: no I/O, no cluster walking (the planner maps ranks to devices and hands this
// model the hardware each stage sees, StageHardware). Every constant has its source next to it in
// cost_model.cc.
//
// The memory model is Shardline's own implementation, element by element, so that with
// Precision::kFp32 PredictRankMemory gives the bytes a CPU actor's ShardedGpt
// (worker/model/sharded_gpt.cc, Allocate) holds: fp32 parameters, gradients and AdamW m and v
// (16 bytes per parameter at ZeRO 0; the ZeRO shards are ceil(unit / dp) per unit, as
// ShardedGpt pads them); the schedule's activation slots (StageSlots; 1F1B: min(pp − stage,
// micro-batches)), each a chunk's residual list and per layer what the recomputation mode keeps;
// one backward buffer sized for the stage's largest chunk; the recomputation's scratch for one
// layer; and the schedule's early gradient buffers (MaxEarlyGradients; 0 under 1F1B). With kBf16
// the same tensors are counted
// at 2 bytes (bf16 activations and weights, fp32 logits for the loss) and the optimizer keeps fp32
// master weights (ZeRO paper's 2 + 2 + 12 bytes per parameter).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "placement/cluster_spec.h"
#include "placement/parallel_layout.h"
#include "placement/pipeline_schedule.h"
#include "placement/train_spec.h"

namespace shardline::placement {

enum class OptimizerKind { kAdamW };  // the only one the trainer runs; two fp32 moments

// The training set-up the planner plans for: what TrainSpec says about a step, plus the choices
// that are the planner's to make within bounds.
struct TrainSetup {
  int64_t global_batch = 0;     // sequences per optimizer step, over all data-parallel ranks
  int64_t seq_len = 0;          // tokens per sequence (≤ model.max_seq_len)
  int64_t min_micro_batch = 1;  // the micro-batch sizes the planner may choose, inclusive;
  int64_t max_micro_batch = 0;  //   max 0: up to global_batch / dp
  Precision precision = Precision::kBf16;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
};

// A train job's set-up: its batch and seq_len, micro-batches of any size, fp32 on CPU actors.
TrainSetup TrainSetupFor(const TrainSpec& spec, Precision precision);

// ---- the model ----

struct ModelStats {
  int64_t params = 0;            // every parameter once (a tied embedding once)
  int64_t layer_params = 0;      // one transformer layer
  int64_t embedding_params = 0;  // wte, and wpe for gpt
  int64_t head_params = 0;       // final norm, plus lm_head when untied
  // Training FLOPs per token of one step: forward + backward (2×) of every matrix multiply and of
  // attention's QKᵀ and AV over the whole sequence (Narayanan et al. 2021, eq. 3's counting, no
  // causal halving), without recomputation: the "model FLOPs" MFU divides by (PaLM, App. B).
  double flops_per_token = 0;
  double layer_forward_flops_per_token = 0;  // one layer's forward
  double head_forward_flops_per_token = 0;   // the output projection's forward
};

// Expects a valid model (ParseModel's checks) and 1 ≤ seq_len.
ModelStats DeriveModel(const model::ModelConfig& model, int64_t seq_len);

// Activation bytes one layer keeps for its backward, for one micro-batch of `micro_batch`
// sequences on one tensor-parallel rank: its input on the residual stream and, by `recompute`,
//   kNone: everything its backward reads (ln inputs and outputs with their statistics, q/k/v, the
//     attention output and its log-sum-exp, the MLP's hidden activations);
//   kSelective: that without what is cheap to rebuild — both norms' outputs, the attention output
//     and the GELU's (SwiGLU's product's) output — keeping the statistics, q/k/v, the log-sum-exp,
//     resid_mid and the MLP's pre-activations (Korthikanti et al. 2022 §5's selective
//     recomputation, with our attention keeping its log-sum-exp instead of the probabilities);
//   kFull: nothing more (Korthikanti et al. 2022 §4.2: 2sbh bytes in bf16 per layer).
// The per-rank slot adds the chunk's output and, on the last stage, the logits.
int64_t LayerActivationBytes(const model::ModelConfig& model, int64_t seq_len, int64_t micro_batch,
                             int tp, Precision precision, RecomputeMode recompute);

// ---- memory ----

struct MemoryBreakdown {
  int64_t params = 0;       // weights kept between steps (ZeRO 3: the 1/dp shard)
  int64_t grads = 0;        // gradients kept between micro-batches (ZeRO 2/3: the shard)
  int64_t optimizer = 0;    // AdamW m and v (+ fp32 master weights with bf16; ZeRO ≥ 1: shard)
  int64_t activations = 0;  // the micro-batch slots in flight under 1F1B
  int64_t backward = 0;     // the backward's working buffer (one micro-batch at a time)
  // Peak transient buffers: ZeRO 3's gathered units, ZeRO 2/3's gradient scratch and
  // reduce-scatter shards in flight, ZeRO 1/2's post-update all-gather, the tied embeddings'
  // gradient exchange (see TransientPeak in cost_model.cc for the walk).
  int64_t comm_buffers = 0;
  // What the model holds: the sum of the above. The device must also hold the runtime's memory
  // and the fragmentation reserve (CostModelOptions); the planner compares against what is left.
  int64_t total() const {
    return params + grads + optimizer + activations + backward + comm_buffers;
  }
};

// The bytes of one rank of pipeline stage `stage` as a function of the stage's layer count n:
// fixed + n · per_layer, exactly (the planner's layer → stage split and its memory bound use it).
// Under the interleaved schedule a stage's n layers are `chunks` equal chunks, and its activations
// and backward buffer grow with a chunk's layers: those two are fixed + (n / chunks) · per_layer.
struct StageMemoryTerms {
  MemoryBreakdown fixed;      // embedding (first stage), head and loss (last), buffers
  MemoryBreakdown per_layer;  // one more layer on the stage (activations, backward: on each chunk)
  int chunks = 1;             // the stage's chunks of layers: 1 under 1F1B
  // The rank's parameters before ZeRO shards them (what data parallelism reduces), in elements.
  int64_t fixed_param_count = 0;
  int64_t layer_param_count = 0;
  // The transient buffers stop growing with the layers once the communication queue is full:
  // fixed.comm_buffers is their peak for a stage of 4 or more layers, comm_buffers_few[n − 1]
  // for n = 1..3 (never more than fixed.comm_buffers). per_layer.comm_buffers is 0.
  int64_t comm_buffers_few[3] = {0, 0, 0};
  MemoryBreakdown At(int64_t layers) const;
};

// What the pipeline schedule makes a stage keep, as ShardedGpt::Allocate pools it: activation
// slots for the forwards in flight, each sized for one of the stage's (equal) chunks — a pool
// the chunks without the head share (PipelineSchedule::MaxInFlightWithoutHead) and, on the last
// stage, the head's chunk's own (MaxInFlight of its last chunk), whose slots also hold the head;
// the chunks' inputs, an (N, C) buffer each from their arrival to their backward's end
// (MaxInputsWithoutHead, and MaxInputs of the head's chunk); and the gradients held apart
// (MaxEarlyGradients: another backward or gradient receive comes before their own backward), an
// (N, C) buffer each.
struct StageSlots {
  int chunks = 1;
  int64_t body_slots = 0;
  int64_t head_slots = 0;
  int64_t inputs = 0;
  int64_t early_gradients = 0;
};

// Every stage's StageSlots for `parallel` (validated; schedule and virtual_stages read) running
// `micro_batches` micro-batches per step. 1F1B: min(pp − stage, micro-batches) slots (the last
// stage's one is the head's), as many inputs and no held gradient, the schedule's numbers in
// closed form (PipelineSchedule's header states them; the planner prices thousands of 1F1B layouts
// and need not build each); interleaved: PipelineSchedule::Of's. Its error for sizes it cannot
// schedule.
absl::StatusOr<std::vector<StageSlots>> ScheduleSlots(const ParallelSpec& parallel,
                                                      int64_t micro_batches);

// `parallel` needs tp, pp, dp, zero and micro_batch (resolved, ≥ 1) and its recompute mode;
// stage_layers is not read. `vocab_rows` is the rank's vocabulary shard (VocabShardRows); `slots`
// the stage's (ScheduleSlots). Expects a valid layout.
StageMemoryTerms StageMemory(const model::ModelConfig& model, const TrainSetup& setup,
                             const ParallelSpec& parallel, int stage, int64_t vocab_rows,
                             const StageSlots& slots);

// The vocabulary rows tensor-parallel rank `tp_index` of `tp` holds, as ShardLayout cuts them
// ([V·r/tp, V·(r+1)/tp)); the largest shard over all ranks when tp_index is −1.
int64_t VocabShardRows(int64_t vocab, int tp, int tp_index);

// The bytes one rank of `parallel` (validated, micro_batch resolved or 0 for batch/dp; its
// schedule and recompute mode) holds while training `model` with `setup`'s global batch, seq_len
// and precision. InvalidArgument when the layout is not valid for the model and batch
// (ValidateParallel's message) or the rank is outside it. With kFp32 this is ShardedGpt's
// allocation exactly (after Create: total() − comm_buffers), and comm_buffers its transient peak
// in a training step (for ZeRO 2 the worst case of a full communication queue, which CPU actors
// reach).
absl::StatusOr<MemoryBreakdown> PredictRankMemory(const model::ModelConfig& model,
                                                  const TrainSetup& setup,
                                                  const ParallelSpec& parallel, int rank);
// Every rank's, in rank order.
absl::StatusOr<std::vector<MemoryBreakdown>> PredictMemoryPerRank(const model::ModelConfig& model,
                                                                  const TrainSetup& setup,
                                                                  const ParallelSpec& parallel);

// ---- time ----

// The tunable constants of the model; the defaults and their sources are in cost_model.cc.
struct CostModelOptions {
  // Fraction of a device's peak FLOP/s a transformer layer reaches when calibration has measured
  // nothing (kernels other than GEMMs included).
  double default_flops_fraction = 0;
  // GEMM efficiency falls off for thin matrices: a layer whose thinnest GEMM dimension is d (the
  // micro-batch's tokens or the width one tensor-parallel rank holds) runs at d / (d +
  // gemm_half_dim) of the large-GEMM rate, on devices whose calibration did not measure the
  // fall-off (NodeSpec::measured_half_dim, a function of min(tokens, d_model); see StageCost).
  double gemm_half_dim = 0;
  // Fraction of a link's nominal bandwidth a collective reaches (unused for measured links).
  double link_efficiency = 0;
  // Fraction of each device's memory kept free for allocator fragmentation.
  double fragmentation_reserve = 0;
  // Fraction of the data-parallel reduction hidden behind the backward pass it overlaps with.
  double dp_overlap = 0;

  static CostModelOptions Defaults();
};

// What one pipeline stage's devices offer (the slowest of them, for a stage spread over several
// nodes or device kinds). The planner fills it from the rank → device map.
struct StageHardware {
  double flops = 0;             // achievable FLOP/s per device (calibrated or peak × fraction)
  double half_dim = -1;         // its fall-off for thin layers; < 0: CostModelOptions
  double memory_bandwidth = 0;  // bytes/s per device (optimizer step)
  double tp_bandwidth = 0;      // bytes/s, the link inside the tensor-parallel group
  double tp_latency_s = 0;
  double dp_bandwidth = 0;  // bytes/s, the slowest link of the data-parallel group
  double dp_latency_s = 0;
  double p2p_bandwidth = 0;  // bytes/s, to the next stage (unused on the last)
  double p2p_latency_s = 0;
  double prev_p2p_bandwidth = 0;  // bytes/s, to the previous stage (unused on the first)
  double prev_p2p_latency_s = 0;
};

// One step's predicted time, split the way StepStats measures it. total = compute + tp + pp +
// bubble + dp + optimizer.
struct StepTime {
  double compute = 0;    // the bottleneck stage's forward and backward kernels, all micro-batches
  double tp = 0;         // its tensor-parallel all-reduces
  double pp = 0;         // its point-to-point activation and gradient transfers
  double bubble = 0;     // the schedule's fill and drain: the other stages' share of the path
  double dp = 0;         // the data-parallel reduction (and ZeRO gathers) not hidden by overlap
  double optimizer = 0;  // AdamW's update of the rank's (shard of the) parameters
  double total = 0;
};

// The time of one stage for one micro-batch (forward + backward, its own tp all-reduces and its
// sends), the quantity the layer → stage split balances: fixed() + per_layer() · layers.
struct StageCostTerms {
  double fixed_compute = 0;  // embedding (first stage), head and loss (last stage)
  double fixed_tp = 0;       // their tensor-parallel all-reduces
  double p2p = 0;            // sending the activations forward and the gradients back (each chunk)
  double layer_compute = 0;  // one transformer layer, forward and backward (and recomputation)
  double layer_tp = 0;       // its tensor-parallel all-reduces
  double fixed() const { return fixed_compute + fixed_tp + p2p; }
  double per_layer() const { return layer_compute + layer_tp; }
  double At(int64_t layers) const { return fixed() + static_cast<double>(layers) * per_layer(); }
};
// `par`'s recompute mode prices the recomputation: kFull one more forward of every layer with its
// two tensor-parallel all-reduces; kSelective the attention's forward (QKᵀ and AV, at the layer's
// rate) and the memory traffic of the rebuilt norms, attention output and GELU (at
// memory_bandwidth). Its schedule prices the sends: the interleaved one sends every micro-batch's
// activation and gradient once per chunk.
StageCostTerms StageCost(const model::ModelConfig& model, const TrainSetup& setup,
                         const ParallelSpec& par, int stage, const StageHardware& hw,
                         const CostModelOptions& options);

// The step time of `parallel` (validated, stage_layers resolved or empty for BalancedStages) with
// hw[s] for stage s (pp entries).
StepTime PredictStepTime(const model::ModelConfig& model, const TrainSetup& setup,
                         const ParallelSpec& parallel, const std::vector<StageHardware>& hw,
                         const CostModelOptions& options);

// PredictStepTime's arithmetic on stage terms already computed (terms[s] = StageCost of stage s;
// `memory`, when given, StageMemory of every stage) and `layers[s]` layers on stage s; `parallel`
// needs micro_batch resolved. The planner uses it to time candidates without recomputing terms.
// The bubble is the schedule's: (Σ_s t_s − max_s t_s) / virtual_stages for stage times t_s of one
// micro-batch, which for equal stages is (pp − 1)/m of the step under 1F1B and (pp − 1)/(v·m)
// interleaved (Narayanan et al. 2021 §2.2).
StepTime StepTimeOfStages(const model::ModelConfig& model, const TrainSetup& setup,
                          const ParallelSpec& parallel, const std::vector<StageHardware>& hw,
                          const std::vector<StageCostTerms>& terms, const std::vector<int>& layers,
                          const CostModelOptions& options,
                          const std::vector<StageMemoryTerms>* memory = nullptr);

// The link latencies one collective over `ranks` ranks pays in the time model: 2·ceil(log2 ranks),
// NCCL's tree start-up (the sources are in cost_model.cc); 0 for one rank. Calibration divides a
// measured collective's start-up time by it to get a link latency.
double CollectiveLatencySteps(int ranks);

// Achievable FLOP/s of one device of `node` in `precision` on wide layers: what calibration
// measured (a whole layer's rate), else peak × default_flops_fraction.
double AchievableFlops(const NodeSpec& node, Precision precision, const CostModelOptions& options);
// The measured fall-off of that rate for thin layers (StageHardware::half_dim): the node's when
// its rate in `precision` was measured and its fall-off too, else −1 (StageCost then applies
// CostModelOptions::gemm_half_dim the way it is meant for GPU GEMM tiles).
double MeasuredHalfDim(const NodeSpec& node, Precision precision);

}  // namespace shardline::placement
