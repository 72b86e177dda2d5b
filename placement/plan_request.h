// The training set-up of `shardline plan --train FILE` (examples/plan-train.yaml), and the
// PlanRequest both `shardline plan` and the coordinator's `parallel: auto` jobs hand the planner.
//
//   global_batch: 512        # required: sequences per optimizer step, over all data-parallel ranks
//   seq_len: 2048            # tokens per sequence; default the model's max_seq_len
//   micro_batch: 4           # a fixed micro-batch size, or a range {min: 1, max: 8}; default any
//   dtype: bf16              # fp32 | bf16; default fp32 on a cluster of CPU nodes, else bf16
//   zero: [0, 1, 2, 3]       # the ZeRO stages the planner may pick; default all four
//   recompute: true          # the recomputation modes it may pick: true (none, selective, full),
//                            # false (none), one mode or a list of them; default true
//   schedule: [1f1b, interleaved]  # the pipeline schedules it may pick; default both
//   virtual_stages: [2, 4]   # interleaved: the chunks per stage it may pick; default 2 and 4
//   devices: 64              # exactly this many devices (tp·pp·dp); default any up to the
//   cluster's
//
// Errors are InvalidArgument "SOURCE:LINE:COL: PATH: message" (yaml_reader.h). No I/O but
// reading the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "placement/cluster_spec.h"
#include "placement/cost_model.h"
#include "placement/job_spec.h"
#include "placement/planner.h"
#include "placement/train_spec.h"

namespace shardline::placement {

// What a train set-up file says; unset fields are resolved by PlanRequestFor against the model
// and the cluster.
struct PlanTrainSpec {
  int64_t global_batch = 0;
  int64_t seq_len = 0;  // 0: the model's max_seq_len
  int64_t min_micro_batch = 1;
  int64_t max_micro_batch = 0;         // 0: no upper bound but the batch's
  std::optional<Precision> precision;  // unset: by the cluster's devices
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<RecomputeMode> recompute_modes = {RecomputeMode::kNone, RecomputeMode::kSelective,
                                                RecomputeMode::kFull};
  // PlanConstraints::virtual_stages: 1 for 1F1B, the interleaved schedule's chunk counts after.
  std::vector<int> virtual_stages = {1, 2, 4};
  int devices = 0;  // 0: any
  // `checkpoint: {memory_interval, memory_replicas}` as a train job has them: `shardline plan`
  // prints the host memory the memory steps would take per rank of the best plan.
  int64_t memory_interval = 0;
  int64_t memory_replicas = 0;
};

absl::StatusOr<PlanTrainSpec> ParsePlanTrainSpec(const std::string& yaml_text,
                                                 const std::string& source_name);
// Reads and parses `path`; NotFound naming the path when it does not exist.
absl::StatusOr<PlanTrainSpec> LoadPlanTrainSpecFile(const std::string& path);

// The set-up when no file is given: a global batch of kDefaultPlanGlobalBatch sequences of the
// model's max_seq_len, everything else the planner's to choose.
inline constexpr int64_t kDefaultPlanGlobalBatch = 256;
PlanTrainSpec DefaultPlanTrainSpec();

// fp32 when every node of `cluster` is a CPU node (the CPU trainer's precision), else bf16.
Precision DefaultPrecision(const ClusterSpec& cluster);

// The planner's request for `model` on `cluster` with `train`. InvalidArgument when the set-up
// does not fit the model (seq_len past max_seq_len), naming the values.
absl::StatusOr<PlanRequest> PlanRequestFor(const model::ModelConfig& model,
                                           const ClusterSpec& cluster, const PlanTrainSpec& train);

// The request for a `parallel: auto` train job on `cluster` (the devices it may use): its model,
// batch and seq_len; its micro_batch when the spec fixes one; the precision the job's devices
// train in (fp32 on CPU, bf16 on CUDA). The planner chooses the rest, the schedule and the
// recomputation among them (on CPU as on GPU: recomputation only costs time, so the time model
// picks it only where memory needs it).
PlanRequest PlanRequestForJob(const JobSpec& spec, const ClusterSpec& cluster);

// The same with every choice fixed to the job's layout (spec.parallel: tp, pp, dp, zero, the
// micro-batch, the stage split, the schedule and the recomputation, devices = tp·pp·dp): the plan
// is that layout's price — its
// predicted step time and memory on `cluster` (its rank → device map as the planner packs
// data-parallel groups, which is the coordinator's node-order placement on alike devices).
PlanRequest PlanRequestForLayout(const JobSpec& spec, const ClusterSpec& cluster);

}  // namespace shardline::placement
