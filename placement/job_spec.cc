#include "placement/job_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/byte_size.h"
#include "placement/string_view_compat.h"
#include "placement/train_spec_sections.h"
#include "placement/yaml_reader.h"

namespace shardline::placement {
namespace {

// YAML keys, named once so the known-key lists and the getters cannot disagree.
constexpr std::string_view kName = "name";
constexpr std::string_view kKind = "kind";
constexpr std::string_view kActors = "actors";
constexpr std::string_view kDevices = "devices";
constexpr std::string_view kBackend = "backend";
constexpr std::string_view kBootstrapTimeout = "bootstrap_timeout_s";
constexpr std::string_view kRunTimeout = "run_timeout_s";
constexpr std::string_view kCommCheck = "comm_check";

constexpr std::string_view kMinBytes = "min_bytes";
constexpr std::string_view kMaxBytes = "max_bytes";
constexpr std::string_view kIterations = "iterations";
constexpr std::string_view kWarmupIterations = "warmup_iterations";
constexpr std::string_view kOps = "ops";
constexpr std::string_view kUnevenSizes = "uneven_sizes";

// Train jobs: the TrainSpec keys (internal::kTrainSectionKeys) plus these two.
constexpr std::string_view kMicroBatch = "micro_batch";
constexpr std::string_view kParallel = "parallel";
constexpr std::string_view kDataParallel = "data_parallel";
constexpr std::string_view kBucketMb = "bucket_mb";
constexpr std::string_view kCompression = "compression";
constexpr std::string_view kRank = "rank";
constexpr std::string_view kSync = "sync";
constexpr std::string_view kEvery = "every";
constexpr std::string_view kOuterLr = "outer_lr";
constexpr std::string_view kOuterMomentum = "outer_momentum";
constexpr std::string_view kFragments = "fragments";

constexpr std::string_view kTp = "tp";
constexpr std::string_view kPp = "pp";
constexpr std::string_view kDp = "dp";
constexpr std::string_view kZero = "zero";
constexpr std::string_view kStages = "stages";
constexpr std::string_view kSchedule = "schedule";
constexpr std::string_view kVirtualStages = "virtual_stages";
constexpr std::string_view kRecompute = "recompute";
// Past this a virtual_stages is a typo: every chunk needs a layer, and ParseModel bounds layers.
constexpr int64_t kMaxVirtualStages = 1024;

constexpr std::string_view kElastic = "elastic";
constexpr std::string_view kElasticMin = "min_actors";
constexpr std::string_view kElasticMax = "max_actors";
constexpr std::string_view kMaxRestarts = "max_restarts";
constexpr std::string_view kRestartWindow = "restart_window_s";
constexpr std::string_view kWaitTimeout = "wait_timeout_s";
constexpr std::string_view kProgressTimeout = "progress_timeout_s";

// Serve jobs: `checkpoint` (a train job's section key, here a path), `parallel`, `elastic` and
// these.
constexpr std::string_view kCheckpoint = "checkpoint";
constexpr std::string_view kTokenizer = "tokenizer";
constexpr std::string_view kHfHeads = "hf_heads";
constexpr std::string_view kModelName = "model_name";
constexpr std::string_view kListen = "listen";
constexpr std::string_view kApiKey = "api_key";
constexpr std::string_view kApiKeyFile = "api_key_file";
constexpr std::string_view kLimits = "limits";

constexpr std::string_view kMaxRunning = "max_running";
constexpr std::string_view kMaxTokensPerStep = "max_tokens_per_step";
constexpr std::string_view kMaxQueue = "max_queue";
constexpr std::string_view kBlockSize = "block_size";
constexpr std::string_view kKvCache = "kv_cache";

constexpr EnumName<JobKind> kJobKinds[] = {{"comm-check", JobKind::kCommCheck},
                                           {"train", JobKind::kTrain},
                                           {"serve", JobKind::kServe}};
constexpr EnumName<DeviceKind> kDeviceKinds[] = {{"cpu", DeviceKind::kCpu},
                                                 {"cuda", DeviceKind::kCuda}};
constexpr EnumName<Backend> kBackends[] = {
    {"auto", Backend::kAuto}, {"gloo", Backend::kGloo}, {"nccl", Backend::kNccl},
    {"shm", Backend::kShm}};

constexpr size_t kMaxNameLength = 63;
// A year: long enough for any run, small enough that seconds → milliseconds cannot overflow.
constexpr double kMaxTimeoutSeconds = 365.0 * 24 * 3600;

constexpr int64_t kUnevenElementCounts[] = {3, 1000, 65537, 4194305};

// The keys only a train job may have, in the order the known-key list prints them.
std::vector<std::string_view> TrainOnlyKeys() {
  std::vector<std::string_view> keys(internal::kTrainSectionKeys.begin(),
                                     internal::kTrainSectionKeys.end());
  keys.push_back(kMicroBatch);
  keys.push_back(kParallel);
  keys.push_back(kDataParallel);
  keys.push_back(kElastic);
  return keys;
}

// The keys only a serve job may have.
std::vector<std::string_view> ServeOnlyKeys() {
  return {kTokenizer, kHfHeads, kModelName, kListen, kApiKey, kApiKeyFile, kLimits};
}

std::vector<std::string_view> TopLevelKeys() {
  std::vector<std::string_view> keys = {
      kName, kKind, kActors, kDevices, kBackend, kBootstrapTimeout, kRunTimeout, kCommCheck};
  const std::vector<std::string_view> train = TrainOnlyKeys();
  keys.insert(keys.end(), train.begin(), train.end());
  const std::vector<std::string_view> serve = ServeOnlyKeys();
  keys.insert(keys.end(), serve.begin(), serve.end());
  return keys;
}

// `path` joined to `base` when it is relative and both are given; otherwise as written.
std::string ResolveAgainst(const std::string& path, const std::string& base) {
  if (path.empty() || base.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(base) / path).string();
}

// The data against the spec's folder; what the run writes or resumes from (checkpoint.dir,
// checkpoint.resume, init_from) against the submitter's working directory, as `shardline train`.
void ResolveTrainPaths(const PathBase& base, TrainSpec& train) {
  train.data.path = ResolveAgainst(train.data.path, base.spec_dir);
  for (std::string& site : train.data.per_site) site = ResolveAgainst(site, base.spec_dir);
  train.checkpoint.dir = ResolveAgainst(train.checkpoint.dir, base.work_dir);
  train.checkpoint.resume_path = ResolveAgainst(train.checkpoint.resume_path, base.work_dir);
  train.init_from = ResolveAgainst(train.init_from, base.work_dir);
}

template <typename E, size_t N>
std::string_view NameOf(const EnumName<E> (&names)[N], E value) {
  for (const auto& name : names) {
    if (name.value == value) return name.name;
  }
  return "unknown";
}

absl::Status ValidateName(const YamlMap& map, const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return map.ErrorAt(kName, absl::StrCat("must be 1 to ", kMaxNameLength,
                                           " characters long, got ", name.size()));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) {
      // The name ends up in metric labels and file names, where upper case, spaces and dots
      // cause collisions or escaping trouble.
      return map.ErrorAt(kName,
                         absl::StrCat("may contain only a-z, 0-9, '-' and '_'; got '", name,
                                      "' (character ", i + 1, " is '", std::string(1, c), "')"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::chrono::milliseconds> ReadTimeout(const YamlMap& map, std::string_view key,
                                                      std::chrono::milliseconds default_value) {
  const double default_seconds = std::chrono::duration<double>(default_value).count();
  ASSIGN_OR_RETURN(
      const double seconds,
      map.OptionalDouble(key, default_seconds,
                         {.min = 0, .max = kMaxTimeoutSeconds, .min_exclusive = true}));
  const auto millis = std::chrono::milliseconds(std::llround(seconds * 1000));
  if (millis.count() == 0) {
    return map.ErrorAt(key, absl::StrCat("must be at least 0.001 (1 ms), got ", seconds));
  }
  return millis;
}

absl::Status CheckWholeElements(const YamlMap& map, std::string_view key, int64_t bytes) {
  if (bytes % kCommCheckElementBytes == 0) return absl::OkStatus();
  return map.ErrorAt(key, absl::StrCat("must be a multiple of ", kCommCheckElementBytes,
                                       " bytes (whole f32 elements), got ", bytes));
}

absl::StatusOr<CommCheckSpec> ParseCommCheck(const YamlMap& parent) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   parent.OptionalMap(kCommCheck, {kMinBytes, kMaxBytes, kIterations,
                                                   kWarmupIterations, kOps, kUnevenSizes}));
  CommCheckSpec spec;
  const IntRange size_range{.min = kCommCheckElementBytes, .max = kCommCheckMaxBytes};
  ASSIGN_OR_RETURN(spec.min_bytes, map.OptionalBytes(kMinBytes, spec.min_bytes, size_range));
  RETURN_IF_ERROR(CheckWholeElements(map, kMinBytes, spec.min_bytes));
  ASSIGN_OR_RETURN(spec.max_bytes, map.OptionalBytes(kMaxBytes, spec.max_bytes, size_range));
  RETURN_IF_ERROR(CheckWholeElements(map, kMaxBytes, spec.max_bytes));
  if (spec.max_bytes < spec.min_bytes) {
    // Blame whichever key the user wrote; when both are written, max_bytes (read last).
    if (map.Has(kMaxBytes)) {
      return map.ErrorAt(kMaxBytes,
                         absl::StrCat("must be ≥ min_bytes (", FormatByteSize(spec.min_bytes),
                                      "), got ", FormatByteSize(spec.max_bytes)));
    }
    return map.ErrorAt(kMinBytes,
                       absl::StrCat("must be ≤ max_bytes (", FormatByteSize(spec.max_bytes),
                                    ", the default), got ", FormatByteSize(spec.min_bytes)));
  }
  ASSIGN_OR_RETURN(const int64_t iterations,
                   map.OptionalInt64(kIterations, spec.iterations, {.min = 1, .max = 1000}));
  spec.iterations = static_cast<int>(iterations);
  ASSIGN_OR_RETURN(
      const int64_t warmups,
      map.OptionalInt64(kWarmupIterations, spec.warmup_iterations, {.min = 0, .max = 1000}));
  spec.warmup_iterations = static_cast<int>(warmups);
  ASSIGN_OR_RETURN(spec.ops, map.OptionalStringList(kOps, kCommCheckOps));
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (spec.ops[j] == spec.ops[i]) {
        return map.ErrorAtElement(
            kOps, i, absl::StrCat("'", spec.ops[i], "' is listed twice (also at index ", j, ")"));
      }
    }
  }
  ASSIGN_OR_RETURN(spec.uneven_sizes, map.OptionalBool(kUnevenSizes, spec.uneven_sizes));
  return spec;
}

// `parallel.stages`: a list of layer counts, one per pipeline stage. YamlMap has no integer list,
// so the elements are read as strings and converted here, each error placed at its element.
absl::StatusOr<std::vector<int>> ParseStages(const YamlMap& parallel, int pp, int64_t layers) {
  ASSIGN_OR_RETURN(const std::vector<std::string> texts, parallel.OptionalStringList(kStages));
  if (parallel.Has(kStages) && texts.empty()) {
    return parallel.ErrorAt(
        kStages, absl::StrCat("lists no stage but pp is ", pp, "; leave stages out to split the ",
                              layers, " layers evenly"));
  }
  std::vector<int> stages;
  stages.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string& text = texts[i];
    int value = 0;
    // As YamlMap's integers: SimpleAtoi alone would also take "+2".
    const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) ||
                                         (text[0] == '-' && text.size() > 1));
    if (!plain || !absl::SimpleAtoi(text, &value)) {
      return parallel.ErrorAtElement(
          kStages, i, absl::StrCat("expected an integer (the stage's layers), got '", text, "'"));
    }
    if (value < 1) {
      return parallel.ErrorAtElement(
          kStages, i,
          absl::StrCat("must be at least 1 (every pipeline stage needs a layer), got ", value));
    }
    stages.push_back(value);
  }
  return stages;
}

// `parallel: {tp, pp, dp, zero, stages, schedule, virtual_stages, recompute}`, each optional (a
// single-rank layout, 1F1B, no recomputation by default; virtual_stages defaults to 2 with
// schedule: interleaved). The checks that need the model, the batch or the actors are
// ValidateParallel's, run by the caller (the interleaved schedule's among them: its messages name
// schedule, virtual_stages, pp and the layers or micro-batches); only the stage list is checked
// here, so that its errors point into the list.
absl::StatusOr<ParallelSpec> ParseParallel(const YamlMap& map, int64_t layers) {
  ASSIGN_OR_RETURN(const YamlMap parallel,
                   map.OptionalMap(kParallel, {kTp, kPp, kDp, kZero, kStages, kSchedule,
                                               kVirtualStages, kRecompute}));
  ParallelSpec spec;
  const IntRange degree{.min = 1, .max = kMaxActors};
  ASSIGN_OR_RETURN(const int64_t tp, parallel.OptionalInt64(kTp, spec.tp, degree));
  ASSIGN_OR_RETURN(const int64_t pp, parallel.OptionalInt64(kPp, spec.pp, degree));
  ASSIGN_OR_RETURN(const int64_t dp, parallel.OptionalInt64(kDp, spec.dp, degree));
  ASSIGN_OR_RETURN(const int64_t zero,
                   parallel.OptionalInt64(kZero, spec.zero, {.min = 0, .max = 3}));
  spec.tp = static_cast<int>(tp);
  spec.pp = static_cast<int>(pp);
  spec.dp = static_cast<int>(dp);
  spec.zero = static_cast<int>(zero);
  // The spellings are parallel_layout's (PipelineScheduleName, RecomputeModeName).
  using Schedule = PipelineScheduleKind;
  const EnumName<Schedule> schedules[] = {
      {PipelineScheduleName(Schedule::k1F1B), Schedule::k1F1B},
      {PipelineScheduleName(Schedule::kInterleaved), Schedule::kInterleaved}};
  const EnumName<RecomputeMode> recomputes[] = {
      {RecomputeModeName(RecomputeMode::kNone), RecomputeMode::kNone},
      {RecomputeModeName(RecomputeMode::kSelective), RecomputeMode::kSelective},
      {RecomputeModeName(RecomputeMode::kFull), RecomputeMode::kFull}};
  ASSIGN_OR_RETURN(spec.schedule, parallel.OptionalEnum(kSchedule, schedules, spec.schedule));
  // Two chunks per stage unless told: the smallest interleaving, and the one that most layer
  // counts divide.
  const int64_t default_chunks = spec.schedule == Schedule::kInterleaved ? 2 : 1;
  ASSIGN_OR_RETURN(
      const int64_t chunks,
      parallel.OptionalInt64(kVirtualStages, default_chunks, {.min = 1, .max = kMaxVirtualStages}));
  spec.virtual_stages = static_cast<int>(chunks);
  ASSIGN_OR_RETURN(spec.recompute, parallel.OptionalEnum(kRecompute, recomputes, spec.recompute));
  ASSIGN_OR_RETURN(spec.stage_layers, ParseStages(parallel, spec.pp, layers));
  if (!spec.stage_layers.empty()) {
    absl::Status stages = StagesOf(spec, static_cast<int>(layers)).status();
    if (!stages.ok()) return parallel.ErrorAt(kStages, ToString(stages.message()));
  }
  return spec;
}

// The fixed layouts an elastic job may run: `layout` with each dp from the most devices down,
// the first valid one (ValidateParallel) whose world is at least `min_actors`.
absl::StatusOr<ParallelSpec> LargestElasticLayout(const model::ModelConfig& model, int64_t batch,
                                                  const ParallelSpec& layout, int min_actors,
                                                  int max_world, std::string* why_not) {
  const int group = layout.tp * layout.pp;
  for (int dp = max_world / group; dp >= 1 && dp * group >= min_actors; --dp) {
    ParallelSpec candidate = layout;
    candidate.dp = dp;
    const absl::Status valid = ValidateParallel(model, batch, candidate, dp * group);
    if (valid.ok()) return candidate;
    if (why_not != nullptr && why_not->empty()) {
      *why_not = absl::StrCat("dp ", dp, ": ", ToString(valid.message()));
    }
  }
  return absl::FailedPreconditionError("no dp fits");
}

// `elastic: {min_actors, max_actors, max_restarts, restart_window_s, wait_timeout_s,
// progress_timeout_s}` of a train job whose layout (fixed or auto) has been read.
absl::Status ParseElastic(const YamlMap& parent, JobSpec& spec) {
  if (!parent.Has(kElastic)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const YamlMap map,
                   parent.OptionalMap(kElastic, {kElasticMin, kElasticMax, kMaxRestarts,
                                                 kRestartWindow, kWaitTimeout, kProgressTimeout}));
  ElasticSpec& elastic = spec.elastic;
  elastic.enabled = true;
  const ParallelSpec& layout = spec.parallel;
  const int group = spec.parallel_auto ? 1 : layout.tp * layout.pp;
  const int own_world = spec.parallel_auto ? spec.actors : layout.world();
  const IntRange actor_range{.min = 1, .max = kMaxActors};
  ASSIGN_OR_RETURN(const int64_t min_actors, map.OptionalInt64(kElasticMin, group, actor_range));
  ASSIGN_OR_RETURN(const int64_t max_actors,
                   map.OptionalInt64(kElasticMax, std::max(own_world, 0), actor_range));
  elastic.min_actors = static_cast<int>(min_actors);
  elastic.max_actors = static_cast<int>(max_actors);
  ASSIGN_OR_RETURN(const int64_t restarts,
                   map.OptionalInt64(kMaxRestarts, elastic.max_restarts, {.min = 0, .max = 1000000}));
  elastic.max_restarts = static_cast<int>(restarts);
  ASSIGN_OR_RETURN(elastic.restart_window, ReadTimeout(map, kRestartWindow, elastic.restart_window));
  ASSIGN_OR_RETURN(elastic.wait_timeout, ReadTimeout(map, kWaitTimeout, elastic.wait_timeout));
  ASSIGN_OR_RETURN(elastic.progress_timeout,
                   ReadTimeout(map, kProgressTimeout, elastic.progress_timeout));
  if (elastic.max_actors > 0 && elastic.min_actors > elastic.max_actors) {
    return map.ErrorAt(map.Has(kElasticMax) ? kElasticMax : kElasticMin,
                       absl::StrCat("min_actors ", elastic.min_actors, " is more than max_actors ",
                                    elastic.max_actors));
  }
  if (spec.parallel_auto) {
    // The plan is capped by max_actors; `actors`, when given, says the same.
    if (spec.actors > 0 && map.Has(kElasticMax) && spec.actors != elastic.max_actors) {
      return map.ErrorAt(kElasticMax, absl::StrCat("max_actors ", elastic.max_actors,
                                                  " differs from the job's actors ", spec.actors,
                                                  "; give one of them"));
    }
    return absl::OkStatus();
  }
  if (elastic.min_actors < group) {
    return map.ErrorAt(kElasticMin,
                       absl::StrCat("min_actors ", elastic.min_actors,
                                    " is below tp·pp = ", layout.tp, "·", layout.pp, " = ", group,
                                    ", the fewest actors one data-parallel replica needs"));
  }
  std::string why_not;
  if (!LargestElasticLayout(spec.train.model, spec.train.batch, layout, elastic.min_actors,
                            elastic.max_actors, &why_not)
           .ok()) {
    return map.ErrorAt(
        kElastic,
        absl::StrCat("no dp gives a world in min_actors..max_actors = ", elastic.min_actors, "..",
                     elastic.max_actors, " with tp·pp = ", group, " that divides the batch of ",
                     spec.train.batch, layout.micro_batch > 0
                                           ? absl::StrCat(" in micro-batches of ", layout.micro_batch)
                                           : std::string(),
                     why_not.empty() ? std::string() : absl::StrCat(" (", why_not, ")")));
  }
  return absl::OkStatus();
}

// The train-only part of a train job: the TrainSpec sections, micro_batch and the layout, then the
// layout checked against the model, the batch and the actors.
// data.per_site names one file per data-parallel site: as many as the layout's dp.
absl::Status CheckSites(const DataSpec& data, const ParallelSpec& layout) {
  const int files = static_cast<int>(data.per_site.size());
  if (files == 0 || files == layout.dp) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("data.per_site names ", files, " files, one per site, but dp is ", layout.dp));
}

// `data_parallel: {...}` (data_parallel_spec.h), each key optional. The checks against the layout
// and the model are CheckDataParallel's, run by the caller.
absl::StatusOr<DataParallelSpec> ParseDataParallel(const YamlMap& parent) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   parent.OptionalMap(kDataParallel, {kBucketMb, kCompression, kRank, kSync, kEvery,
                                                      kOuterLr, kOuterMomentum, kFragments}));
  DataParallelSpec spec;
  ASSIGN_OR_RETURN(const double bucket_mb,
                   map.OptionalDouble(kBucketMb, static_cast<double>(spec.bucket_bytes) / (1 << 20),
                                      {.min = 0, .max = 1 << 20, .min_exclusive = true}));
  spec.bucket_bytes = std::max<int64_t>(4, std::llround(bucket_mb * (1 << 20)));
  using Compression = GradientCompression;
  const EnumName<Compression> compressions[] = {
      {GradientCompressionName(Compression::kNone), Compression::kNone},
      {GradientCompressionName(Compression::kPowerSgd), Compression::kPowerSgd},
      {GradientCompressionName(Compression::kInt8), Compression::kInt8}};
  ASSIGN_OR_RETURN(spec.compression,
                   map.OptionalEnum(kCompression, compressions, spec.compression));
  ASSIGN_OR_RETURN(const int64_t rank,
                   map.OptionalInt64(kRank, spec.rank, {.min = 1, .max = 1 << 20}));
  spec.rank = static_cast<int>(rank);
  if (map.Has(kRank) && spec.compression != Compression::kPowerSgd) {
    return map.ErrorAt(kRank, "rank is PowerSGD's: it needs compression: powersgd");
  }
  const EnumName<DataParallelSync> syncs[] = {
      {DataParallelSyncName(DataParallelSync::kEveryStep), DataParallelSync::kEveryStep},
      {DataParallelSyncName(DataParallelSync::kDiloco), DataParallelSync::kDiloco}};
  ASSIGN_OR_RETURN(spec.sync, map.OptionalEnum(kSync, syncs, spec.sync));
  // `every` < 1 is refused with its value by CheckDataParallel, like the other DiLoCo keys.
  ASSIGN_OR_RETURN(spec.every, map.OptionalInt64(kEvery, spec.every, {.max = int64_t{1} << 40}));
  ASSIGN_OR_RETURN(
      spec.outer_lr,
      map.OptionalDouble(kOuterLr, spec.outer_lr, {.min = 0, .max = 100, .min_exclusive = true}));
  ASSIGN_OR_RETURN(spec.outer_momentum, map.OptionalDouble(kOuterMomentum, spec.outer_momentum,
                                                           {.min = 0, .max = 0.999999}));
  ASSIGN_OR_RETURN(const int64_t fragments,
                   map.OptionalInt64(kFragments, spec.fragments, {.max = 1 << 20}));
  spec.fragments = static_cast<int>(fragments);
  if (!spec.diloco()) {
    for (const std::string_view key : {kEvery, kOuterLr, kOuterMomentum, kFragments}) {
      if (map.Has(key)) {
        return map.ErrorAt(key, absl::StrCat(AbslView(key), " is DiLoCo's: it needs sync: diloco"));
      }
    }
  }
  return spec;
}

// `parallel: auto`: the one scalar `parallel` may be (any other falls through to
// ParseParallel's "expected a mapping").
bool IsAutoParallel(const YamlMap& map) {
  if (!map.Has(kParallel)) return false;
  absl::StatusOr<std::string> scalar = map.OptionalString(kParallel, "");
  return scalar.ok() && *scalar == "auto";
}

absl::Status ParseTrainJob(const YamlMap& map, const PathBase& base, JobSpec& spec) {
  spec.train.name = spec.name;
  RETURN_IF_ERROR(internal::ParseTrainSections(map, spec.train));
  spec.parallel_auto = IsAutoParallel(map);
  ASSIGN_OR_RETURN(spec.data_parallel, ParseDataParallel(map));
  if (!spec.parallel_auto) {
    ASSIGN_OR_RETURN(spec.parallel, ParseParallel(map, spec.train.model.layers));
  }
  // Kept 0 when absent: the default is batch / dp of whatever dp runs the job.
  ASSIGN_OR_RETURN(spec.parallel.micro_batch,
                   map.OptionalInt64(kMicroBatch, 0, {.min = 1, .max = 1 << 20}));
  if (spec.parallel_auto) {
    // The layout waits for the planner (ApplyPlannedLayout); what can be checked without it is
    // checked now.
    if (spec.parallel.micro_batch > spec.train.batch) {
      return map.ErrorAt(kMicroBatch,
                         absl::StrCat("micro_batch ", spec.parallel.micro_batch,
                                      " is more than the batch of ", spec.train.batch,
                                      " sequences"));
    }
    if (spec.parallel.micro_batch > 0 && spec.train.batch % spec.parallel.micro_batch != 0) {
      return map.ErrorAt(kMicroBatch, absl::StrCat("batch ", spec.train.batch,
                                                   " is not divisible by micro_batch ",
                                                   spec.parallel.micro_batch, ": remainder ",
                                                   spec.train.batch % spec.parallel.micro_batch));
    }
    ResolveTrainPaths(base, spec.train);
    return ParseElastic(map, spec);
  }

  const int64_t world = int64_t{spec.parallel.tp} * spec.parallel.pp * spec.parallel.dp;
  if (world > kMaxActors) {
    return map.ErrorAt(
        kParallel,
        absl::StrCat("tp·pp·dp = ", spec.parallel.tp, "·", spec.parallel.pp, "·", spec.parallel.dp,
                     " = ", world, " is more than the ", kMaxActors, " actors a job may have"));
  }
  // actors is optional for a train job: the layout says how many it needs.
  if (spec.actors == 0) spec.actors = static_cast<int>(world);
  const absl::Status layout =
      ValidateParallel(spec.train.model, spec.train.batch, spec.parallel, spec.actors);
  if (!layout.ok()) return map.ErrorAt(kParallel, ToString(layout.message()));
  if (!spec.train.data.per_site.empty() &&
      static_cast<int>(spec.train.data.per_site.size()) != spec.parallel.dp) {
    return map.ErrorAt("data", ToString(CheckSites(spec.train.data, spec.parallel).message()));
  }
  if (spec.data_parallel.compressed() && spec.devices == DeviceKind::kCuda) {
    return map.ErrorAt(
        kDataParallel,
        absl::StrCat("data_parallel.compression: ",
                     AbslView(GradientCompressionName(spec.data_parallel.compression)),
                     " compresses host memory (CPU devices); on cuda devices the "
                     "gradients are NCCL's, which it cannot read yet"));
  }
  const absl::Status data_parallel =
      CheckDataParallel(spec.data_parallel, spec.parallel, spec.train.model);
  if (!data_parallel.ok()) {
    return map.ErrorAt(map.Has(kDataParallel) ? kDataParallel : kParallel,
                       ToString(data_parallel.message()));
  }

  ResolveTrainPaths(base, spec.train);
  return ParseElastic(map, spec);
}

// `limits: {max_running, max_tokens_per_step, max_queue, block_size, kv_cache}` of a serve job.
// The checks that need the model (a cache too small for one context) are the engine's.
absl::StatusOr<ServeLimits> ParseServeLimits(const YamlMap& parent) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   parent.OptionalMap(kLimits, {kMaxRunning, kMaxTokensPerStep, kMaxQueue,
                                                kBlockSize, kKvCache}));
  ServeLimits limits;
  ASSIGN_OR_RETURN(const int64_t running,
                   map.OptionalInt64(kMaxRunning, limits.max_running, {.min = 1, .max = 4096}));
  ASSIGN_OR_RETURN(const int64_t tokens,
                   map.OptionalInt64(kMaxTokensPerStep, limits.max_tokens_per_step,
                                     {.min = 1, .max = 1 << 20}));
  ASSIGN_OR_RETURN(const int64_t queue,
                   map.OptionalInt64(kMaxQueue, limits.max_queue, {.min = 0, .max = 1 << 20}));
  ASSIGN_OR_RETURN(const int64_t block,
                   map.OptionalInt64(kBlockSize, limits.block_size, {.min = 1, .max = 1 << 16}));
  ASSIGN_OR_RETURN(limits.kv_cache_bytes,
                   map.OptionalBytes(kKvCache, 0, {.min = 0, .max = int64_t{1} << 50}));
  limits.max_running = static_cast<int>(running);
  limits.max_tokens_per_step = static_cast<int>(tokens);
  limits.max_queue = static_cast<int>(queue);
  limits.block_size = static_cast<int>(block);
  if (limits.max_tokens_per_step < limits.max_running) {
    // Every running sequence decodes one token a step.
    return map.ErrorAt(map.Has(kMaxTokensPerStep) ? kMaxTokensPerStep : kMaxRunning,
                       absl::StrCat("max_tokens_per_step ", limits.max_tokens_per_step,
                                    " is less than max_running ", limits.max_running,
                                    ": each running sequence needs a token of every step"));
  }
  return limits;
}

// `elastic:` of a serve job: the service restarts on the same tp × pp, so only the restart
// policy may be given.
absl::Status ParseServeElastic(const YamlMap& parent, JobSpec& spec) {
  if (!parent.Has(kElastic)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const YamlMap map, parent.OptionalMap(kElastic, {kMaxRestarts, kRestartWindow,
                                                                    kWaitTimeout}));
  ElasticSpec& elastic = spec.elastic;
  elastic.enabled = true;
  // The restart runs the same layout (auto: the one planned then, on the devices there are).
  elastic.min_actors = spec.parallel_auto ? 1 : spec.parallel.world();
  elastic.max_actors = spec.parallel_auto ? spec.actors : spec.parallel.world();
  ASSIGN_OR_RETURN(const int64_t restarts,
                   map.OptionalInt64(kMaxRestarts, elastic.max_restarts, {.min = 0, .max = 1000000}));
  elastic.max_restarts = static_cast<int>(restarts);
  ASSIGN_OR_RETURN(elastic.restart_window, ReadTimeout(map, kRestartWindow, elastic.restart_window));
  ASSIGN_OR_RETURN(elastic.wait_timeout, ReadTimeout(map, kWaitTimeout, elastic.wait_timeout));
  return absl::OkStatus();
}

// A serve job's paths, as a train job's: what is read by name from the submitter's folder, what
// ships with the spec from the spec's.
void ResolveServePaths(const PathBase& base, ServeSpec& serve) {
  serve.checkpoint = ResolveAgainst(serve.checkpoint, base.work_dir);
  if (!serve.tokenizer.empty() && serve.tokenizer != "bytes") {
    serve.tokenizer = ResolveAgainst(serve.tokenizer, base.spec_dir);
  }
  serve.api_key_file = ResolveAgainst(serve.api_key_file, base.spec_dir);
}

// The serve-only part of a serve job: the checkpoint and tokenizer, `parallel: {tp, pp}`, the
// HTTP side and the limits. Whether tp and pp cut the model is known only once it is read (the
// ranks check it before they load anything).
absl::Status ParseServeJob(const YamlMap& map, const PathBase& base, JobSpec& spec) {
  ServeSpec& serve = spec.serve;
  ASSIGN_OR_RETURN(serve.checkpoint, map.RequiredString(kCheckpoint));
  if (serve.checkpoint.empty()) return map.ErrorAt(kCheckpoint, "must name a checkpoint");
  ASSIGN_OR_RETURN(serve.tokenizer, map.OptionalString(kTokenizer, ""));
  ASSIGN_OR_RETURN(const int64_t heads, map.OptionalInt64(kHfHeads, serve.hf_heads,
                                                          {.min = 1, .max = 1 << 16}));
  serve.hf_heads = static_cast<int>(heads);
  ASSIGN_OR_RETURN(serve.model_name, map.OptionalString(kModelName, ""));
  ASSIGN_OR_RETURN(serve.listen, map.OptionalString(kListen, serve.listen));
  std::string host;
  int port = 0;
  if (absl::Status listen = ParseHostPort(serve.listen, &host, &port); !listen.ok()) {
    return map.ErrorAt(kListen, ToString(listen.message()));
  }
  ASSIGN_OR_RETURN(serve.api_key, map.OptionalString(kApiKey, ""));
  ASSIGN_OR_RETURN(serve.api_key_file, map.OptionalString(kApiKeyFile, ""));
  if (!serve.api_key.empty() && !serve.api_key_file.empty()) {
    return map.ErrorAt(kApiKeyFile, "give api_key or api_key_file, not both");
  }
  ASSIGN_OR_RETURN(serve.limits, ParseServeLimits(map));

  if (IsAutoParallel(map)) {
    // The coordinator plans tp × pp when the job starts, from the checkpoint's shape and the
    // devices' memory (serve_memory.h), on at most `actors` devices (0: any).
    spec.parallel_auto = true;
    spec.parallel = ParallelSpec{};
    ResolveServePaths(base, serve);
    return ParseServeElastic(map, spec);
  }
  ASSIGN_OR_RETURN(const YamlMap parallel, map.OptionalMap(kParallel, {kTp, kPp}));
  const IntRange degree{.min = 1, .max = kMaxActors};
  ASSIGN_OR_RETURN(const int64_t tp, parallel.OptionalInt64(kTp, 1, degree));
  ASSIGN_OR_RETURN(const int64_t pp, parallel.OptionalInt64(kPp, 1, degree));
  if (tp * pp > kMaxActors) {
    return map.ErrorAt(kParallel, absl::StrCat("tp·pp = ", tp, "·", pp, " = ", tp * pp,
                                               " is more than the ", kMaxActors,
                                               " actors a job may have"));
  }
  spec.parallel = ParallelSpec{};
  spec.parallel.tp = static_cast<int>(tp);
  spec.parallel.pp = static_cast<int>(pp);
  const int world = spec.parallel.world();
  if (spec.actors == 0) spec.actors = world;
  if (spec.actors != world) {
    return map.ErrorAt(kActors, absl::StrCat("must equal tp·pp = ", world, " (or be left out), got ",
                                             spec.actors));
  }
  ResolveServePaths(base, serve);
  return ParseServeElastic(map, spec);
}

// "KEY: only allowed with kind: K, not '...'" for the first of `keys` present in `map`.
absl::Status RefuseKeys(const YamlMap& map, const std::vector<std::string_view>& keys,
                        JobKind allowed_kind, JobKind kind) {
  for (const std::string_view key : keys) {
    if (map.Has(key)) {
      return map.ErrorAt(
          key, absl::StrCat("only allowed with kind: ", AbslView(JobKindName(allowed_kind)),
                            ", not '", AbslView(JobKindName(kind)), "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpecMap(const YamlMap& map, const PathBase& base) {
  JobSpec spec;
  ASSIGN_OR_RETURN(spec.name, map.RequiredString(kName));
  RETURN_IF_ERROR(ValidateName(map, spec.name));
  ASSIGN_OR_RETURN(spec.kind, map.RequiredEnum<JobKind>(kKind, kJobKinds));

  // A train job's layout decides its actors (ParseTrainJob fills them in when absent).
  const IntRange actor_range{.min = 1, .max = kMaxActors};
  ASSIGN_OR_RETURN(const int64_t actors, spec.kind != JobKind::kCommCheck
                                             ? map.OptionalInt64(kActors, 0, actor_range)
                                             : map.RequiredInt64(kActors, actor_range));
  spec.actors = static_cast<int>(actors);
  if (spec.kind == JobKind::kCommCheck && spec.actors < 2) {
    return map.ErrorAt(kActors, absl::StrCat("a comm-check needs at least 2 actors to "
                                             "communicate, got ",
                                             spec.actors));
  }

  ASSIGN_OR_RETURN(spec.devices, map.OptionalEnum(kDevices, kDeviceKinds, spec.devices));
  ASSIGN_OR_RETURN(spec.backend, map.OptionalEnum(kBackend, kBackends, spec.backend));
  if (spec.backend == Backend::kNccl && spec.devices != DeviceKind::kCuda) {
    return map.ErrorAt(kBackend, absl::StrCat("'nccl' runs only on cuda devices, but devices is '",
                                              AbslView(DeviceKindName(spec.devices)),
                                              "'; use 'shm', 'gloo' or 'auto' for cpu actors"));
  }
  // A serving group moves host memory between its ranks (the steps, a stage's residual, the
  // sampling's candidates; the forward's all-reduces stage a GPU's buffers through it), so it
  // runs over shm or Gloo on any device.
  if (spec.kind == JobKind::kServe && spec.backend == Backend::kNccl) {
    return map.ErrorAt(kBackend,
                       "a serve job's ranks exchange host memory: use 'shm', 'gloo' or "
                       "'auto', not 'nccl'");
  }
  if (spec.backend == Backend::kShm && spec.devices != DeviceKind::kCpu &&
      spec.kind != JobKind::kServe) {
    return map.ErrorAt(kBackend, "'shm' runs only on cpu devices; use 'nccl' or 'auto' for cuda "
                                 "actors");
  }

  ASSIGN_OR_RETURN(spec.bootstrap_timeout,
                   ReadTimeout(map, kBootstrapTimeout, spec.bootstrap_timeout));
  // A service runs until it is cancelled: without run_timeout_s, a year.
  const std::chrono::milliseconds run_timeout =
      spec.kind == JobKind::kServe
          ? std::chrono::milliseconds(std::llround(kMaxTimeoutSeconds * 1000))
          : spec.run_timeout;
  ASSIGN_OR_RETURN(spec.run_timeout, ReadTimeout(map, kRunTimeout, run_timeout));

  switch (spec.kind) {
    case JobKind::kCommCheck: {
      RETURN_IF_ERROR(RefuseKeys(map, TrainOnlyKeys(), JobKind::kTrain, spec.kind));
      RETURN_IF_ERROR(RefuseKeys(map, ServeOnlyKeys(), JobKind::kServe, spec.kind));
      ASSIGN_OR_RETURN(spec.comm_check, ParseCommCheck(map));
      break;
    }
    case JobKind::kTrain: {
      RETURN_IF_ERROR(RefuseKeys(map, {kCommCheck}, JobKind::kCommCheck, spec.kind));
      RETURN_IF_ERROR(RefuseKeys(map, ServeOnlyKeys(), JobKind::kServe, spec.kind));
      RETURN_IF_ERROR(ParseTrainJob(map, base, spec));
      break;
    }
    case JobKind::kServe: {
      RETURN_IF_ERROR(RefuseKeys(map, {kCommCheck}, JobKind::kCommCheck, spec.kind));
      std::vector<std::string_view> train_only;
      for (const std::string_view key : TrainOnlyKeys()) {
        if (key != kCheckpoint && key != kParallel && key != kElastic) train_only.push_back(key);
      }
      RETURN_IF_ERROR(RefuseKeys(map, train_only, JobKind::kTrain, spec.kind));
      RETURN_IF_ERROR(ParseServeJob(map, base, spec));
      break;
    }
  }
  return spec;
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source_name,
                                     const PathBase& base) {
  ASSIGN_OR_RETURN(const YamlMap map, YamlMap::Parse(yaml_text, source_name, TopLevelKeys()));
  return ParseJobSpecMap(map, base);
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  // Absolute, so that the paths stay right wherever the spec travels (coordinator, actors).
  std::error_code error;
  const std::filesystem::path work_dir = std::filesystem::current_path(error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot read the current directory to resolve ", path, ": ", error.message()));
  }
  PathBase base;
  base.spec_dir = (work_dir / path).lexically_normal().parent_path().string();
  base.work_dir = work_dir.string();
  return ParseJobSpec(text, path, base);
}

absl::Status ApplyPlannedLayout(JobSpec& spec, const ParallelSpec& layout) {
  if (spec.kind != JobKind::kTrain) {
    return absl::InvalidArgumentError(absl::StrCat("a ", AbslView(JobKindName(spec.kind)),
                                                   " job has no parallel layout"));
  }
  const int64_t world = int64_t{layout.tp} * layout.pp * layout.dp;
  if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1 || world > kMaxActors) {
    return absl::InvalidArgumentError(absl::StrCat("layout tp·pp·dp = ", layout.tp, "·",
                                                   layout.pp, "·", layout.dp,
                                                   " is not a world of 1 to ", kMaxActors,
                                                   " ranks"));
  }
  if (spec.parallel_auto) {
    if (spec.actors > 0 && world > spec.actors) {
      return absl::InvalidArgumentError(absl::StrCat("the plan's tp·pp·dp = ", world,
                                                     " ranks exceed the job's actors: ",
                                                     spec.actors));
    }
    if (spec.parallel.micro_batch > 0 &&
        MicroBatchSize(layout, spec.train.batch) != spec.parallel.micro_batch) {
      return absl::InvalidArgumentError(
          absl::StrCat("the plan's micro-batch ", MicroBatchSize(layout, spec.train.batch),
                       " is not the job's micro_batch ", spec.parallel.micro_batch));
    }
  }
  RETURN_IF_ERROR(
      ValidateParallel(spec.train.model, spec.train.batch, layout, static_cast<int>(world)));
  RETURN_IF_ERROR(CheckDataParallel(spec.data_parallel, layout, spec.train.model));
  RETURN_IF_ERROR(CheckSites(spec.train.data, layout));
  if (!spec.parallel_auto) {
    // A fixed layout is the user's: only the same one (what the coordinator sends back) applies,
    // but for an elastic job's dp, which each generation picks (ElasticLayout).
    const ParallelSpec& own = spec.parallel;
    const bool same_dp = own.dp == layout.dp ||
                         (spec.elastic.enabled && world >= spec.elastic.min_actors &&
                          world <= spec.elastic.max_actors);
    ParallelSpec own_at_dp = own;  // the spec's micro-batch (or its default) at that dp
    own_at_dp.dp = layout.dp;
    const bool same_micro_batch = MicroBatchSize(own_at_dp, spec.train.batch) ==
                                  MicroBatchSize(layout, spec.train.batch);
    // The schedule and the recomputation are part of the layout: the engine's memory and the
    // step's time depend on them (its results do not: a chunk's backwards run in micro-batch
    // order under every schedule, and recomputation repeats the forward's values exactly).
    if (own.tp != layout.tp || own.pp != layout.pp || !same_dp || own.zero != layout.zero ||
        own.stage_layers != layout.stage_layers || !same_micro_batch ||
        own.schedule != layout.schedule || own.virtual_stages != layout.virtual_stages ||
        own.recompute != layout.recompute) {
      return absl::InvalidArgumentError(
          spec.elastic.enabled
              ? "the job's layout is fixed by its spec; an elastic job takes only another dp in "
                "its min_actors..max_actors"
              : "the job's layout is fixed by its spec; only `parallel: auto` takes a planned one");
    }
  }
  spec.parallel = layout;
  spec.actors = static_cast<int>(world);
  return absl::OkStatus();
}

absl::StatusOr<ParallelSpec> ElasticLayout(const JobSpec& spec, int devices) {
  const ParallelSpec& layout = spec.parallel;
  const int max_world = std::min(spec.elastic.max_actors, devices);
  auto chosen = LargestElasticLayout(spec.train.model, spec.train.batch, layout,
                                     spec.elastic.min_actors, max_world, nullptr);
  if (chosen.ok()) return chosen;
  return absl::FailedPreconditionError(absl::StrCat(
      devices, " devices give no layout of tp·pp = ", layout.tp * layout.pp, " with ",
      spec.elastic.min_actors, " to ", spec.elastic.max_actors, " actors that divides the batch"));
}

absl::Status ParseHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  const std::string digits = address.substr(colon + 1);
  int64_t value = -1;
  const bool number = std::all_of(digits.begin(), digits.end(),
                                  [](char c) { return c >= '0' && c <= '9'; }) &&
                      digits.size() <= 5 && absl::SimpleAtoi(digits, &value);
  if (!number || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "': the port '", digits,
                                                   "' is not a number in 0..65535"));
  }
  *host = address.substr(0, colon);
  *port = static_cast<int>(value);
  return absl::OkStatus();
}

std::string_view JobKindName(JobKind kind) { return NameOf(kJobKinds, kind); }
std::string_view DeviceKindName(DeviceKind kind) { return NameOf(kDeviceKinds, kind); }
std::string_view BackendName(Backend backend) { return NameOf(kBackends, backend); }

Backend ResolveBackend(const JobSpec& spec) {
  if (spec.backend != Backend::kAuto) return spec.backend;
  if (spec.kind == JobKind::kServe) return Backend::kShm;  // host memory on any device (above)
  return spec.devices == DeviceKind::kCuda ? Backend::kNccl : Backend::kShm;
}

std::vector<int64_t> CommCheckSizesBytes(const CommCheckSpec& spec) {
  // Clamped rather than trusted so that an unvalidated spec cannot loop forever (min_bytes 0).
  const int64_t min_bytes = std::max(
      kCommCheckElementBytes, spec.min_bytes / kCommCheckElementBytes * kCommCheckElementBytes);
  const int64_t max_bytes =
      std::max(min_bytes, std::min(kCommCheckMaxBytes, spec.max_bytes) / kCommCheckElementBytes *
                              kCommCheckElementBytes);
  std::vector<int64_t> sizes;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    sizes.push_back(bytes);
    if (bytes > max_bytes / 4) break;
  }
  sizes.push_back(max_bytes);
  if (spec.uneven_sizes) {
    for (const int64_t count : kUnevenElementCounts) {
      const int64_t bytes = count * kCommCheckElementBytes;
      if (bytes >= min_bytes && bytes <= max_bytes) sizes.push_back(bytes);
    }
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace shardline::placement
