// The placement planner: given a model, a cluster and a training set-up, choose the layout —
// (tp, pp, dp, ZeRO stage, micro-batch size, pipeline schedule, activation recomputation,
// layer → stage split) — and
// the rank → device map that fits in every device's memory and gives the shortest step, and say
// why (`shardline plan`, and `parallel: auto` jobs in the coordinator). No I/O.
//
// Search. Every (tp, pp, dp, zero, micro_batch, schedule, recompute) within the constraints is a
// candidate: tp divides heads, kv_heads and d_ff and fits in one node (tensor-parallel groups
// never cross a node); pp ≤ layers; dp divides the global batch and micro_batch·dp divides it too;
// tp·pp·dp ≤ the cluster's devices (fewer when that is faster or the only fit); the schedule is
// 1F1B or interleaved with V virtual stages where ValidateParallel allows it (pp ≥ 2, pp·V divides
// the layers, pp the micro-batches), whose layer split is always even; recomputation none,
// selective or full, which trades step time for activation memory (so that memory can be bought
// with recomputation instead of tensor parallelism, as Megatron-LM users do). A candidate is
// first checked against a cheap exact memory bound (does any layer split fit every stage?) and
// only the survivors are timed — unless a lower bound of their step time (FLOPs over the devices'
// rate; the fractional best split with the pipeline's fill) cannot beat the few fastest found so
// far, which are searched first by visiting the largest worlds first. (ZeRO ≥ 1 with dp = 1 is
// ZeRO 0 and is not searched twice.) The best few are then refined: the layer → stage split by
// dynamic programming (minimising the slowest stage, the first stage carrying the embedding and the
// last the head and loss, every stage within its devices' memory) and both rank → device maps
// (data-parallel groups packed into nodes, or pipelines packed into nodes) are costed. Every plan
// returned passes ValidateParallel with its tp·pp·dp as the device count.
//
// Mapping. Ranks are rank = tp_index + tp·(dp_index + dp·pp_index) (parallel_layout.h). A
// tensor-parallel group takes tp devices of one node; nodes are used fastest first (then largest
// memory, then spec order), so a plan that does not need every device leaves the slowest idle.
// "dp-inner" places the groups of one stage next to each other (data-parallel rings inside a node
// where they fit, stages on neighbouring nodes); "pp-inner" places one pipeline's stages next to
// each other (stage-to-stage sends inside a node). Heterogeneous clusters (nodes of other memory
// or speed) are planned stage by stage: each stage is as fast as its slowest device and as large
// as its smallest, and the split gives slow or small stages fewer layers.
//
// Calibration. At start-up the actors measure, and the coordinator stores in the ClusterSpec:
//   NodeSpec::measured_flops_fp32 / measured_half_dim — the FLOP/s a transformer layer's forward
//     and backward reaches per device on wide layers, and its fall-off for thin ones;
//   NodeSpec::intra_node.measured_bandwidth — all-reduce bus bandwidth inside the node, bytes/s;
//   NodeSpec::inter_node.measured_bandwidth — the same across nodes.
// The time model takes a measured value over the datasheet's: compute runs at the measured layer
// rate with its measured fall-off (else peak × CostModelOptions::default_flops_fraction with the
// default gemm_half_dim); collectives at the measured bus bandwidth (else nominal ×
// link_efficiency). Unmeasured fields stay 0 and the datasheet numbers are used.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/cluster_spec.h"
#include "placement/cost_model.h"
#include "placement/parallel_layout.h"
#include "placement/train_spec.h"

namespace shardline::placement {

// What the caller fixes; 0 (or -1 for zero) leaves the choice to the planner.
struct PlanConstraints {
  int devices = 0;  // exactly this many ranks (tp·pp·dp); 0: any up to the cluster's
  int tp = 0;
  int pp = 0;
  int dp = 0;
  int zero = -1;                                // a fixed ZeRO stage; -1: any of zero_stages
  std::vector<int> zero_stages = {0, 1, 2, 3};  // the stages the planner may choose from
  int64_t micro_batch = 0;  // a fixed micro-batch size (also bounded by TrainSetup's range)
  // The activation recomputation modes the planner may choose (at least one).
  std::vector<RecomputeMode> recompute_modes = {RecomputeMode::kNone, RecomputeMode::kSelective,
                                                RecomputeMode::kFull};
  // The pipeline schedules it may choose, by chunks of layers per stage (at least one): 1 is
  // 1F1B, V ≥ 2 the interleaved schedule with V virtual stages (for pp ≥ 2 only: with pp = 1
  // only 1 is tried). Megatron-LM users interleave 2-4 chunks: past that the sends grow and the
  // layers per chunk shrink for a bubble already small.
  std::vector<int> virtual_stages = {1, 2, 4};
  // A fixed layer → stage split (pp entries, summing to the layers; needs pp fixed); empty: the
  // planner splits by cost. With every field fixed the planner prices one layout: what the
  // coordinator predicts for a job whose spec fixes its layout.
  std::vector<int> stage_layers;
};

struct PlanRequest {
  model::ModelConfig model;
  ClusterSpec cluster;
  TrainSetup train;
  PlanConstraints constraints;
  CostModelOptions cost = CostModelOptions::Defaults();
  int alternatives = 4;  // next-best plans to report (distinct layouts)
};

// The device one rank runs on.
struct DevicePlace {
  int node = 0;         // index into ClusterSpec::nodes
  std::string node_id;  // ClusterSpec::nodes[node].id
  int device = 0;       // 0 .. nodes[node].devices − 1
};

struct PlannedLayout {
  // tp, pp, dp, zero, micro_batch (resolved, ≥ 1), schedule, virtual_stages and recompute, and
  // stage_layers: pp entries under 1F1B; empty under the interleaved schedule, whose split is
  // always even (ChunksOf; see stage_layers below).
  ParallelSpec parallel;
  std::vector<int> stage_layers;     // layers per stage (pp entries), whatever the schedule
  int64_t micro_batches = 0;         // per step per data-parallel rank: batch / (dp · micro_batch)
  std::string mapping;               // "dp-inner" or "pp-inner" (see above)
  std::vector<DevicePlace> devices;  // rank → device, world() entries

  // Memory: the fullest rank of each stage (largest vocabulary shard), and of the whole plan.
  std::vector<MemoryBreakdown> stage_memory;  // pp entries
  MemoryBreakdown memory;                     // the fullest rank's, relative to its device
  int peak_stage = 0;                         // the stage of that rank
  // What that rank's device offers the model: device_memory − runtime_memory − the
  // fragmentation reserve. memory.total() ≤ memory_capacity for every rank of a returned plan.
  int64_t memory_capacity = 0;

  StepTime time;
  double tokens_per_s = 0;             // global_batch · seq_len / time.total
  double tokens_per_s_per_device = 0;  // over the world() devices in use
  double model_flops_per_step = 0;     // ModelStats::flops_per_token · tokens per step
  // Model FLOP utilisation: model FLOPs per second over the used devices' peak FLOP/s in the
  // set-up's precision (PaLM's definition; recomputation is not counted as useful work).
  double mfu = 0;
};

// Why candidates were dropped, one entry per reason, with how many and the first example, e.g.
// {"out of memory", 1234, "tp=1 pp=2 dp=8 zero=0 mb=4: stage 0 needs 95.1 GiB, 72.0 GiB free"}.
struct Rejection {
  std::string reason;
  int64_t count = 0;
  std::string example;
};

struct PlanReport {
  ModelStats model;
  TrainSetup train;
  std::string cluster_name;
  int64_t cluster_devices = 0;
  PlannedLayout best;
  std::vector<PlannedLayout> alternatives;  // the next best, fastest first
  std::vector<Rejection> rejected;          // most frequent first
  // Every (tp, pp, dp, zero, micro_batch, schedule, recompute) looked at: dp divides the global
  // batch, micro_batch divides batch/dp inside the allowed range, tp up to the largest node, pp up
  // to the layers, within the constraints. Each is either rejected (one reason) or feasible:
  // candidates = feasible + Σ rejected[i].count.
  int64_t candidates = 0;
  int64_t feasible = 0;  // fit in memory and were timed
  double planning_seconds = 0;
};

// The best plan, or:
//   InvalidArgument for a bad request: an invalid cluster (ValidateClusterSpec's message), a
//     model or set-up that is inconsistent (seq_len past max_seq_len, global batch < 1), or
//     constraints no layout meets (every candidate was indivisible or out of range; the message
//     gives the rule with an example);
//   ResourceExhausted when layouts exist but none fits in memory, saying by how much the closest
//     candidate misses: "no layout fits: the closest, tp=8 pp=16 dp=1 zero=3 micro_batch=1
//     recompute=full, needs 97.3 GiB on stage 0 where 72.1 GiB is free (25.2 GiB short)".
absl::StatusOr<PlanReport> Plan(const PlanRequest& request);

// The report for people: the chosen layout, its memory per device and step time broken down,
// throughput and MFU; with `explain` also the alternatives, the rejection counts with their
// examples, the stage split and a summary of the rank → device map.
std::string FormatPlan(const PlanReport& report, bool explain);

// The report for programs: every field of PlanReport (rank map as [{rank, node, node_id,
// device}]), byte counts as integers, times in seconds.
nlohmann::json PlanToJson(const PlanReport& report);

}  // namespace shardline::placement
