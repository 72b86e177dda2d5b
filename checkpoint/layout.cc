#include "checkpoint/layout.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

constexpr std::string_view kStepPrefix = "step-";

}  // namespace

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  const std::string_view digits = name.substr(kStepPrefix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return std::nullopt;
  }
  int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::string ShardFileName(int64_t rank) {
  char name[48];
  std::snprintf(name, sizeof(name), "rank-%05lld.safetensors", static_cast<long long>(rank));
  return name;
}

bool IsNameInsideStepFolder(const std::string& file) {
  const stdfs::path path(file);
  if (file.empty() || path.is_absolute()) return false;
  for (const auto& part : path.lexically_normal()) {
    if (part == "..") return false;
  }
  return true;
}

std::string StepDir(const std::string& dir, int64_t step) {
  return (stdfs::path(dir) / StepDirName(step)).string();
}

std::string ManifestPath(const std::string& dir, int64_t step) {
  return (stdfs::path(dir) / StepDirName(step) / kManifestFileName).string();
}

absl::StatusOr<std::vector<StepFolder>> ListStepFolders(const std::string& dir) {
  std::vector<StepFolder> folders;
  std::error_code ec;
  if (!stdfs::is_directory(dir, ec)) return folders;
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int64_t> step = ParseStepDirName(it->path().filename().string());
    if (!step || !it->is_directory(ec)) continue;
    StepFolder folder;
    folder.step = *step;
    folder.path = it->path().string();
    folder.committed = stdfs::is_regular_file(it->path() / kManifestFileName, ec);
    folders.push_back(std::move(folder));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(folders.begin(), folders.end(),
            [](const StepFolder& a, const StepFolder& b) { return a.step < b.step; });
  return folders;
}

absl::StatusOr<std::vector<int64_t>> CommittedSteps(const std::string& dir) {
  absl::StatusOr<std::vector<StepFolder>> folders = ListStepFolders(dir);
  if (!folders.ok()) return folders.status();
  std::vector<int64_t> steps;
  for (const StepFolder& folder : *folders) {
    if (folder.committed) steps.push_back(folder.step);
  }
  return steps;
}

absl::StatusOr<std::optional<int64_t>> ReadLatest(const std::string& dir) {
  const stdfs::path path = stdfs::path(dir) / kLatestFileName;
  std::error_code ec;
  if (!stdfs::is_regular_file(path, ec)) return std::optional<int64_t>();
  std::ifstream in(path);
  std::string name;
  std::getline(in, name);
  // Tolerate a hand-edited file's trailing blanks or CR.
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  const std::optional<int64_t> step = ParseStepDirName(name);
  if (!step) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), " holds \"", name, "\", not the name of a step folder (step-NNNNNNNN)"));
  }
  return step;
}

absl::Status SetLatest(FileSystem& fs, const std::string& dir, int64_t step) {
  return WriteFileAtomically(fs, (stdfs::path(dir) / kLatestFileName).string(),
                             StepDirName(step) + "\n");
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  const stdfs::path p(path);
  std::error_code ec;
  if (stdfs::is_regular_file(p, ec)) {
    if (p.filename().string() != kHfConfigFileName) return path;
    // A Hugging Face folder named by its config: the weights beside it.
    for (const std::string_view name : {kModelFileName, kHfIndexFileName}) {
      const stdfs::path weights = p.parent_path() / name;
      if (stdfs::is_regular_file(weights, ec)) return weights.string();
    }
    return absl::NotFoundError(
        absl::StrCat("no checkpoint at ", path, ": its folder holds neither ",
                     std::string(kModelFileName), " nor ", std::string(kHfIndexFileName)));
  }
  if (!stdfs::is_directory(p, ec)) return absl::NotFoundError("no checkpoint at " + path);
  if (stdfs::is_regular_file(p / kManifestFileName, ec)) return (p / kManifestFileName).string();
  absl::StatusOr<std::optional<int64_t>> latest = ReadLatest(path);
  if (!latest.ok()) return latest.status();
  if (latest->has_value()) {
    const std::string manifest = ManifestPath(path, **latest);
    if (stdfs::is_regular_file(manifest, ec)) return manifest;
    return absl::NotFoundError(absl::StrCat(path, "/latest names ", StepDirName(**latest),
                                            ", which holds no manifest.json"));
  }
  if (stdfs::is_regular_file(p / kModelFileName, ec)) return (p / kModelFileName).string();
  if (stdfs::is_regular_file(p / kHfIndexFileName, ec)) return (p / kHfIndexFileName).string();
  return absl::NotFoundError(absl::StrCat(path, " holds neither a 'latest' file, manifest.json, ",
                                          std::string(kModelFileName), " nor ",
                                          std::string(kHfIndexFileName)));
}

bool IsManifestPath(const std::string& path) {
  return stdfs::path(path).extension() == ".json" && !IsHfIndexPath(path);
}

bool IsHfIndexPath(const std::string& path) {
  return stdfs::path(path).filename().string().ends_with(".safetensors.index.json");
}

}  // namespace shardline::checkpoint
