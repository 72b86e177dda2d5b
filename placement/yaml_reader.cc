#include "placement/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "placement/byte_size.h"
#include "placement/string_view_compat.h"

namespace shardline::placement {
namespace {

// Long scalars are cut in messages so that one bad value does not bury the rest of the line.
constexpr size_t kMaxQuotedValue = 40;

// "FILE:LINE:COL: PATH: message" with yaml-cpp's 0-based mark made 1-based; no PATH at top level.
std::string Located(const std::string& source, const YAML::Mark& mark, std::string_view path,
                    std::string_view message) {
  const int line = mark.is_null() ? 1 : mark.line + 1;
  const int column = mark.is_null() ? 1 : mark.column + 1;
  if (path.empty()) return absl::StrCat(source, ":", line, ":", column, ": ", AbslView(message));
  return absl::StrCat(source, ":", line, ":", column, ": ", AbslView(path), ": ",
                      AbslView(message));
}

std::string Quoted(std::string_view text) {
  if (text.size() <= kMaxQuotedValue) return absl::StrCat("'", AbslView(text), "'");
  return absl::StrCat("'", AbslView(text.substr(0, kMaxQuotedValue)), "...'");
}

// What a node is, for "expected X, got Y".
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return Quoted(node.Scalar());
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

// "a, b, c" or "'a', 'b', 'c'". Written out because absl::StrJoin's default formatter does not take
// std::string_view in this Abseil build.
std::string JoinNames(std::span<const std::string_view> names, bool quoted) {
  std::string out;
  for (const std::string_view name : names) {
    if (!out.empty()) out += ", ";
    if (quoted) out += '\'';
    out.append(name);
    if (quoted) out += '\'';
  }
  return out;
}

std::string QuotedList(std::span<const std::string_view> values) {
  return JoinNames(values, /*quoted=*/true);
}

std::string Suggestion(std::string_view word, std::span<const std::string_view> candidates) {
  const std::optional<std::string_view> match = ClosestMatch(word, candidates);
  if (!match) return "";
  return absl::StrCat("; did you mean '", AbslView(*match), "'?");
}

size_t EditDistance(std::string_view a, std::string_view b) {
  // One row of the Levenshtein table; keys are short, so O(|a|·|b|) is nothing.
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string FormatInt(int64_t value, bool bytes) {
  return bytes ? FormatByteSize(value) : absl::StrCat(value);
}

// "must be ≥ 1, got 0" / "must be between 1 and 1000, got 0", or nothing when in range.
std::optional<std::string> IntRangeViolation(int64_t value, const IntRange& range, bool bytes) {
  const bool too_small = range.min && value < *range.min;
  const bool too_large = range.max && value > *range.max;
  if (!too_small && !too_large) return std::nullopt;
  const std::string got = absl::StrCat(", got ", FormatInt(value, bytes));
  if (range.min && range.max) {
    return absl::StrCat("must be between ", FormatInt(*range.min, bytes), " and ",
                        FormatInt(*range.max, bytes), got);
  }
  if (too_small) return absl::StrCat("must be ≥ ", FormatInt(*range.min, bytes), got);
  return absl::StrCat("must be ≤ ", FormatInt(*range.max, bytes), got);
}

// Up to 15 significant digits, so a bound of 31536000 s reads as that and not as 3.1536e+07
// (absl::StrCat keeps only 6).
std::string FormatDouble(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.15g", value);
  return buffer;
}

std::optional<std::string> DoubleRangeViolation(double value, const DoubleRange& range) {
  if (range.min) {
    const bool bad = range.min_exclusive ? !(value > *range.min) : !(value >= *range.min);
    if (bad) {
      return absl::StrCat("must be ", range.min_exclusive ? "> " : "≥ ", FormatDouble(*range.min),
                          ", got ", FormatDouble(value));
    }
  }
  if (range.max && value > *range.max) {
    return absl::StrCat("must be ≤ ", FormatDouble(*range.max), ", got ", FormatDouble(value));
  }
  return std::nullopt;
}

// Beyond this many documents ParseYamlDocument stops counting: the text is wrong either way.
constexpr int kMaxDocumentsCounted = 16;

// Counts the documents of a YAML stream and keeps where the second one's content starts (what
// YAML::Node::Mark() of its root would say).
class DocumentCounter : public YAML::EventHandler {
 public:
  int documents() const { return documents_; }
  const YAML::Mark& second_document_mark() const { return second_document_mark_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    ++documents_;
    if (documents_ == 2) second_document_mark_ = mark;
    awaiting_second_root_ = documents_ == 2;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { OnNode(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { OnNode(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    OnNode(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    OnNode(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    OnNode(mark);
  }
  void OnMapEnd() override {}

 private:
  void OnNode(const YAML::Mark& mark) {
    if (!awaiting_second_root_) return;
    second_document_mark_ = mark;
    awaiting_second_root_ = false;
  }

  int documents_ = 0;
  bool awaiting_second_root_ = false;
  YAML::Mark second_document_mark_;
};

}  // namespace

absl::StatusOr<YAML::Node> ParseYamlDocument(const std::string& text,
                                             const std::string& source_name) {
  YAML::Node document;
  DocumentCounter counter;
  try {
    document = YAML::Load(text);
    // Not YAML::LoadAll: after some malformed input ("? a]]") yaml-cpp 0.7's parser yields empty
    // documents forever, and LoadAll never returns. Counting stops at a bound instead.
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    while (counter.documents() <= kMaxDocumentsCounted && parser.HandleNextDocument(counter)) {
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        Located(source_name, e.mark, "", absl::StrCat("invalid YAML: ", e.msg)));
  }
  if (counter.documents() > 1) {
    // A stray "---" most often means two files were pasted together; reading only the first
    // would silently drop the second.
    const std::string found = counter.documents() > kMaxDocumentsCounted
                                  ? absl::StrCat("more than ", kMaxDocumentsCounted)
                                  : absl::StrCat(counter.documents());
    return absl::InvalidArgumentError(
        Located(source_name, counter.second_document_mark(), "",
                absl::StrCat("invalid YAML: expected one document, found ", found,
                             " (remove the extra '---' separator)")));
  }
  return document;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (status.type() == std::filesystem::file_type::directory) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::UnavailableError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  return contents.str();
}

std::optional<std::string_view> ClosestMatch(std::string_view word,
                                             std::span<const std::string_view> candidates) {
  // A third of the word, but at least 2: "max_byte"/"max_bytes" and "cude"/"cuda" match,
  // "name"/"kind" do not. The candidate must also differ from the word in fewer places than it
  // has characters, or every short key would "match" every other short key.
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  std::optional<std::string_view> best;
  size_t best_distance = limit + 1;
  for (const std::string_view candidate : candidates) {
    const size_t distance = EditDistance(word, candidate);
    if (distance < best_distance && distance < std::min(word.size(), candidate.size())) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

YamlMap::YamlMap(std::shared_ptr<const std::string> source, std::string path, YAML::Mark mark,
                 std::vector<std::string_view> known_keys)
    : source_(std::move(source)),
      path_(std::move(path)),
      mark_(mark),
      known_keys_(std::move(known_keys)) {}

absl::StatusOr<YamlMap> YamlMap::Open(const YAML::Node& document, std::string source_name,
                                      std::vector<std::string_view> known_keys) {
  YamlMap map(std::make_shared<const std::string>(std::move(source_name)), "",
              document.IsDefined() ? document.Mark() : YAML::Mark::null_mark(),
              std::move(known_keys));
  RETURN_IF_ERROR(map.Load(document, "the document is empty"));
  return map;
}

absl::StatusOr<YamlMap> YamlMap::Parse(const std::string& text, const std::string& source_name,
                                       std::vector<std::string_view> known_keys) {
  ASSIGN_OR_RETURN(const YAML::Node document, ParseYamlDocument(text, source_name));
  return Open(document, source_name, std::move(known_keys));
}

absl::Status YamlMap::Load(const YAML::Node& node, std::string_view if_null) {
  const std::string known = JoinNames(known_keys_, /*quoted=*/false);
  if (!node.IsMap()) {
    const std::string message =
        node.IsNull()
            ? absl::StrCat(AbslView(if_null), "; expected a mapping with keys: ", known)
            : absl::StrCat("expected a mapping with keys: ", known, "; got ", Describe(node));
    return absl::InvalidArgumentError(Located(*source_, mark_, path_, message));
  }
  for (const auto& item : node) {
    const YAML::Node& key_node = item.first;
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(
          Located(*source_, key_node.Mark(), path_,
                  absl::StrCat("keys must be plain names, got ", Describe(key_node), " as a key")));
    }
    std::string key = key_node.Scalar();
    const std::string key_path = KeyPath(key);
    if (std::find(known_keys_.begin(), known_keys_.end(), key) == known_keys_.end()) {
      return absl::InvalidArgumentError(Located(
          *source_, key_node.Mark(), key_path,
          absl::StrCat("unknown key '", key, "'", path_.empty() ? "" : absl::StrCat(" in ", path_),
                       Suggestion(key, known_keys_), " (known keys: ", known, ")")));
    }
    // yaml-cpp keeps duplicate keys and operator[] returns the first, so a later override the user
    // meant would be ignored without this check.
    if (const Entry* first = Find(key)) {
      return absl::InvalidArgumentError(
          Located(*source_, key_node.Mark(), key_path,
                  absl::StrCat("key '", key, "' appears twice (first at line ",
                               first->key_node.Mark().line + 1, ")")));
    }
    entries_.push_back(Entry{std::move(key), key_node, item.second});
  }
  return absl::OkStatus();
}

bool YamlMap::Has(std::string_view key) const { return Find(key) != nullptr; }

std::string YamlMap::KeyPath(std::string_view key) const {
  if (path_.empty()) return std::string(key);
  return absl::StrCat(path_, ".", AbslView(key));
}

const YamlMap::Entry* YamlMap::Find(std::string_view key) const {
  for (const Entry& entry : entries_) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

absl::StatusOr<const YamlMap::Entry*> YamlMap::FindRequired(std::string_view key) const {
  if (const Entry* entry = Find(key)) return entry;
  return absl::InvalidArgumentError(
      Located(*source_, mark_, KeyPath(key),
              absl::StrCat("required key '", AbslView(key), "' is missing",
                           path_.empty() ? "" : absl::StrCat(" from ", path_))));
}

absl::Status YamlMap::ErrorAtNode(const YAML::Node& node, const YAML::Node& fallback,
                                  std::string_view path, std::string_view message) const {
  // yaml-cpp places an empty value (`key:`) at the next token, often lines further down; the
  // key is where the user has to look.
  const YAML::Mark mark = node.IsNull() || node.Mark().is_null() ? fallback.Mark() : node.Mark();
  return absl::InvalidArgumentError(Located(*source_, mark, path, message));
}

absl::Status YamlMap::ErrorAt(std::string_view key, std::string_view message) const {
  if (const Entry* entry = Find(key)) {
    return ErrorAtNode(entry->value, entry->key_node, KeyPath(key), message);
  }
  return absl::InvalidArgumentError(Located(*source_, mark_, KeyPath(key), message));
}

absl::Status YamlMap::ErrorAtElement(std::string_view key, size_t index,
                                     std::string_view message) const {
  const std::string path = absl::StrCat(KeyPath(key), "[", index, "]");
  const Entry* entry = Find(key);
  if (entry == nullptr || !entry->value.IsSequence() || index >= entry->value.size()) {
    return ErrorAt(key, message);
  }
  return ErrorAtNode(entry->value[index], entry->value, path, message);
}

absl::Status YamlMap::CheckScalar(const Entry& entry, std::string_view expected) const {
  if (entry.value.IsScalar()) return absl::OkStatus();
  return ErrorAtNode(
      entry.value, entry.key_node, KeyPath(entry.key),
      absl::StrCat("expected ", AbslView(expected), ", got ", Describe(entry.value)));
}

absl::StatusOr<std::string> YamlMap::ScalarOf(const Entry& entry, std::string_view expected) const {
  RETURN_IF_ERROR(CheckScalar(entry, expected));
  return entry.value.Scalar();
}

absl::StatusOr<int64_t> YamlMap::Int64Of(const Entry& entry, IntRange range) const {
  RETURN_IF_ERROR(CheckScalar(entry, "an integer"));
  const std::string& text = entry.value.Scalar();
  int64_t value = 0;
  // SimpleAtoi alone would take " 4" and "+4"; YAML already stripped the spaces we allow.
  const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) ||
                                       (text[0] == '-' && text.size() > 1));
  if (!plain || !absl::SimpleAtoi(text, &value)) {
    const bool digits = plain && text.find_first_not_of("-0123456789") == std::string::npos;
    return ErrorAt(entry.key, absl::StrCat("expected an integer, got ", Quoted(text),
                                           digits ? " (out of the 64-bit range)" : ""));
  }
  if (auto violation = IntRangeViolation(value, range, /*bytes=*/false)) {
    return ErrorAt(entry.key, *violation);
  }
  return value;
}

absl::StatusOr<int64_t> YamlMap::BytesOf(const Entry& entry, IntRange range) const {
  RETURN_IF_ERROR(CheckScalar(entry, "a byte size"));
  const std::string& text = entry.value.Scalar();
  absl::StatusOr<int64_t> value = ParseByteSize(text);
  if (!value.ok()) return ErrorAt(entry.key, ToString(value.status().message()));
  if (auto violation = IntRangeViolation(*value, range, /*bytes=*/true)) {
    return ErrorAt(entry.key, *violation);
  }
  return *value;
}

absl::StatusOr<double> YamlMap::DoubleOf(const Entry& entry, DoubleRange range) const {
  RETURN_IF_ERROR(CheckScalar(entry, "a number"));
  const std::string& text = entry.value.Scalar();
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return ErrorAt(entry.key, absl::StrCat("expected a finite number, got ", Quoted(text)));
  }
  if (auto violation = DoubleRangeViolation(value, range)) return ErrorAt(entry.key, *violation);
  return value;
}

absl::StatusOr<bool> YamlMap::BoolOf(const Entry& entry) const {
  RETURN_IF_ERROR(CheckScalar(entry, "true or false"));
  const std::string& text = entry.value.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return ErrorAt(entry.key, absl::StrCat("expected true or false, got ", Quoted(text)));
}

absl::StatusOr<size_t> YamlMap::ChoiceOf(const Entry& entry,
                                         std::span<const std::string_view> allowed) const {
  const std::string expected = absl::StrCat("one of ", QuotedList(allowed));
  RETURN_IF_ERROR(CheckScalar(entry, expected));
  const std::string& text = entry.value.Scalar();
  const auto it = std::find(allowed.begin(), allowed.end(), text);
  if (it == allowed.end()) {
    return ErrorAt(entry.key, absl::StrCat("expected ", expected, ", got ", Quoted(text),
                                           Suggestion(text, allowed)));
  }
  return static_cast<size_t>(it - allowed.begin());
}

absl::StatusOr<std::vector<std::string>> YamlMap::StringListOf(
    const Entry& entry, std::span<const std::string_view> allowed) const {
  if (!entry.value.IsSequence()) {
    return ErrorAt(entry.key,
                   absl::StrCat("expected a list (e.g. [a, b]), got ", Describe(entry.value)));
  }
  std::vector<std::string> values;
  values.reserve(entry.value.size());
  for (size_t i = 0; i < entry.value.size(); ++i) {
    const YAML::Node element = entry.value[i];
    if (!element.IsScalar()) {
      return ErrorAtElement(entry.key, i,
                            absl::StrCat("expected a string, got ", Describe(element)));
    }
    std::string text = element.Scalar();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
      return ErrorAtElement(entry.key, i,
                            absl::StrCat("expected one of ", QuotedList(allowed), ", got ",
                                         Quoted(text), Suggestion(text, allowed)));
    }
    values.push_back(std::move(text));
  }
  return values;
}

absl::StatusOr<YamlMap> YamlMap::OpenChild(const Entry& entry,
                                           std::vector<std::string_view> known_keys) const {
  const YAML::Mark mark = entry.value.IsNull() || entry.value.Mark().is_null()
                              ? entry.key_node.Mark()
                              : entry.value.Mark();
  YamlMap child(source_, KeyPath(entry.key), mark, std::move(known_keys));
  RETURN_IF_ERROR(child.Load(entry.value, "has no value"));
  return child;
}

absl::StatusOr<std::vector<YamlMap>> YamlMap::RequiredMapList(
    std::string_view key, std::vector<std::string_view> known_keys) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  if (!entry->value.IsSequence()) {
    return ErrorAt(key, absl::StrCat("expected a list of mappings, got ", Describe(entry->value)));
  }
  if (entry->value.size() == 0) return ErrorAt(key, "the list is empty");
  std::vector<YamlMap> maps;
  maps.reserve(entry->value.size());
  for (size_t i = 0; i < entry->value.size(); ++i) {
    const YAML::Node element = entry->value[i];
    const YAML::Mark mark =
        element.IsNull() || element.Mark().is_null() ? entry->value.Mark() : element.Mark();
    YamlMap child(source_, absl::StrCat(KeyPath(key), "[", i, "]"), mark, known_keys);
    RETURN_IF_ERROR(child.Load(element, "the element is empty"));
    maps.push_back(std::move(child));
  }
  return maps;
}

absl::StatusOr<int64_t> YamlMap::RequiredInt64(std::string_view key, IntRange range) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return Int64Of(*entry, range);
}

absl::StatusOr<int64_t> YamlMap::OptionalInt64(std::string_view key, int64_t default_value,
                                               IntRange range) const {
  const Entry* entry = Find(key);
  return entry ? Int64Of(*entry, range) : default_value;
}

absl::StatusOr<int64_t> YamlMap::RequiredBytes(std::string_view key, IntRange range) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return BytesOf(*entry, range);
}

absl::StatusOr<int64_t> YamlMap::OptionalBytes(std::string_view key, int64_t default_value,
                                               IntRange range) const {
  const Entry* entry = Find(key);
  return entry ? BytesOf(*entry, range) : default_value;
}

absl::StatusOr<double> YamlMap::RequiredDouble(std::string_view key, DoubleRange range) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return DoubleOf(*entry, range);
}

absl::StatusOr<double> YamlMap::OptionalDouble(std::string_view key, double default_value,
                                               DoubleRange range) const {
  const Entry* entry = Find(key);
  return entry ? DoubleOf(*entry, range) : default_value;
}

absl::StatusOr<bool> YamlMap::RequiredBool(std::string_view key) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return BoolOf(*entry);
}

absl::StatusOr<bool> YamlMap::OptionalBool(std::string_view key, bool default_value) const {
  const Entry* entry = Find(key);
  return entry ? BoolOf(*entry) : default_value;
}

absl::StatusOr<std::string> YamlMap::RequiredString(std::string_view key) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return ScalarOf(*entry, "a string");
}

absl::StatusOr<std::string> YamlMap::OptionalString(std::string_view key,
                                                    std::string default_value) const {
  const Entry* entry = Find(key);
  if (entry == nullptr) return default_value;
  return ScalarOf(*entry, "a string");
}

absl::StatusOr<size_t> YamlMap::RequiredChoice(std::string_view key,
                                               std::span<const std::string_view> allowed) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return ChoiceOf(*entry, allowed);
}

absl::StatusOr<std::vector<std::string>> YamlMap::RequiredStringList(
    std::string_view key, std::span<const std::string_view> allowed) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return StringListOf(*entry, allowed);
}

absl::StatusOr<std::vector<std::string>> YamlMap::OptionalStringList(
    std::string_view key, std::span<const std::string_view> allowed) const {
  const Entry* entry = Find(key);
  if (entry == nullptr) return std::vector<std::string>{};
  return StringListOf(*entry, allowed);
}

absl::StatusOr<YamlMap> YamlMap::RequiredMap(std::string_view key,
                                             std::vector<std::string_view> known_keys) const {
  ASSIGN_OR_RETURN(const Entry* entry, FindRequired(key));
  return OpenChild(*entry, std::move(known_keys));
}

absl::StatusOr<YamlMap> YamlMap::OptionalMap(std::string_view key,
                                             std::vector<std::string_view> known_keys) const {
  if (const Entry* entry = Find(key)) return OpenChild(*entry, std::move(known_keys));
  return YamlMap(source_, KeyPath(key), mark_, std::move(known_keys));
}

}  // namespace shardline::placement
