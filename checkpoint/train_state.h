// What a checkpoint holds besides the parameters, so that a run resumes exactly where it stopped,
// on any plan: the AdamW moments (global tensors named after their parameter, with boxes like the
// parameters'), the step, the settings a resumed run must keep (seed, batch, sequence length, the
// data) and the plan that wrote it. docs/checkpoint-format.md specifies the manifest's "train" and
// "plan" sections.
//
// The data position needs no cursor: the sampler is a pure function of (seed, step, batch,
// seq_len, the token stream), so a run resumed after step s reads step s + 1's batch from those.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/gpt2_checkpoint.h"

namespace shardline::checkpoint {

// The pieces of the training state that are global tensors. The first three are every run's; the
// others belong to a data-parallel strategy (worker/model/data_parallel.h):
//   kOuterAnchor, kOuterMomentum: DiLoCo's parameters at the last outer step and its outer
//     Nesterov momentum (the parameter's shape);
//   kSiteParam, kSiteExpAvg, kSiteExpAvgSq: each DiLoCo site's own parameters and inner AdamW
//     moments between outer steps, shape (sites, *the parameter's);
//   kCarriedError, kServerError: compressed gradients' error feedback, what each site (host) will
//     add back to its next reductions, and int8's error of the sums each site re-quantised,
//     shape (sites, *the parameter's).
enum class StateKind {
  kParam,
  kExpAvg,
  kExpAvgSq,
  kOuterAnchor,
  kOuterMomentum,
  kSiteParam,
  kSiteExpAvg,
  kSiteExpAvgSq,
  kCarriedError,
  kServerError
};
// Whether the tensors of `kind` have a leading dimension of sites.
bool IsPerSite(StateKind kind);
// Whether `kind` is one of a strategy's (not a parameter or its AdamW moments).
bool IsStrategyState(StateKind kind);

// The tensor of `kind` for parameter `param`: the parameter's own name, "optim.exp_avg.NAME"
// (AdamW's first moment, PyTorch's exp_avg) or "optim.exp_avg_sq.NAME" (the second); a strategy's:
// "outer.anchor.NAME", "outer.momentum.NAME", "site.NAME", "site.optim.exp_avg.NAME",
// "site.optim.exp_avg_sq.NAME", "dp.carried_error.NAME".
std::string StateTensorName(StateKind kind, std::string_view param);
// The inverse: the kind and the parameter's name of a manifest tensor.
struct StateTensor {
  StateKind kind = StateKind::kParam;
  std::string param;
};
StateTensor ParseStateTensorName(std::string_view name);

// Which token stream a run trained on. Compared on resume: the source settings by whoever reads
// the spec (the coordinator, `shardline train`), the tokens and their checksum by the ranks that
// load the data.
struct DataIdentity {
  std::string source = "synthetic";  // "synthetic" or "file"
  std::string path;                  // source file: as the run resolved it (informational)
  uint64_t synthetic_seed = 0;       // source synthetic
  int64_t synthetic_bytes = 0;
  int64_t tokens = 0;                // the token stream's length and XXH3-64 of its int32 tokens;
  uint64_t xxh3 = 0;                 // 0 tokens: not known (never compared)

  bool operator==(const DataIdentity&) const = default;
};

// The optimizer settings the run used. Informational: a resumed run may change them.
struct OptimizerSettings {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  double grad_clip = 0;
  int64_t warmup_steps = 0;

  bool operator==(const OptimizerSettings&) const = default;
};

struct TrainState {
  // Must not change on resume: they decide every later step's batch.
  uint64_t seed = 0;
  int64_t batch = 0;  // sequences per step, over all data-parallel ranks
  int64_t seq_len = 0;
  DataIdentity data;
  // May change on resume.
  int64_t steps = 0;  // the run's planned total
  OptimizerSettings optimizer;

  bool operator==(const TrainState&) const = default;
};

// The plan that wrote a checkpoint (informational: any plan loads it).
struct PlanInfo {
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;
  int64_t zero = 0;
  int64_t micro_batch = 0;            // sequences per micro-batch on one data-parallel rank
  std::vector<int64_t> stage_layers;  // layers per pipeline stage
  std::string device = "cpu";         // "cpu", "cuda"
  std::string precision = "fp32";     // "fp32", "bf16"
  // The pipeline schedule and activation recomputation (placement::PipelineScheduleName,
  // RecomputeModeName); a manifest from before them has neither and reads as 1f1b, 1, none.
  std::string schedule = "1f1b";   // "1f1b", "interleaved"
  int64_t virtual_stages = 1;      // chunks of layers per stage: 1 for 1f1b, >= 2 interleaved
  std::string recompute = "none";  // "none", "selective", "full"

  bool operator==(const PlanInfo&) const = default;
};

// "tp 2 · pp 2 · dp 1 · ZeRO 0 (cpu, fp32)", for listings; a schedule other than 1f1b and a
// recomputation other than none are added: "... · ZeRO 0 · interleaved ×2 · recompute full (...)".
std::string PlanSummary(const PlanInfo& plan);

// OK when the two model configs are equal; otherwise InvalidArgument, prefixed by `where`, naming
// the first field that differs by its spec key (model.layers, model.heads, model.kv_heads,
// model.d_model, model.d_ff, model.vocab, model.max_seq_len, model.tied_embeddings, the family's
// choices under model.arch, model.norm_eps, model.rope_theta) with the checkpoint's and the spec's
// value.
absl::Status CheckSameModel(const model::ModelConfig& stored, const model::ModelConfig& config,
                            const std::string& where);

// OK when a run of `config` and `train` may resume from a checkpoint whose model is `stored_config`
// and whose train section is `stored_train`; otherwise InvalidArgument, prefixed by `where`, naming
// the first setting that differs by its spec key (model.layers, model.d_model, ..., seed, batch,
// seq_len, data) with both values. Data is compared by source (and the synthetic corpus's seed
// and size); the token checksum by CheckSameTokens once the data is loaded.
absl::Status CheckResumable(const model::ModelConfig& stored_config, const TrainState& stored_train,
                            const model::ModelConfig& config, const TrainState& train,
                            const std::string& where);
// OK when `actual` (the loaded data) has the tokens `stored` recorded (or `stored` recorded none);
// otherwise InvalidArgument naming both counts and checksums.
absl::Status CheckSameTokens(const DataIdentity& stored, const DataIdentity& actual,
                             const std::string& where);

}  // namespace shardline::checkpoint
