#include "placement/plan_request.h"

#include <algorithm>
#include <cctype>
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
constexpr std::string_view kDevices = "devices";
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

}  // namespace

absl::StatusOr<PlanTrainSpec> ParsePlanTrainSpec(const std::string& yaml_text,
                                                 const std::string& source_name) {
  ASSIGN_OR_RETURN(const YamlMap map, YamlMap::Parse(yaml_text, source_name,
                                                     {kGlobalBatch, kSeqLen, kMicroBatch, kDtype,
                                                      kZero, kRecompute, kDevices}));
  PlanTrainSpec spec;
  ASSIGN_OR_RETURN(spec.global_batch,
                   map.RequiredInt64(kGlobalBatch, {.min = 1, .max = kMaxBatch}));
  ASSIGN_OR_RETURN(spec.seq_len, map.OptionalInt64(kSeqLen, 0, {.min = 1, .max = kMaxSeqLen}));
  RETURN_IF_ERROR(ParseMicroBatch(map, spec));
  if (map.Has(kDtype)) {
    ASSIGN_OR_RETURN(spec.precision, map.RequiredEnum<Precision>(kDtype, kPrecisions));
  }
  RETURN_IF_ERROR(ParseZeroStages(map, spec));
  ASSIGN_OR_RETURN(spec.allow_recompute, map.OptionalBool(kRecompute, spec.allow_recompute));
  ASSIGN_OR_RETURN(const int64_t devices,
                   map.OptionalInt64(kDevices, 0, {.min = 1, .max = kMaxDevices}));
  spec.devices = static_cast<int>(devices);
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

absl::StatusOr<PlanRequest> PlanRequestFor(const ModelSpec& model, const ClusterSpec& cluster,
                                           const PlanTrainSpec& train) {
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
  constraints.allow_recompute = train.allow_recompute;
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
  request.constraints.allow_recompute = false;
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
  // A layout that cannot be cut leaves the split to the planner, whose rules then say why.
  if (auto stages = StagesOf(p, static_cast<int>(spec.train.model.layers)); stages.ok()) {
    for (const StageRange& stage : *stages) {
      request.constraints.stage_layers.push_back(stage.size());
    }
  }
  return request;
}

}  // namespace shardline::placement
