#include "coordinator/checkpoint_commit.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace shardline::coordinator {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// worker/checkpoint/manifest.cc's kManifestVersion: the loader refuses any other.
constexpr int kManifestVersion = 1;

// The dtype names of the safetensors format (docs/checkpoint-format.md).
constexpr std::string_view kDTypes[] = {"BOOL", "U8",  "I8",  "U16",     "I16",
                                        "U32",  "I32", "U64", "I64",     "F16",
                                        "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

// The number of elements, or nullopt when it does not fit in 63 bits.
std::optional<uint64_t> Volume(const std::vector<int64_t>& shape) {
  uint64_t volume = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && volume > (uint64_t{1} << 62) / static_cast<uint64_t>(d)) return std::nullopt;
    volume *= static_cast<uint64_t>(d);
  }
  return volume;
}

bool SameBox(const SavedTensorRecord& a, const SavedTensorRecord& b) {
  return a.offsets == b.offsets && a.shape == b.shape;
}

bool Intersect(const SavedTensorRecord& a, const SavedTensorRecord& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.shape[d] <= b.offsets[d] || b.offsets[d] + b.shape[d] <= a.offsets[d]) {
      return false;
    }
  }
  return true;
}

absl::Status Errno(const std::string& path, std::string_view what) {
  return absl::InternalError(
      absl::StrCat("writing ", path, ": ", std::string(what), ": ", std::strerror(errno)));
}

}  // namespace

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

absl::Status CheckSavedShard(const SavedShardRecord& shard, const PendingCheckpoint& pending) {
  const std::string where = absl::StrCat("rank ", shard.rank, "'s shard ", shard.file);
  const auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  const fs::path file(shard.file);
  // A rank whose every box another rank holds (a data-parallel or tensor-parallel replica)
  // writes no file; it still reports, so that the step's commit knows it is done.
  if (shard.file.empty()) {
    if (shard.tensors.empty()) return absl::OkStatus();
    return error("tensors listed without a file name");
  }
  // The manifest names the file relative to its folder; one that leaves it could not be found
  // by a loader that copied the step's folder elsewhere.
  if (file.is_absolute())
    return error("the file must be relative to the step's folder " + shard.dir);
  for (const auto& part : file.lexically_normal()) {
    if (part == "..") return error("the file leaves the step's folder " + shard.dir);
  }
  std::set<std::string> names;
  for (const SavedTensorRecord& tensor : shard.tensors) {
    const auto tensor_error = [&](const std::string& what) {
      return error(absl::StrCat("tensor '", tensor.name, "': ", what));
    };
    if (tensor.name.empty()) return error("a tensor without a name");
    if (!names.insert(tensor.name).second) return tensor_error("listed twice");
    if (std::find(std::begin(kDTypes), std::end(kDTypes), tensor.dtype) == std::end(kDTypes)) {
      return tensor_error("unknown dtype \"" + tensor.dtype + "\"");
    }
    if (!Volume(tensor.global_shape)) {
      return tensor_error("invalid global shape " + ShapeString(tensor.global_shape));
    }
    if (tensor.offsets.size() != tensor.global_shape.size() ||
        tensor.shape.size() != tensor.global_shape.size()) {
      return tensor_error(
          "offsets " + ShapeString(tensor.offsets) + " and shape " + ShapeString(tensor.shape) +
          " do not match the rank of the global shape " + ShapeString(tensor.global_shape));
    }
    for (size_t d = 0; d < tensor.offsets.size(); ++d) {
      // Every value is below 2^62 (the wire's UInt64s are checked on arrival), so the sum
      // cannot overflow.
      if (tensor.offsets[d] < 0 || tensor.shape[d] < 0 ||
          tensor.offsets[d] + tensor.shape[d] > tensor.global_shape[d]) {
        return tensor_error("the box at " + ShapeString(tensor.offsets) + " of shape " +
                            ShapeString(tensor.shape) + " does not fit in the global shape " +
                            ShapeString(tensor.global_shape));
      }
    }
    const auto known = pending.tensors.find(tensor.name);
    if (known != pending.tensors.end() && (known->second.global_shape != tensor.global_shape ||
                                           known->second.dtype != tensor.dtype)) {
      return tensor_error(absl::StrCat("global shape ", ShapeString(tensor.global_shape), " ",
                                       tensor.dtype, " disagrees with rank ", known->second.rank,
                                       "'s ", ShapeString(known->second.global_shape), " ",
                                       known->second.dtype));
    }
  }
  return absl::OkStatus();
}

void AddSavedShard(SavedShardRecord shard, PendingCheckpoint& pending) {
  for (const SavedTensorRecord& tensor : shard.tensors) {
    pending.tensors.try_emplace(
        tensor.name, PendingCheckpoint::Known{shard.rank, tensor.dtype, tensor.global_shape});
  }
  const int rank = shard.rank;
  pending.shards.insert_or_assign(rank, std::move(shard));
}

std::map<std::string, std::string> ModelMetadata(const placement::ModelSpec& model) {
  const int64_t d_ff = model.d_ff > 0 ? model.d_ff : 4 * model.d_model;
  return {
      {"format", "shardline"},
      {"format_version", "1"},
      {"model", "gpt2"},
      {"n_layer", absl::StrCat(model.layers)},
      {"n_embd", absl::StrCat(model.d_model)},
      {"n_head", absl::StrCat(model.heads)},
      {"d_ff", absl::StrCat(d_ff)},
      {"vocab_size", absl::StrCat(model.vocab)},
      {"n_positions", absl::StrCat(model.max_seq_len)},
      {"tied_embeddings", model.tied_embeddings ? "true" : "false"},
  };
}

absl::StatusOr<std::string> BuildManifestJson(int64_t step, int64_t world_size,
                                              const std::map<std::string, std::string>& metadata,
                                              const PendingCheckpoint& pending) {
  // The pieces of every global tensor, in rank order.
  struct Piece {
    int rank;
    const SavedShardRecord* shard;
    const SavedTensorRecord* tensor;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (const auto& [rank, shard] : pending.shards) {
    for (const SavedTensorRecord& tensor : shard.tensors) {
      pieces[tensor.name].push_back({rank, &shard, &tensor});
    }
  }
  Json tensors = Json::object();
  for (const auto& [name, list] : pieces) {
    const auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint step ", step, ": tensor '", name, "': ", what));
    };
    const SavedTensorRecord& first = *list.front().tensor;
    const uint64_t volume = *Volume(first.global_shape);  // checked on arrival
    // Identical boxes are replicas (data-parallel copies); only distinct boxes must tile the
    // tensor, so the pairwise check runs over those, not over every rank.
    std::vector<const SavedTensorRecord*> distinct;
    uint64_t covered = 0;
    Json list_json = Json::array();
    for (const Piece& piece : list) {
      const SavedTensorRecord& box = *piece.tensor;
      list_json.push_back({{"rank", piece.rank},
                           {"file", piece.shard->file},
                           {"tensor", box.name},
                           {"offsets", box.offsets},
                           {"shape", box.shape}});
      bool replica = false;
      for (const SavedTensorRecord* other : distinct) {
        if (SameBox(box, *other)) {
          replica = true;
          break;
        }
        if (Intersect(box, *other) && *Volume(box.shape) > 0 && *Volume(other->shape) > 0) {
          return error(absl::StrCat(
              "rank ", piece.rank, "'s box at ", ShapeString(box.offsets), " of shape ",
              ShapeString(box.shape), " partly overlaps another rank's box at ",
              ShapeString(other->offsets), " of shape ", ShapeString(other->shape)));
        }
      }
      if (replica) continue;
      distinct.push_back(&box);
      covered += *Volume(box.shape);
    }
    // Disjoint boxes inside the tensor cover it exactly when their volumes add up to it.
    if (covered != volume) {
      return error(absl::StrCat("the shards of all ", world_size, " ranks cover ", covered,
                                " of its ", volume, " elements (global shape ",
                                ShapeString(first.global_shape), ")"));
    }
    tensors[name] = {
        {"dtype", first.dtype}, {"global_shape", first.global_shape}, {"shards", list_json}};
  }
  // Key for key worker/checkpoint/manifest.cc's ManifestToJson, including its indentation.
  const Json json = {{"version", kManifestVersion},
                     {"step", step},
                     {"world_size", world_size},
                     {"metadata", metadata},
                     {"tensors", tensors}};
  return json.dump(1) + "\n";
}

absl::Status CommitCheckpoint(const std::string& checkpoint_dir, int64_t step,
                              const std::string& manifest_json, bool update_latest) {
  const fs::path step_dir = fs::path(checkpoint_dir) / StepDirName(step);
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) {
    return absl::FailedPreconditionError("checkpoint step " + std::to_string(step) + ": " +
                                         step_dir.string() +
                                         " is not a directory (the ranks said they saved there)");
  }
  // The manifest first: `latest` must never name a step without one.
  RETURN_IF_ERROR(WriteFileAtomically((step_dir / "manifest.json").string(), manifest_json));
  if (update_latest) {
    RETURN_IF_ERROR(WriteFileAtomically((fs::path(checkpoint_dir) / "latest").string(),
                                        StepDirName(step) + "\n"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view content) {
  // The pid keeps two processes writing the same path from sharing a temporary.
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(path, "open " + temp);
  const auto fail = [&](std::string_view what) {
    absl::Status status = Errno(path, what);
    ::close(fd);
    ::unlink(temp.c_str());
    return status;
  };
  for (size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    absl::Status status = Errno(path, "close");
    ::unlink(temp.c_str());
    return status;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = Errno(path, "rename");
    ::unlink(temp.c_str());
    return status;
  }
  // The rename is durable only once the directory entry is.
  const fs::path parent = fs::path(path).parent_path();
  const std::string directory = parent.empty() ? std::string(".") : parent.string();
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno(path, "open directory " + directory);
  const int synced = ::fsync(dir_fd);
  ::close(dir_fd);
  if (synced != 0) return Errno(path, "fsync directory");
  return absl::OkStatus();
}

}  // namespace shardline::coordinator
