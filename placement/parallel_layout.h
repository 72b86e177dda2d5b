// The rank layout of a sharded job: how (tp, pp, dp) cut the world into ranks and communication
// groups, which layers each pipeline stage runs, and whether a layout can work for a model, a batch
// and a number of devices. Every part of Shardline (coordinator, actors, checkpoints, tests) asks
// these functions rather than recomputing the layout.
//
//   rank = tp_index + tp · (dp_index + dp · pp_index)            (DESIGN.md)
//
// so a tensor-parallel group is tp consecutive ranks (the planner keeps it inside one node), a
// data-parallel group strides by tp, and a pipeline group strides by tp·dp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "placement/train_spec.h"

namespace shardline::placement {

// The pipeline schedule a training step runs (worker/model/pipeline_schedule.h builds its
// per-stage action lists).
//   k1F1B: PipeDream-Flush, Megatron-LM's non-interleaved schedule; each stage holds one
//     contiguous range of layers. Bubble (pp − 1)/m of the step for m micro-batches.
//   kInterleaved: Megatron-LM's interleaved 1F1B; each stage holds `virtual_stages` chunks of
//     layers (stage s holds virtual stages s, s + pp, s + 2·pp, ...). Bubble (pp − 1)/(v·m), at
//     the price of v times the pipeline transfers and more activations in flight.
enum class PipelineScheduleKind { k1F1B, kInterleaved };
// Activation recomputation (Megatron-LM's --recompute-granularity):
//   kNone: every block keeps what its backward reads;
//   kSelective: a block keeps its matrix multiplies' outputs (q/k/v, the MLP's pre-activation,
//     the residual) and recomputes the cheap, wide rest in its backward: both LayerNorms, the
//     attention output (from q/k/v and the kept log-sum-exp) and the GELU;
//   kFull: a block keeps only its input and reruns its whole forward (with its tensor-parallel
//     all-reduces) in its backward.
enum class RecomputeMode { kNone, kSelective, kFull };

// "1f1b", "interleaved"; "none", "selective", "full": the YAML spellings.
std::string_view PipelineScheduleName(PipelineScheduleKind kind);
std::string_view RecomputeModeName(RecomputeMode mode);
// The inverses; InvalidArgument listing the accepted spellings.
absl::StatusOr<PipelineScheduleKind> ParsePipelineSchedule(std::string_view name);
absl::StatusOr<RecomputeMode> ParseRecomputeMode(std::string_view name);

struct ParallelSpec {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  // ZeRO stage over the data-parallel group: 0 (plain data parallelism: gradients all-reduced),
  // 1 (optimizer state sharded), 2 (+ gradients reduce-scattered), 3 (+ parameters sharded and
  // gathered layer by layer).
  int zero = 0;
  // Sequences per micro-batch on one data-parallel rank; 0 means batch / dp (one micro-batch).
  int64_t micro_batch = 0;
  // Layers per pipeline stage, pp entries summing to the model's layers; empty: BalancedStages.
  std::vector<int> stage_layers;
  PipelineScheduleKind schedule = PipelineScheduleKind::k1F1B;
  // Chunks of layers per pipeline stage: 1 for 1F1B, >= 2 for the interleaved schedule.
  int virtual_stages = 1;
  RecomputeMode recompute = RecomputeMode::kNone;

  int world() const { return tp * pp * dp; }
};

// ", interleaved x2, recompute selective": the schedule and the recomputation of `spec` where they
// are not the defaults (1F1B, none), for plan lines; empty when both are.
std::string ScheduleAndRecomputeSuffix(const ParallelSpec& spec);

struct RankCoords {
  int tp = 0;
  int dp = 0;
  int pp = 0;
};

// One communicator group. kind is "world", "tp", "pp" or "dp"; id is unique in the job and names
// the group in errors and metrics ("world", "tp-d0-p1", "pp-t1-d0", "dp-t0-p1": the group's fixed
// coordinates); ranks are global ranks in group order (the group rank of ranks[i] is i).
struct CommGroup {
  std::string kind;
  std::string id;
  std::vector<int> ranks;
};

class RankGrid {
 public:
  // InvalidArgument unless tp, pp, dp >= 1 and the world fits in an int.
  static absl::StatusOr<RankGrid> Create(int tp, int pp, int dp);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int world() const { return tp_ * pp_ * dp_; }

  // Expects 0 <= rank < world() (and coordinates inside the grid).
  RankCoords Coords(int rank) const;
  int Rank(const RankCoords& coords) const;

  // The groups `rank` belongs to, one of each kind: world, tp, pp, dp (in that order). A group of
  // one rank is still listed.
  std::vector<CommGroup> GroupsOf(int rank) const;
  // Every group of the job: world, then every tp group, every pp group, every dp group; within a
  // kind, in the order of the groups' lowest ranks (the same list in every process, so that all
  // create their communicators in one order). With `replica_groups` (DiLoCo's jobs, where a
  // replica's norm and loss stay inside it) and tp·pp > 1, then every replica group: the tp × pp
  // ranks of one dp index, kind "replica".
  std::vector<CommGroup> AllGroups(bool replica_groups = false) const;

 private:
  RankGrid(int tp, int pp, int dp) : tp_(tp), pp_(pp), dp_(dp) {}
  CommGroup TpGroup(const RankCoords& c) const;
  CommGroup PpGroup(const RankCoords& c) const;
  CommGroup DpGroup(const RankCoords& c) const;
  CommGroup ReplicaGroup(const RankCoords& c) const;

  int tp_, pp_, dp_;
};

// The layers [first, last) of one pipeline stage.
struct StageRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
};

// `layers` split into `pp` stages as evenly as possible. The first stage also runs the embedding
// and the last the head and loss, so when the split is uneven the extra layers go to the middle
// stages first, from stage 1 on (then to the first stage, whose embedding costs less than the
// head's vocabulary GEMM): 7 layers on 4 stages are 2, 2, 2, 1. Expects 1 <= pp <= layers.
std::vector<StageRange> BalancedStages(int layers, int pp);

// The stages of `spec`: BalancedStages, or spec.stage_layers checked (pp entries, each >= 1,
// summing to `layers`).
absl::StatusOr<std::vector<StageRange>> StagesOf(const ParallelSpec& spec, int layers);

// Every stage's chunks of layers, in the order the stage runs them (chunk c of stage s is
// virtual stage c·pp + s). 1F1B: one chunk per stage, StagesOf's. Interleaved: the layers cut
// into pp·virtual_stages equal chunks; InvalidArgument (naming pp, virtual_stages and the layers)
// when they do not divide or when stage_layers is given (an interleaved split is always even).
absl::StatusOr<std::vector<std::vector<StageRange>>> ChunksOf(const ParallelSpec& spec, int layers);

// Whether `spec` can run `model` on `devices` actors with a global batch of `batch` sequences,
// before anything is spawned. InvalidArgument saying which rule fails and by how much:
//   tp, pp, dp < 1, zero not in 0..3 (zero >= 1 with dp = 1 is allowed: it shards over a group
//   of one, which changes nothing), tp > heads, heads % tp, tp > d_ff, d_ff % tp (tp must divide
//   both; the vocabulary may split unevenly), tp > vocab, layers < pp, a bad stage_layers,
//   tp·pp·dp ≠ devices ("tp·pp·dp = 2·2·2 = 8 but the job has 4 actors: 4 too many"),
//   the interleaved schedule with pp < 2, virtual_stages < 2, layers not divisible by
//   pp·virtual_stages, or micro-batches per step not divisible by pp (Megatron-LM's rule: the
//   schedule runs micro-batches in groups of pp); 1F1B with virtual_stages other than 1;
//   batch < dp, micro_batch > batch/dp ("micro_batch 8 is more than batch/dp = 16/4 = 4, ..."),
//   batch % (micro_batch·dp) ("batch 10 is not divisible by micro_batch·dp = 2·4 = 8:
//   remainder 2"), and with the default micro_batch batch % dp. The messages name no YAML key
//   path; ParseJobSpec places them at the job's `parallel` key.
absl::Status ValidateParallel(const model::ModelConfig& model, int64_t batch,
                              const ParallelSpec& spec, int devices);

// micro_batch with the default resolved (batch / dp), and the number of micro-batches per step on
// one data-parallel rank. Expect a validated spec.
int64_t MicroBatchSize(const ParallelSpec& spec, int64_t batch);
int64_t MicroBatchCount(const ParallelSpec& spec, int64_t batch);
// The global sample index (into the step's global batch, see worker/model/data/sampler.h) of the
// first sequence of micro-batch `micro` on data-parallel rank `dp_index`: data-parallel rank d
// trains rows [d·batch/dp, (d+1)·batch/dp) of every global batch, in micro-batches of
// MicroBatchSize consecutive rows.
int64_t FirstSample(const ParallelSpec& spec, int64_t batch, int dp_index, int64_t micro);

}  // namespace shardline::placement
