// A small strict reader over yaml-cpp for Shardline's specs (JobSpec now; model::ModelConfig,
// ClusterSpec and TrainSpec later). Strict means: a key nobody reads is an error rather than a
// silently ignored typo, a value of the wrong type is an error rather than a default, and every
// error says where it is:
//
//   job.yaml:7:14: comm_check.max_bytes: expected an integer, got 'lots'
//
// (FILE:LINE:COL, 1-based, pointing at the offending value, or at the key for unknown keys; then
// the dotted PATH of the field; then what is wrong.) All errors are absl::InvalidArgument except a
// missing file, which is absl::NotFound.
//
// Thread-compatible: a YamlMap is a read-only view and may be read from several threads once built.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"

namespace shardline::placement {

// Parses `text` as exactly one YAML document. Syntax errors (yaml-cpp exceptions) and a second
// document become InvalidArgument "SOURCE:LINE:COL: invalid YAML: ...". An empty text yields a null
// node (YamlMap::Open then says the document is empty).
absl::StatusOr<YAML::Node> ParseYamlDocument(const std::string& text,
                                             const std::string& source_name);

// Reads a whole file. NotFound naming `path` when it does not exist; InvalidArgument when it is a
// directory; Unavailable (with errno text) for other read failures.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// Returns the candidate closest to `word` by edit distance, if it is close enough to be a likely
// typo ("max_byte" -> "max_bytes", "cude" -> "cuda"), else nullopt.
std::optional<std::string_view> ClosestMatch(std::string_view word,
                                             std::span<const std::string_view> candidates);

// Inclusive bounds for integer fields; unset means unbounded.
struct IntRange {
  std::optional<int64_t> min = std::nullopt;
  std::optional<int64_t> max = std::nullopt;
};

// Bounds for floating-point fields; `min_exclusive` turns "must be ≥ min" into "must be > min"
// (a timeout of 0 s is never meant).
struct DoubleRange {
  std::optional<double> min = std::nullopt;
  std::optional<double> max = std::nullopt;
  bool min_exclusive = false;
};

// One spelling of a string enum, e.g. {"cuda", DeviceKind::kCuda}. Spec modules keep one table per
// enum and use it both to parse and to print, so the two cannot drift apart.
template <typename E>
struct EnumName {
  std::string_view name;
  E value;
};

// A YAML mapping with a fixed set of known keys. Opening one fails on any other key, so by the time
// a caller asks for values, every key in the file is one the caller understands.
//
// Required* getters fail when the key is absent; Optional* getters return `default_value` when the
// key is absent but still fail when it is present with a bad value (including `key:` with no value,
// which YAML reads as null: writing a key and no value is a mistake, not a request for the
// default).
class YamlMap {
 public:
  // Opens the top-level mapping of a document parsed by ParseYamlDocument. `source_name` (usually
  // the file path) is the FILE of every error message. The views in `known_keys` (here and in
  // RequiredMap/OptionalMap) are kept, so they must outlive the map: pass literals or constants.
  static absl::StatusOr<YamlMap> Open(const YAML::Node& document, std::string source_name,
                                      std::vector<std::string_view> known_keys);

  // Parses `text` and opens its top-level mapping in one step.
  static absl::StatusOr<YamlMap> Parse(const std::string& text, const std::string& source_name,
                                       std::vector<std::string_view> known_keys);

  bool Has(std::string_view key) const;
  // The dotted path of this mapping ("" at the top level, "comm_check" for a nested one).
  const std::string& path() const { return path_; }
  const std::string& source_name() const { return *source_; }
  // The dotted path of `key` inside this mapping, as used in error messages.
  std::string KeyPath(std::string_view key) const;

  absl::StatusOr<int64_t> RequiredInt64(std::string_view key, IntRange range = {}) const;
  absl::StatusOr<int64_t> OptionalInt64(std::string_view key, int64_t default_value,
                                        IntRange range = {}) const;

  // A byte count: plain integer or a size string ("64MiB", "4KiB", "1GB"; see byte_size.h). Range
  // errors print sizes with units ("must be ≤ 1GiB, got 2GiB").
  absl::StatusOr<int64_t> RequiredBytes(std::string_view key, IntRange range = {}) const;
  absl::StatusOr<int64_t> OptionalBytes(std::string_view key, int64_t default_value,
                                        IntRange range = {}) const;

  // Finite numbers only: "inf" and "nan" are errors. Integers are accepted ("30" is 30.0).
  absl::StatusOr<double> RequiredDouble(std::string_view key, DoubleRange range = {}) const;
  absl::StatusOr<double> OptionalDouble(std::string_view key, double default_value,
                                        DoubleRange range = {}) const;

  // YAML 1.2 booleans only (true/false, True/False, TRUE/FALSE); "yes", "on" and "1" are errors,
  // because YAML 1.1 and 1.2 readers disagree on them.
  absl::StatusOr<bool> RequiredBool(std::string_view key) const;
  absl::StatusOr<bool> OptionalBool(std::string_view key, bool default_value) const;

  // Any scalar, as written ("123" stays "123").
  absl::StatusOr<std::string> RequiredString(std::string_view key) const;
  absl::StatusOr<std::string> OptionalString(std::string_view key, std::string default_value) const;

  // A string that must be one of `allowed`; returns its index in `allowed`. The error lists the
  // allowed values and suggests the closest one.
  absl::StatusOr<size_t> RequiredChoice(std::string_view key,
                                        std::span<const std::string_view> allowed) const;

  template <typename E>
  absl::StatusOr<E> RequiredEnum(std::string_view key,
                                 std::span<const EnumName<std::type_identity_t<E>>> names) const;
  template <typename E>
  absl::StatusOr<E> OptionalEnum(std::string_view key,
                                 std::span<const EnumName<std::type_identity_t<E>>> names,
                                 E default_value) const;

  // A list of scalars. When `allowed` is not empty every element must be one of it (checked like
  // RequiredChoice, the error pointing at the element: "comm_check.ops[2]"). An absent optional
  // list is empty; `key: []` is an empty list too.
  absl::StatusOr<std::vector<std::string>> RequiredStringList(
      std::string_view key, std::span<const std::string_view> allowed = {}) const;
  absl::StatusOr<std::vector<std::string>> OptionalStringList(
      std::string_view key, std::span<const std::string_view> allowed = {}) const;

  // A nested mapping with its own known keys. An absent optional mapping opens as an empty one, so
  // its Optional* getters return their defaults and the caller needs no second code path.
  absl::StatusOr<YamlMap> RequiredMap(std::string_view key,
                                      std::vector<std::string_view> known_keys) const;
  absl::StatusOr<YamlMap> OptionalMap(std::string_view key,
                                      std::vector<std::string_view> known_keys) const;

  // A list of mappings, each with `known_keys` and the path "key[i]" in errors
  // ("nodes[2].devices"). An empty list is an error (it lists nothing to read).
  absl::StatusOr<std::vector<YamlMap>> RequiredMapList(
      std::string_view key, std::vector<std::string_view> known_keys) const;

  // An InvalidArgument located at `key`'s value (at this mapping when `key` is absent), for checks
  // that span fields: "FILE:LINE:COL: backend: 'nccl' needs cuda devices".
  absl::Status ErrorAt(std::string_view key, std::string_view message) const;
  // Likewise at element `index` of the list under `key` (path "key[index]").
  absl::Status ErrorAtElement(std::string_view key, size_t index, std::string_view message) const;

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };

  YamlMap(std::shared_ptr<const std::string> source, std::string path, YAML::Mark mark,
          std::vector<std::string_view> known_keys);

  // Checks that `node` is a mapping of known scalar keys, each at most once, and fills entries_.
  // `if_null` says what a null node means ("the document is empty", "has no value").
  absl::Status Load(const YAML::Node& node, std::string_view if_null);
  const Entry* Find(std::string_view key) const;
  absl::StatusOr<const Entry*> FindRequired(std::string_view key) const;
  absl::StatusOr<YamlMap> OpenChild(const Entry& entry,
                                    std::vector<std::string_view> known_keys) const;
  // Fails unless the value is a scalar; callers then read entry.value.Scalar() (kept alive by
  // entries_), which also sidesteps a GCC 12 false -Wmaybe-uninitialized on StatusOr<string>.
  absl::Status CheckScalar(const Entry& entry, std::string_view expected) const;
  absl::StatusOr<std::string> ScalarOf(const Entry& entry, std::string_view expected) const;
  absl::StatusOr<int64_t> Int64Of(const Entry& entry, IntRange range) const;
  absl::StatusOr<int64_t> BytesOf(const Entry& entry, IntRange range) const;
  absl::StatusOr<double> DoubleOf(const Entry& entry, DoubleRange range) const;
  absl::StatusOr<bool> BoolOf(const Entry& entry) const;
  absl::StatusOr<size_t> ChoiceOf(const Entry& entry,
                                  std::span<const std::string_view> allowed) const;
  absl::StatusOr<std::vector<std::string>> StringListOf(
      const Entry& entry, std::span<const std::string_view> allowed) const;
  absl::Status ErrorAtNode(const YAML::Node& node, const YAML::Node& fallback,
                           std::string_view path, std::string_view message) const;

  // Shared by a mapping and its children so that nested maps do not copy the file name.
  std::shared_ptr<const std::string> source_;
  std::string path_;
  // Where this mapping is (or, for an absent optional mapping, its parent), for errors about it.
  YAML::Mark mark_;
  std::vector<std::string_view> known_keys_;
  // In document order, so that the first error reported is the first one in the file.
  std::vector<Entry> entries_;
};

template <typename E>
absl::StatusOr<E> YamlMap::RequiredEnum(
    std::string_view key, std::span<const EnumName<std::type_identity_t<E>>> names) const {
  std::vector<std::string_view> allowed;
  allowed.reserve(names.size());
  for (const auto& name : names) allowed.push_back(name.name);
  ASSIGN_OR_RETURN(const size_t index, RequiredChoice(key, allowed));
  return names[index].value;
}

template <typename E>
absl::StatusOr<E> YamlMap::OptionalEnum(std::string_view key,
                                        std::span<const EnumName<std::type_identity_t<E>>> names,
                                        E default_value) const {
  if (!Has(key)) return default_value;
  return RequiredEnum<E>(key, names);
}

}  // namespace shardline::placement
