#include "checkpoint/commit.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

absl::Status CheckShardAlone(const SavedShard& shard) {
  const std::string where = absl::StrCat("rank ", shard.rank, "'s shard ", shard.file);
  const auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  if (shard.rank < 0) return error("a negative rank");
  if (shard.file.empty()) {
    if (shard.pieces.empty()) return absl::OkStatus();
    return error("pieces listed without a file name");
  }
  if (!IsNameInsideStepFolder(shard.file)) {
    return error("the file must be a name inside the step's folder");
  }
  std::set<std::string> in_file;
  for (const SavedPiece& piece : shard.pieces) {
    const auto piece_error = [&](const std::string& what) {
      return error(absl::StrCat("tensor '", piece.name, "': ", what));
    };
    if (piece.name.empty() || piece.tensor.empty()) return error("a piece without a name");
    if (!in_file.insert(piece.tensor).second) {
      return piece_error(absl::StrCat("the file name '", piece.tensor, "' is listed twice"));
    }
    if (!NumElements(piece.global_shape)) {
      return piece_error("invalid global shape " + ShapeString(piece.global_shape));
    }
    if (piece.offsets.size() != piece.global_shape.size() ||
        piece.shape.size() != piece.global_shape.size()) {
      return piece_error("offsets " + ShapeString(piece.offsets) + " and shape " +
                         ShapeString(piece.shape) + " do not match the rank of the global shape " +
                         ShapeString(piece.global_shape));
    }
    for (size_t d = 0; d < piece.offsets.size(); ++d) {
      if (piece.offsets[d] < 0 || piece.shape[d] < 0 ||
          piece.offsets[d] > piece.global_shape[d] ||
          piece.shape[d] > piece.global_shape[d] - piece.offsets[d]) {
        return piece_error("the box at " + ShapeString(piece.offsets) + " of shape " +
                           ShapeString(piece.shape) + " does not fit in the global shape " +
                           ShapeString(piece.global_shape));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StepAssembly::Add(SavedShard shard) {
  if (shards_.contains(shard.rank)) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", shard.rank, " already reported its shard of this step"));
  }
  RETURN_IF_ERROR(CheckShardAlone(shard));
  std::map<std::string, Known> first_seen;  // tensors this shard is the first to report
  for (const SavedPiece& piece : shard.pieces) {
    auto known = known_.find(piece.name);
    if (known == known_.end()) {
      known = first_seen.find(piece.name);
      if (known == first_seen.end()) {
        first_seen.emplace(piece.name, Known{shard.rank, piece.dtype, piece.global_shape});
        continue;
      }
    }
    if (known->second.global_shape != piece.global_shape || known->second.dtype != piece.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", shard.rank, "'s shard ", shard.file, ": tensor '", piece.name,
          "': global shape ", ShapeString(piece.global_shape), " ", DTypeName(piece.dtype),
          " disagrees with rank ", known->second.rank, "'s ",
          ShapeString(known->second.global_shape), " ", DTypeName(known->second.dtype)));
    }
  }
  known_.merge(first_seen);
  const int64_t rank = shard.rank;
  shards_.emplace(rank, std::move(shard));
  return absl::OkStatus();
}

absl::StatusOr<Manifest> StepAssembly::Build(const StepHeader& header) const {
  Manifest manifest;
  manifest.step = header.step;
  manifest.world_size = header.world_size;
  manifest.metadata = header.metadata;
  manifest.train = header.train;
  manifest.plan = header.plan;
  for (const auto& [rank, shard] : shards_) {
    if (shard.file.empty()) continue;
    manifest.files[shard.file] = ShardFileInfo{rank, shard.bytes, shard.xxh3};
    for (const SavedPiece& piece : shard.pieces) {
      ManifestTensor& tensor = manifest.tensors[piece.name];
      tensor.dtype = piece.dtype;
      tensor.global_shape = piece.global_shape;
      tensor.shards.push_back(
          ShardSlice{rank, shard.file, piece.tensor, piece.offsets, piece.shape, piece.xxh3});
    }
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, absl::StrCat("of step ", header.step)));
  return manifest;
}

absl::Status CommitStep(FileSystem& fs, const std::string& dir, const Manifest& manifest) {
  const std::string step_dir = StepDir(dir, manifest.step);
  for (const auto& [name, file] : manifest.files) {
    const stdfs::path path = stdfs::path(step_dir) / name;
    std::error_code ec;
    const uintmax_t size = stdfs::file_size(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint step ", manifest.step, ": rank ", file.rank, "'s file ", path.string(),
          " is not there (", ec.message(), "), though the rank reported it saved"));
    }
    if (size != file.bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint step ", manifest.step, ": rank ", file.rank, "'s file ",
                       path.string(), " has ", size, " bytes, the rank reported ", file.bytes));
    }
  }
  // The manifest first: `latest` must never name a step without one.
  RETURN_IF_ERROR(WriteManifest(fs, ManifestPath(dir, manifest.step), manifest));
  ASSIGN_OR_RETURN(const std::vector<int64_t> committed, CommittedSteps(dir));
  if (!committed.empty() && committed.back() > manifest.step) return absl::OkStatus();
  return SetLatest(fs, dir, manifest.step);
}

absl::StatusOr<std::vector<std::string>> ApplyRetention(FileSystem& fs, const std::string& dir,
                                                        int64_t keep,
                                                        std::span<const int64_t> protect) {
  ASSIGN_OR_RETURN(const std::vector<StepFolder> folders, ListStepFolders(dir));
  std::vector<int64_t> committed;
  for (const StepFolder& folder : folders) {
    if (folder.committed) committed.push_back(folder.step);
  }
  std::vector<std::string> removed;
  if (committed.empty()) return removed;
  const int64_t newest = committed.back();
  std::set<int64_t> kept(protect.begin(), protect.end());
  if (keep <= 0) {
    kept.insert(committed.begin(), committed.end());
  } else {
    const size_t from = committed.size() > static_cast<size_t>(keep)
                            ? committed.size() - static_cast<size_t>(keep)
                            : 0;
    kept.insert(committed.begin() + static_cast<std::ptrdiff_t>(from), committed.end());
  }
  // A `latest` whose writer died before its rename (a kill -9 of the coordinator) leaves its
  // temporary, named for the writer's pid (file_system.cc); a live writer's is not ours to take.
  std::error_code ec;
  const std::string temp_prefix = std::string(kLatestFileName) + ".tmp.";
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(temp_prefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(temp_prefix.size()), &pid) || pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    RETURN_IF_ERROR(fs.RemoveAll(it->path().string()));
    removed.push_back(it->path().string());
  }
  for (const StepFolder& folder : folders) {
    const bool obsolete = folder.committed ? !kept.contains(folder.step) : folder.step < newest;
    if (!obsolete) continue;
    // The manifest first: a crash halfway leaves an uncommitted folder, never a committed step
    // with files missing.
    if (folder.committed) RETURN_IF_ERROR(fs.RemoveAll(ManifestPath(dir, folder.step)));
    RETURN_IF_ERROR(fs.RemoveAll(folder.path));
    removed.push_back(folder.path);
  }
  return removed;
}

}  // namespace shardline::checkpoint
