#include "placement/plan_request.h"

#include <algorithm>
#include <cctype>
#include <span>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/string_view_compat.h"
#include "placement/yaml_reader.h"

namespace shardline::placement {
namespace {

constexpr std::string_view kGlobalBatch = "global_batch";
constexpr std::string_view kSeqLen = "seq_len";
constexpr std::string_view kMicroBatch = "micro_batch";
constexpr std::string_view kDtype = "dtype";
constexpr std::string_view kZero = "zero";
constexpr std::string_view kRecompute = "recompute";
constexpr std::string_view kSchedule = "schedule";
constexpr std::string_view kVirtualStages = "virtual_stages";
constexpr std::string_view kDevices = "devices";
constexpr std::string_view kCheckpoint = "checkpoint";
constexpr std::string_view kMin = "min";
constexpr std::string_view kMax = "max";

constexpr EnumName<Precision> kPrecisions[] = {{"fp32", Precision::kFp32},
                                               {"bf16", Precision::kBf16}};

// Generous bounds: past them a number is a typo, not a training run.
constexpr int64_t kMaxBatch = int64_t{1} << 24;
constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
constexpr int64_t kMaxDevices = 1 << 20;

// `micro_batch: 4` (fixed) or `micro_batch: {min: 1, max: 8}`.
absl::Status ParseMicroBatch(const YamlMap& map, PlanTrainSpec& spec) {
  if (!map.Has(kMicroBatch)) return absl::OkStatus();
  const IntRange range{.min = 1, .max = kMaxBatch};
  // A scalar is a fixed size; anything else must be the {min, max} mapping.
  if (map.OptionalString(kMicroBatch, "").ok()) {
    ASSIGN_OR_RETURN(const int64_t fixed, map.OptionalInt64(kMicroBatch, 0, range));
    spec.min_micro_batch = spec.max_micro_batch = fixed;
  } else {
    ASSIGN_OR_RETURN(const YamlMap bounds, map.OptionalMap(kMicroBatch, {kMin, kMax}));
    ASSIGN_OR_RETURN(spec.min_micro_batch, bounds.OptionalInt64(kMin, 1, range));
    ASSIGN_OR_RETURN(spec.max_micro_batch, bounds.OptionalInt64(kMax, 0, range));
    if (spec.max_micro_batch > 0 && spec.max_micro_batch < spec.min_micro_batch) {
      return bounds.ErrorAt(kMax, absl::StrCat("must be ≥ min (", spec.min_micro_batch, "), got ",
                                               spec.max_micro_batch));
    }
  }
  if (spec.min_micro_batch > spec.global_batch) {
    return map.ErrorAt(kMicroBatch,
                       absl::StrCat("the smallest micro-batch, ", spec.min_micro_batch,
                                    ", is more than global_batch ", spec.global_batch));
  }
  return absl::OkStatus();
}

// `zero: [0, 1]`: YamlMap has no integer list, so the elements are read as strings and each
// error is placed at its element.
absl::Status ParseZeroStages(const YamlMap& map, PlanTrainSpec& spec) {
  if (!map.Has(kZero)) return absl::OkStatus();
  // `zero: 1` alone is one allowed stage.
  if (map.OptionalString(kZero, "").ok()) {
    ASSIGN_OR_RETURN(const int64_t stage, map.OptionalInt64(kZero, 0, {.min = 0, .max = 3}));
    spec.zero_stages = {static_cast<int>(stage)};
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> texts, map.OptionalStringList(kZero));
  if (texts.empty()) {
    return map.ErrorAt(kZero, "lists no ZeRO stage; leave zero out to allow all of 0, 1, 2, 3");
  }
  spec.zero_stages.clear();
  for (size_t i = 0; i < texts.size(); ++i) {
    int stage = -1;
    const std::string& text = texts[i];
    const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    if (!digits || !absl::SimpleAtoi(text, &stage) || stage > 3) {
      return map.ErrorAtElement(
          kZero, i, absl::StrCat("expected a ZeRO stage 0, 1, 2 or 3, got '", text, "'"));
    }
    if (std::find(spec.zero_stages.begin(), spec.zero_stages.end(), stage) !=
        spec.zero_stages.end()) {
      return map.ErrorAtElement(kZero, i, absl::StrCat("stage ", stage, " is listed twice"));
    }
    spec.zero_stages.push_back(stage);
  }
  std::sort(spec.zero_stages.begin(), spec.zero_stages.end());
  return absl::OkStatus();
}

// `key: NAME` or `key: [NAME, ...]`, each NAME one of `names`: the values, in the order given,
// each once. An empty list is an error (it allows nothing).
template <typename E>
absl::StatusOr<std::vector<E>> ParseNameList(const YamlMap& map, std::string_view key,
                                             std::span<const EnumName<E>> names) {
  std::vector<std::string_view> allowed;
  for (const EnumName<E>& name : names) allowed.push_back(name.name);
  std::vector<E> out;
  if (map.OptionalString(key, "").ok()) {
    ASSIGN_OR_RETURN(const E value, map.RequiredEnum<E>(key, names));
    return std::vector<E>{value};
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> texts, map.OptionalStringList(key, allowed));
  if (texts.empty()) return map.ErrorAt(key, "lists nothing; leave the key out to allow all");
  for (size_t i = 0; i < texts.size(); ++i) {
    for (const EnumName<E>& name : names) {
      if (name.name != texts[i]) continue;
      if (std::find(out.begin(), out.end(), name.value) != out.end()) {
        return map.ErrorAtElement(key, i, absl::StrCat("'", texts[i], "' is listed twice"));
      }
      out.push_back(name.value);
    }
  }
  return out;
}

// `recompute: true | false | MODE | [MODE, ...]`: true allows every mode (the default), false
// only none.
absl::Status ParseRecompute(const YamlMap& map, PlanTrainSpec& spec) {
  if (!map.Has(kRecompute)) return absl::OkStatus();
  const EnumName<RecomputeMode> modes[] = {
      {RecomputeModeName(RecomputeMode::kNone), RecomputeMode::kNone},
      {RecomputeModeName(RecomputeMode::kSelective), RecomputeMode::kSelective},
      {RecomputeModeName(RecomputeMode::kFull), RecomputeMode::kFull}};
  if (absl::StatusOr<bool> all = map.OptionalBool(kRecompute, true); all.ok()) {
    if (!*all) spec.recompute_modes = {RecomputeMode::kNone};
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<RecomputeMode>> listed =
      ParseNameList<RecomputeMode>(map, kRecompute, modes);
  if (listed.ok()) {
    spec.recompute_modes = *std::move(listed);
    return absl::OkStatus();
  }
  if (map.OptionalString(kRecompute, "").ok()) {
    // A scalar that is neither: say every form the key takes.
    const std::string text = *map.OptionalString(kRecompute, "");
    return map.ErrorAt(kRecompute, absl::StrCat("expected true, false, a recompute mode (none, "
                                                "selective, full) or a list of them, got '",
                                                text, "'"));
  }
  return listed.status();
}

// `schedule: 1f1b | interleaved | [...]` and `virtual_stages: V | [V, ...]` (the interleaved
// schedule's chunks per stage, each ≥ 2): PlanTrainSpec::virtual_stages.
absl::Status ParseSchedules(const YamlMap& map, PlanTrainSpec& spec) {
  using Schedule = PipelineScheduleKind;
  const EnumName<Schedule> names[] = {
      {PipelineScheduleName(Schedule::k1F1B), Schedule::k1F1B},
      {PipelineScheduleName(Schedule::kInterleaved), Schedule::kInterleaved}};
  std::vector<Schedule> schedules = {Schedule::k1F1B, Schedule::kInterleaved};
  if (map.Has(kSchedule)) {
    ASSIGN_OR_RETURN(schedules, ParseNameList<Schedule>(map, kSchedule, names));
  }
  std::vector<int> chunks = {2, 4};
  if (map.Has(kVirtualStages)) {
    const IntRange range{.min = 2, .max = 1024};
    chunks.clear();
    if (map.OptionalString(kVirtualStages, "").ok()) {
      ASSIGN_OR_RETURN(const int64_t v, map.OptionalInt64(kVirtualStages, 2, range));
      chunks.push_back(static_cast<int>(v));
    } else {
      ASSIGN_OR_RETURN(const std::vector<std::string> texts,
                       map.OptionalStringList(kVirtualStages));
      for (size_t i = 0; i < texts.size(); ++i) {
        int v = 0;
        const std::string& text = texts[i];
        const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        });
        if (!digits || !absl::SimpleAtoi(text, &v) || v < 2 || v > 1024) {
          return map.ErrorAtElement(
              kVirtualStages, i,
              absl::StrCat("expected chunks per stage from 2 to 1024, got '", text, "'"));
        }
        chunks.push_back(v);
      }
      if (chunks.empty()) {
        return map.ErrorAt(kVirtualStages, "lists nothing; leave it out to try 2 and 4");
      }
    }
    if (std::find(schedules.begin(), schedules.end(), Schedule::kInterleaved) == schedules.end()) {
      return map.ErrorAt(kVirtualStages, "needs the interleaved schedule among `schedule`");
    }
  }
  spec.virtual_stages.clear();
  if (std::find(schedules.begin(), schedules.end(), Schedule::k1F1B) != schedules.end()) {
    spec.virtual_stages.push_back(1);
  }
  if (std::find(schedules.begin(), schedules.end(), Schedule::kInterleaved) != schedules.end()) {
    spec.virtual_stages.insert(spec.virtual_stages.end(), chunks.begin(), chunks.end());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlanTrainSpec> ParsePlanTrainSpec(const std::string& yaml_text,
                                                 const std::string& source_name) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   YamlMap::Parse(yaml_text, source_name,
                                  {kGlobalBatch, kSeqLen, kMicroBatch, kDtype, kZero, kRecompute,
                                   kSchedule, kVirtualStages, kDevices, kCheckpoint}));
  PlanTrainSpec spec;
  ASSIGN_OR_RETURN(spec.global_batch,
                   map.RequiredInt64(kGlobalBatch, {.min = 1, .max = kMaxBatch}));
  ASSIGN_OR_RETURN(spec.seq_len, map.OptionalInt64(kSeqLen, 0, {.min = 1, .max = kMaxSeqLen}));
  RETURN_IF_ERROR(ParseMicroBatch(map, spec));
  if (map.Has(kDtype)) {
    ASSIGN_OR_RETURN(spec.precision, map.RequiredEnum<Precision>(kDtype, kPrecisions));
  }
  RETURN_IF_ERROR(ParseZeroStages(map, spec));
  RETURN_IF_ERROR(ParseRecompute(map, spec));
  RETURN_IF_ERROR(ParseSchedules(map, spec));
  ASSIGN_OR_RETURN(const int64_t devices,
                   map.OptionalInt64(kDevices, 0, {.min = 1, .max = kMaxDevices}));
  spec.devices = static_cast<int>(devices);
  ASSIGN_OR_RETURN(const YamlMap checkpoint,
                   map.OptionalMap(kCheckpoint, {"memory_interval", "memory_replicas"}));
  ASSIGN_OR_RETURN(spec.memory_interval,
                   checkpoint.OptionalInt64("memory_interval", 0, {.min = 0, .max = kMaxBatch}));
  ASSIGN_OR_RETURN(spec.memory_replicas,
                   checkpoint.OptionalInt64("memory_replicas", 0, {.min = 0, .max = 1}));
  return spec;
}

absl::StatusOr<PlanTrainSpec> LoadPlanTrainSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParsePlanTrainSpec(text, path);
}

PlanTrainSpec DefaultPlanTrainSpec() {
  PlanTrainSpec spec;
  spec.global_batch = kDefaultPlanGlobalBatch;
  return spec;
}

Precision DefaultPrecision(const ClusterSpec& cluster) {
  const bool all_cpu = std::all_of(cluster.nodes.begin(), cluster.nodes.end(),
                                   [](const NodeSpec& node) { return node.device_kind == "cpu"; });
  return all_cpu && !cluster.nodes.empty() ? Precision::kFp32 : Precision::kBf16;
}

absl::StatusOr<PlanRequest> PlanRequestFor(const model::ModelConfig& model,
                                           const ClusterSpec& cluster, const PlanTrainSpec& train) {
  PlanRequest request;
  request.model = model;
  request.cluster = cluster;
  TrainSetup& setup = request.train;
  setup.global_batch = train.global_batch;
  setup.seq_len = train.seq_len > 0 ? train.seq_len : model.max_seq_len;
  if (setup.seq_len > model.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len ", setup.seq_len, " is more than the model's max_seq_len ", model.max_seq_len));
  }
  setup.min_micro_batch = train.min_micro_batch;
  setup.max_micro_batch = train.max_micro_batch;
  setup.precision = train.precision.value_or(DefaultPrecision(cluster));
  PlanConstraints& constraints = request.constraints;
  constraints.devices = train.devices;
  constraints.zero_stages = train.zero_stages;
  constraints.recompute_modes = train.recompute_modes;
  constraints.virtual_stages = train.virtual_stages;
  // A range of one size is a fixed micro-batch.
  if (train.max_micro_batch > 0 && train.max_micro_batch == train.min_micro_batch) {
    constraints.micro_batch = train.min_micro_batch;
  }
  return request;
}

PlanRequest PlanRequestForJob(const JobSpec& spec, const ClusterSpec& cluster) {
  PlanRequest request;
  request.model = spec.train.model;
  request.cluster = cluster;
  request.train = TrainSetupFor(
      spec.train, spec.devices == DeviceKind::kCuda ? Precision::kBf16 : Precision::kFp32);
  if (spec.parallel.micro_batch > 0) {
    request.constraints.micro_batch = spec.parallel.micro_batch;
    request.train.min_micro_batch = request.train.max_micro_batch = spec.parallel.micro_batch;
  }
  request.alternatives = 0;
  return request;
}

PlanRequest PlanRequestForLayout(const JobSpec& spec, const ClusterSpec& cluster) {
  PlanRequest request = PlanRequestForJob(spec, cluster);
  const ParallelSpec& p = spec.parallel;
  request.constraints.devices = p.world();
  request.constraints.tp = p.tp;
  request.constraints.pp = p.pp;
  request.constraints.dp = p.dp;
  request.constraints.zero = p.zero;
  const int64_t micro_batch = MicroBatchSize(p, spec.train.batch);
  request.constraints.micro_batch = micro_batch;
  request.train.min_micro_batch = request.train.max_micro_batch = micro_batch;
  request.constraints.recompute_modes = {p.recompute};
  request.constraints.virtual_stages = {
      p.schedule == PipelineScheduleKind::kInterleaved ? p.virtual_stages : 1};
  // A layout that cannot be cut leaves the split to the planner, whose rules then say why. (The
  // interleaved schedule's split is always even: nothing to fix.)
  if (auto stages = StagesOf(p, static_cast<int>(spec.train.model.layers));
      stages.ok() && p.schedule == PipelineScheduleKind::k1F1B) {
    for (const StageRange& stage : *stages) {
      request.constraints.stage_layers.push_back(stage.size());
    }
  }
  return request;
}

}  // namespace shardline::placement
