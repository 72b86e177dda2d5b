// Every name in a checkpoint folder, in one place (as leveldb's db/filename.h names every file of a
// database): step folders, rank files, the manifest and `latest`, and the listing of the steps a
// folder holds. docs/checkpoint-format.md draws the folder.
//
//   DIR/latest                          "step-00000200\n": the newest committed step
//   DIR/step-00000200/                  one step
//   DIR/step-00000200/rank-00003.safetensors
//   DIR/step-00000200/manifest.json     written last: its atomic rename commits the step
//   DIR/step-00000300.corrupt           a committed step that failed verification, set aside
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"

namespace shardline::checkpoint {

inline constexpr std::string_view kManifestFileName = "manifest.json";
inline constexpr std::string_view kLatestFileName = "latest";
// A single-file model (ours or Hugging Face's): what `export` writes and loaders accept.
inline constexpr std::string_view kModelFileName = "model.safetensors";
// A Hugging Face model folder's files: its config, and the index of a model saved in several
// safetensors files ({"weight_map": {tensor: file}}), which stands in for model.safetensors.
inline constexpr std::string_view kHfConfigFileName = "config.json";
inline constexpr std::string_view kHfIndexFileName = "model.safetensors.index.json";

// "step-00000042".
std::string StepDirName(int64_t step);
// 42 for "step-00000042" (any number of digits, at least one); nullopt for anything else, a
// set-aside "step-00000042.corrupt" included.
std::optional<int64_t> ParseStepDirName(std::string_view name);
// "rank-00003.safetensors".
std::string ShardFileName(int64_t rank);
// Whether `file` names something inside a step's folder: relative, and no ".." in it. A manifest
// names its files so; one that leaves the folder could not be found by a loader that copied the
// step elsewhere, and could point a writer anywhere.
bool IsNameInsideStepFolder(const std::string& file);

// DIR/step-NNNNNNNN and DIR/step-NNNNNNNN/manifest.json.
std::string StepDir(const std::string& dir, int64_t step);
std::string ManifestPath(const std::string& dir, int64_t step);

// One step folder of a checkpoint dir.
struct StepFolder {
  int64_t step = 0;
  std::string path;
  bool committed = false;  // it holds a manifest.json
};
// The step folders of `dir`, oldest first; empty when `dir` does not exist. Errors only when it
// exists and cannot be read.
absl::StatusOr<std::vector<StepFolder>> ListStepFolders(const std::string& dir);
// The committed steps of `dir`, oldest first.
absl::StatusOr<std::vector<int64_t>> CommittedSteps(const std::string& dir);

// The step `DIR/latest` names; nullopt when there is no such file. InvalidArgument, naming the
// file, when it holds something other than a step folder's name.
absl::StatusOr<std::optional<int64_t>> ReadLatest(const std::string& dir);
// Points DIR/latest at `step`, atomically and durably.
absl::Status SetLatest(FileSystem& fs, const std::string& dir, int64_t step);

// The checkpoint file that `path` names:
//   - a Hugging Face folder's config.json: the folder's model.safetensors, else its
//     model.safetensors.index.json;
//   - any other file: itself (a ".json" file is a step's manifest, or a Hugging Face index when
//     named like one; anything else a safetensors model);
//   - a step folder (it holds manifest.json): its manifest;
//   - a run's checkpoint dir: the manifest of the step its `latest` names;
//   - a folder holding model.safetensors (an export, a Hugging Face model): that file;
//   - a folder holding model.safetensors.index.json (a Hugging Face model in several files): that
//     index.
// NotFound saying what was looked for.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);
// Whether a path ResolveCheckpoint returned is a step's manifest (not a single model file, nor a
// Hugging Face index).
bool IsManifestPath(const std::string& path);
// Whether a path names a Hugging Face index of safetensors files ("*.safetensors.index.json").
bool IsHfIndexPath(const std::string& path);

}  // namespace shardline::checkpoint
