#include "placement/parallel_layout.h"

#include <algorithm>
#include <climits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/string_view_compat.h"

namespace shardline::placement {
namespace {

// "2·2·2 = 8"-style products are computed in 64 bits so that a typo like tp: 100000 reports the
// mismatch instead of overflowing.
int64_t WorldOf(const ParallelSpec& spec) {
  return int64_t{spec.tp} * int64_t{spec.pp} * int64_t{spec.dp};
}

// "4 too many" / "3 too few": how far `have` is from `want`.
std::string TooManyOrFew(int64_t have, int64_t want) {
  return have > want ? absl::StrCat(have - want, " too many")
                     : absl::StrCat(want - have, " too few");
}

// a/b as a person writes it: "4", or "2.5" when it is not whole.
std::string Quotient(int64_t a, int64_t b) {
  if (a % b == 0) return absl::StrCat(a / b);
  return absl::StrCat(static_cast<double>(a) / static_cast<double>(b));
}

CommGroup WorldGroup(int world) {
  CommGroup group{"world", "world", std::vector<int>(world)};
  std::iota(group.ranks.begin(), group.ranks.end(), 0);
  return group;
}

absl::Status CheckDegree(std::string_view name, int value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(AbslView(name), " must be at least 1, got ", value));
}

}  // namespace

absl::StatusOr<RankGrid> RankGrid::Create(int tp, int pp, int dp) {
  RETURN_IF_ERROR(CheckDegree("tp", tp));
  RETURN_IF_ERROR(CheckDegree("pp", pp));
  RETURN_IF_ERROR(CheckDegree("dp", dp));
  const int64_t world = int64_t{tp} * pp * dp;
  if (world > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("tp·pp·dp = ", tp, "·", pp, "·", dp, " = ",
                                                   world, " ranks do not fit in an int"));
  }
  return RankGrid(tp, pp, dp);
}

RankCoords RankGrid::Coords(int rank) const {
  // The inverse of Rank: tp varies fastest, then dp, then pp.
  RankCoords c;
  c.tp = rank % tp_;
  c.dp = (rank / tp_) % dp_;
  c.pp = rank / (tp_ * dp_);
  return c;
}

int RankGrid::Rank(const RankCoords& c) const { return c.tp + tp_ * (c.dp + dp_ * c.pp); }

CommGroup RankGrid::TpGroup(const RankCoords& c) const {
  CommGroup group{"tp", absl::StrCat("tp-d", c.dp, "-p", c.pp), {}};
  group.ranks.reserve(tp_);
  for (int t = 0; t < tp_; ++t) group.ranks.push_back(Rank({t, c.dp, c.pp}));
  return group;
}

CommGroup RankGrid::PpGroup(const RankCoords& c) const {
  CommGroup group{"pp", absl::StrCat("pp-t", c.tp, "-d", c.dp), {}};
  group.ranks.reserve(pp_);
  for (int p = 0; p < pp_; ++p) group.ranks.push_back(Rank({c.tp, c.dp, p}));
  return group;
}

CommGroup RankGrid::DpGroup(const RankCoords& c) const {
  CommGroup group{"dp", absl::StrCat("dp-t", c.tp, "-p", c.pp), {}};
  group.ranks.reserve(dp_);
  for (int d = 0; d < dp_; ++d) group.ranks.push_back(Rank({c.tp, d, c.pp}));
  return group;
}

CommGroup RankGrid::ReplicaGroup(const RankCoords& c) const {
  CommGroup group{"replica", absl::StrCat("replica-d", c.dp), {}};
  group.ranks.reserve(tp_ * pp_);
  for (int p = 0; p < pp_; ++p) {
    for (int t = 0; t < tp_; ++t) group.ranks.push_back(Rank({t, c.dp, p}));
  }
  std::sort(group.ranks.begin(), group.ranks.end());
  return group;
}

std::vector<CommGroup> RankGrid::GroupsOf(int rank) const {
  const RankCoords c = Coords(rank);
  return {WorldGroup(world()), TpGroup(c), PpGroup(c), DpGroup(c)};
}

std::vector<CommGroup> RankGrid::AllGroups(bool replica_groups) const {
  std::vector<CommGroup> groups;
  groups.reserve(1 + pp_ * dp_ + tp_ * dp_ + tp_ * pp_);
  groups.push_back(WorldGroup(world()));
  // Within each kind, groups come in the order of their lowest rank, so that every process that
  // walks this list creates the groups in the same order (NCCL and Gloo need that).
  for (int p = 0; p < pp_; ++p) {
    for (int d = 0; d < dp_; ++d) groups.push_back(TpGroup({0, d, p}));
  }
  for (int d = 0; d < dp_; ++d) {
    for (int t = 0; t < tp_; ++t) groups.push_back(PpGroup({t, d, 0}));
  }
  for (int p = 0; p < pp_; ++p) {
    for (int t = 0; t < tp_; ++t) groups.push_back(DpGroup({t, 0, p}));
  }
  if (replica_groups && tp_ * pp_ > 1) {
    for (int d = 0; d < dp_; ++d) groups.push_back(ReplicaGroup({0, d, 0}));
  }
  return groups;
}

std::vector<StageRange> BalancedStages(int layers, int pp) {
  std::vector<int> sizes(pp, layers / pp);
  int extra = layers % pp;
  // extra < pp, and there are pp - 2 middle stages, so at most one extra layer is left for the
  // first stage; with pp = 2 there is no middle and the one extra layer goes to the first stage.
  for (int s = 1; s + 1 < pp && extra > 0; ++s, --extra) ++sizes[s];
  if (extra > 0) ++sizes[0];
  std::vector<StageRange> stages;
  stages.reserve(pp);
  int first = 0;
  for (const int size : sizes) {
    stages.push_back({first, first + size});
    first += size;
  }
  return stages;
}

absl::StatusOr<std::vector<StageRange>> StagesOf(const ParallelSpec& spec, int layers) {
  RETURN_IF_ERROR(CheckDegree("pp", spec.pp));
  if (spec.stage_layers.empty()) {
    if (spec.pp > layers) {
      return absl::InvalidArgumentError(absl::StrCat("pp ", spec.pp, " is more than the model's ",
                                                     layers, " layers: ", spec.pp - layers,
                                                     " pipeline stages would have no layer"));
    }
    return BalancedStages(layers, spec.pp);
  }
  if (static_cast<int64_t>(spec.stage_layers.size()) != spec.pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages lists ", spec.stage_layers.size(), " stages but pp is ", spec.pp, ": ",
                     TooManyOrFew(static_cast<int64_t>(spec.stage_layers.size()), spec.pp)));
  }
  std::vector<StageRange> stages;
  stages.reserve(spec.stage_layers.size());
  int64_t first = 0;
  for (size_t i = 0; i < spec.stage_layers.size(); ++i) {
    const int size = spec.stage_layers[i];
    if (size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stages[", i, "] is ", size, ": every pipeline stage needs at least 1 layer"));
    }
    // Clamped so that a huge sum cannot overflow the ranges; the sum check below fails then anyway.
    stages.push_back({static_cast<int>(std::min<int64_t>(first, INT_MAX)),
                      static_cast<int>(std::min<int64_t>(first + size, INT_MAX))});
    first += size;
  }
  if (first != layers) {
    return absl::InvalidArgumentError(absl::StrCat("stages add up to ", first,
                                                   " layers but the model has ", layers, ": ",
                                                   TooManyOrFew(first, layers)));
  }
  return stages;
}

namespace {

// Megatron-LM's interleaved schedule runs micro-batches in groups of pp.
absl::Status CheckInterleavedMicroBatches(const ParallelSpec& spec, int64_t batch) {
  if (spec.schedule != PipelineScheduleKind::kInterleaved) return absl::OkStatus();
  const int64_t mb = spec.micro_batch > 0 ? spec.micro_batch : batch / spec.dp;
  const int64_t count = batch / spec.dp / mb;
  if (count % spec.pp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "schedule: interleaved runs micro-batches in groups of pp ", spec.pp, ", but a step has ",
      count, " micro-batches (batch ", batch, " / dp ", spec.dp, " / micro_batch ", mb,
      "): choose a micro_batch that gives a multiple of ", spec.pp));
}

}  // namespace

std::string_view PipelineScheduleName(PipelineScheduleKind kind) {
  return kind == PipelineScheduleKind::kInterleaved ? "interleaved" : "1f1b";
}

std::string_view RecomputeModeName(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::kSelective:
      return "selective";
    case RecomputeMode::kFull:
      return "full";
    case RecomputeMode::kNone:
      break;
  }
  return "none";
}

std::string ScheduleAndRecomputeSuffix(const ParallelSpec& spec) {
  std::string out;
  if (spec.schedule != PipelineScheduleKind::k1F1B) {
    absl::StrAppend(&out, ", ", std::string(PipelineScheduleName(spec.schedule)), " x",
                    spec.virtual_stages);
  }
  if (spec.recompute != RecomputeMode::kNone) {
    absl::StrAppend(&out, ", recompute ", std::string(RecomputeModeName(spec.recompute)));
  }
  return out;
}

absl::StatusOr<PipelineScheduleKind> ParsePipelineSchedule(std::string_view name) {
  for (const PipelineScheduleKind kind :
       {PipelineScheduleKind::k1F1B, PipelineScheduleKind::kInterleaved}) {
    if (name == PipelineScheduleName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown pipeline schedule \"", std::string(name),
                                                 "\": expected 1f1b or interleaved"));
}

absl::StatusOr<RecomputeMode> ParseRecomputeMode(std::string_view name) {
  for (const RecomputeMode mode :
       {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    if (name == RecomputeModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown recompute mode \"", std::string(name),
                                                 "\": expected none, selective or full"));
}

absl::StatusOr<std::vector<std::vector<StageRange>>> ChunksOf(const ParallelSpec& spec,
                                                              int layers) {
  if (spec.schedule != PipelineScheduleKind::kInterleaved) {
    if (spec.virtual_stages != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "virtual_stages ", spec.virtual_stages,
          " needs schedule: interleaved (the 1f1b schedule runs one chunk per stage)"));
    }
    ASSIGN_OR_RETURN(const std::vector<StageRange> stages, StagesOf(spec, layers));
    std::vector<std::vector<StageRange>> chunks;
    for (const StageRange& stage : stages) chunks.push_back({stage});
    return chunks;
  }
  RETURN_IF_ERROR(CheckDegree("pp", spec.pp));
  if (spec.pp < 2) {
    return absl::InvalidArgumentError(absl::StrCat("schedule: interleaved needs pp >= 2, got pp ",
                                                   spec.pp, " (one stage has no bubble)"));
  }
  if (spec.virtual_stages < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: interleaved needs virtual_stages >= 2, got ", spec.virtual_stages));
  }
  if (!spec.stage_layers.empty()) {
    return absl::InvalidArgumentError(
        "stages cannot be given with schedule: interleaved (its chunks are always equal)");
  }
  const int64_t chunks = int64_t{spec.pp} * spec.virtual_stages;
  if (layers % chunks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule: interleaved cuts the ", layers, " layers into pp·virtual_stages = ", spec.pp,
        "·", spec.virtual_stages, " = ", chunks, " equal chunks, but ", layers,
        " is not divisible by ", chunks, ": remainder ", layers % chunks));
  }
  const int size = static_cast<int>(layers / chunks);
  std::vector<std::vector<StageRange>> out(spec.pp);
  for (int c = 0; c < spec.virtual_stages; ++c) {
    for (int s = 0; s < spec.pp; ++s) {
      const int first = (c * spec.pp + s) * size;
      out[s].push_back({first, first + size});
    }
  }
  return out;
}

absl::Status ValidateParallel(const model::ModelConfig& model, int64_t batch,
                              const ParallelSpec& spec, int devices) {
  RETURN_IF_ERROR(CheckDegree("tp", spec.tp));
  RETURN_IF_ERROR(CheckDegree("pp", spec.pp));
  RETURN_IF_ERROR(CheckDegree("dp", spec.dp));
  if (spec.zero < 0 || spec.zero > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("zero must be 0, 1, 2 or 3 (the ZeRO stage), got ", spec.zero));
  }

  // Tensor parallelism splits attention by heads and the MLP by d_ff columns, so both must split
  // evenly; tp > heads is reported on its own because "not divisible" would hide the real problem.
  if (spec.tp > model.heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", spec.tp, " is more than heads ", model.heads, ": ",
                     spec.tp - model.heads, " tensor-parallel ranks would have no attention head"));
  }
  if (model.heads % spec.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("heads ", model.heads,
                                                   " is not divisible by tp ", spec.tp,
                                                   ": remainder ", model.heads % spec.tp));
  }
  // model::ModelConfig's d_ff of 0 means 4·d_model (ParseModel fills it in; a hand-built spec may
  // not).
  const int64_t d_ff = model.d_ff > 0 ? model.d_ff : 4 * model.d_model;
  if (spec.tp > d_ff) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", spec.tp, " is more than d_ff ", d_ff,
                                                   ": ", spec.tp - d_ff,
                                                   " tensor-parallel ranks would have no MLP "
                                                   "column"));
  }
  if (d_ff % spec.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("d_ff ", d_ff, " is not divisible by tp ",
                                                   spec.tp, ": remainder ", d_ff % spec.tp));
  }
  // The vocabulary may split unevenly (the last shard is shorter), but not into empty shards.
  if (spec.tp > model.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", spec.tp, " is more than vocab ", model.vocab, ": ",
                     spec.tp - model.vocab, " tensor-parallel ranks would have no vocabulary row"));
  }

  if (model.layers > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("layers ", model.layers, " is too many"));
  }
  RETURN_IF_ERROR(StagesOf(spec, static_cast<int>(model.layers)).status());
  RETURN_IF_ERROR(ChunksOf(spec, static_cast<int>(model.layers)).status());

  const int64_t world = WorldOf(spec);
  if (world != devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp·pp·dp = ", spec.tp, "·", spec.pp, "·", spec.dp, " = ", world,
                     " but the job has ", devices, " actors: ", TooManyOrFew(world, devices)));
  }

  if (batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be at least 1, got ", batch));
  }
  if (batch < spec.dp) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch, " is smaller than dp ", spec.dp,
                                                   ": ", spec.dp - batch,
                                                   " data-parallel ranks would have no sequence"));
  }
  if (spec.micro_batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch must be at least 1, got ", spec.micro_batch));
  }
  if (spec.micro_batch == 0) {
    // The default is one micro-batch of batch/dp sequences, which needs batch/dp to be whole.
    if (batch % spec.dp != 0) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", batch, " is not divisible by dp ",
                                                     spec.dp, ": remainder ", batch % spec.dp));
    }
    return CheckInterleavedMicroBatches(spec, batch);
  }
  if (spec.micro_batch * spec.dp > batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batch ", spec.micro_batch, " is more than batch/dp = ", batch, "/", spec.dp, " = ",
        Quotient(batch, spec.dp), ", the sequences one data-parallel rank trains per step"));
  }
  const int64_t per_step = spec.micro_batch * spec.dp;
  if (batch % per_step != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", batch, " is not divisible by micro_batch·dp = ", spec.micro_batch,
                     "·", spec.dp, " = ", per_step, ": remainder ", batch % per_step));
  }
  return CheckInterleavedMicroBatches(spec, batch);
}

int64_t MicroBatchSize(const ParallelSpec& spec, int64_t batch) {
  return spec.micro_batch > 0 ? spec.micro_batch : batch / spec.dp;
}

int64_t MicroBatchCount(const ParallelSpec& spec, int64_t batch) {
  return batch / spec.dp / MicroBatchSize(spec, batch);
}

int64_t FirstSample(const ParallelSpec& spec, int64_t batch, int dp_index, int64_t micro) {
  return dp_index * (batch / spec.dp) + micro * MicroBatchSize(spec, batch);
}

}  // namespace shardline::placement
