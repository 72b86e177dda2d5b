#include "placement/job_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/byte_size.h"
#include "placement/string_view_compat.h"
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
constexpr std::string_view kOps = "ops";
constexpr std::string_view kUnevenSizes = "uneven_sizes";

constexpr EnumName<JobKind> kJobKinds[] = {{"comm-check", JobKind::kCommCheck}};
constexpr EnumName<DeviceKind> kDeviceKinds[] = {{"cpu", DeviceKind::kCpu},
                                                 {"cuda", DeviceKind::kCuda}};
constexpr EnumName<Backend> kBackends[] = {
    {"auto", Backend::kAuto}, {"gloo", Backend::kGloo}, {"nccl", Backend::kNccl}};

constexpr size_t kMaxNameLength = 63;
// A year: long enough for any run, small enough that seconds → milliseconds cannot overflow.
constexpr double kMaxTimeoutSeconds = 365.0 * 24 * 3600;

constexpr int64_t kUnevenElementCounts[] = {3, 1000, 65537, 4194305};

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
  ASSIGN_OR_RETURN(
      const YamlMap map,
      parent.OptionalMap(kCommCheck, {kMinBytes, kMaxBytes, kIterations, kOps, kUnevenSizes}));
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

absl::StatusOr<JobSpec> ParseJobSpecMap(const YamlMap& map) {
  JobSpec spec;
  ASSIGN_OR_RETURN(spec.name, map.RequiredString(kName));
  RETURN_IF_ERROR(ValidateName(map, spec.name));
  ASSIGN_OR_RETURN(spec.kind, map.RequiredEnum<JobKind>(kKind, kJobKinds));

  ASSIGN_OR_RETURN(const int64_t actors, map.RequiredInt64(kActors, {.min = 1, .max = kMaxActors}));
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
                                              "'; use 'gloo' or 'auto' for cpu actors"));
  }

  ASSIGN_OR_RETURN(spec.bootstrap_timeout,
                   ReadTimeout(map, kBootstrapTimeout, spec.bootstrap_timeout));
  ASSIGN_OR_RETURN(spec.run_timeout, ReadTimeout(map, kRunTimeout, spec.run_timeout));

  if (spec.kind == JobKind::kCommCheck) {
    ASSIGN_OR_RETURN(spec.comm_check, ParseCommCheck(map));
  } else if (map.Has(kCommCheck)) {
    return map.ErrorAt(kCommCheck, absl::StrCat("only allowed with kind: comm-check, not '",
                                                AbslView(JobKindName(spec.kind)), "'"));
  }
  return spec;
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source_name) {
  ASSIGN_OR_RETURN(const YamlMap map, YamlMap::Parse(yaml_text, source_name,
                                                     {kName, kKind, kActors, kDevices, kBackend,
                                                      kBootstrapTimeout, kRunTimeout, kCommCheck}));
  return ParseJobSpecMap(map);
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParseJobSpec(text, path);
}

std::string_view JobKindName(JobKind kind) { return NameOf(kJobKinds, kind); }
std::string_view DeviceKindName(DeviceKind kind) { return NameOf(kDeviceKinds, kind); }
std::string_view BackendName(Backend backend) { return NameOf(kBackends, backend); }

Backend ResolveBackend(const JobSpec& spec) {
  if (spec.backend != Backend::kAuto) return spec.backend;
  return spec.devices == DeviceKind::kCuda ? Backend::kNccl : Backend::kGloo;
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
