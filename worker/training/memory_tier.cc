#include "worker/training/memory_tier.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_system.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"

namespace shardline::training {
namespace {

// Gloo moves counts of elements: a file goes as its size, then its bytes padded to 8, in pieces
// of at most 256 MiB (far from any count limit, and a bounded buffer per operation).
constexpr size_t kChunkWords = size_t{32} << 20;

absl::Status SendFile(comm::Communicator& comm, int peer, std::span<const std::byte> bytes) {
  int64_t size = static_cast<int64_t>(bytes.size());
  RETURN_IF_ERROR(comm.Send(&size, 1, DType::kInt64, peer));
  // The whole words straight from the file's bytes (mapped, or a vector: 8-byte aligned), the
  // tail padded.
  const size_t whole = bytes.size() / 8;
  std::vector<int64_t> copy;
  const int64_t* words = reinterpret_cast<const int64_t*>(bytes.data());
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(int64_t) != 0) {
    copy.resize(whole);
    std::memcpy(copy.data(), bytes.data(), whole * 8);
    words = copy.data();
  }
  for (size_t at = 0; at < whole; at += kChunkWords) {
    RETURN_IF_ERROR(comm.Send(words + at, std::min(kChunkWords, whole - at), DType::kInt64, peer));
  }
  if (bytes.size() % 8 != 0) {
    int64_t tail = 0;
    std::memcpy(&tail, bytes.data() + whole * 8, bytes.size() % 8);
    RETURN_IF_ERROR(comm.Send(&tail, 1, DType::kInt64, peer));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::byte>> RecvFile(comm::Communicator& comm, int peer) {
  int64_t size = 0;
  RETURN_IF_ERROR(comm.Recv(&size, 1, DType::kInt64, peer));
  if (size < 0 || size > (int64_t{1} << 46)) {
    return absl::DataLossError(
        absl::StrCat("rank ", peer, " announced a file of ", size, " bytes"));
  }
  std::vector<int64_t> words((static_cast<size_t>(size) + 7) / 8);
  const size_t whole = static_cast<size_t>(size) / 8;
  for (size_t at = 0; at < whole; at += kChunkWords) {
    RETURN_IF_ERROR(
        comm.Recv(words.data() + at, std::min(kChunkWords, whole - at), DType::kInt64, peer));
  }
  if (words.size() > whole) RETURN_IF_ERROR(comm.Recv(&words[whole], 1, DType::kInt64, peer));
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

absl::StatusOr<std::vector<std::byte>> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(path + ": cannot open");
  const std::streamoff size = in.tellg();
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    return absl::DataLossError(path + ": short read");
  }
  return bytes;
}

absl::Status WriteWholeFile(const std::string& path, std::span<const std::byte> bytes) {
  checkpoint::FileSystem& fs = checkpoint::DefaultFileSystem();
  RETURN_IF_ERROR(fs.CreateDirectories(std::filesystem::path(path).parent_path().string()));
  const std::span<const std::byte> parts[] = {bytes};
  return checkpoint::WriteFileAtomically(fs, path, parts);
}

bool Overlaps(const std::vector<int64_t>& a_offsets, const std::vector<int64_t>& a_shape,
              const std::vector<int64_t>& b_offsets, const std::vector<int64_t>& b_shape) {
  if (a_offsets.size() != b_offsets.size()) return false;
  for (size_t d = 0; d < a_offsets.size(); ++d) {
    if (a_offsets[d] >= b_offsets[d] + b_shape[d] || b_offsets[d] >= a_offsets[d] + a_shape[d]) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> MemoryStepDir(const MemoryTierOptions& options, int64_t step) {
  ASSIGN_OR_RETURN(
      const std::string generation,
      checkpoint::MemoryGenerationDir(options.store, options.job_id, options.generation));
  return checkpoint::StepDir(generation, step);
}

absl::StatusOr<std::vector<uint32_t>> ExchangeReplicas(const MemoryTierOptions& options, int rank,
                                                       const std::string& dir,
                                                       const checkpoint::SavedShard& own,
                                                       std::span<const std::byte> own_bytes) {
  std::vector<uint32_t> received;
  if (options.buddies.empty()) return received;
  if (options.transfers == nullptr) {
    return absl::FailedPreconditionError("memory replicas need a transfer group");
  }
  comm::Communicator& comm = *options.transfers;
  // One pair at a time, in rank order on every rank: blocking sends and receives that all ranks
  // take in the same order cannot wait on each other in a cycle.
  for (size_t from = 0; from < options.buddies.size(); ++from) {
    const int to = static_cast<int>(options.buddies[from]);
    if (static_cast<int>(from) == rank) {
      RETURN_IF_ERROR(
          SendFile(comm, to, own.file.empty() ? std::span<const std::byte>() : own_bytes));
    } else if (to == rank) {
      ASSIGN_OR_RETURN(const std::vector<std::byte> bytes, RecvFile(comm, static_cast<int>(from)));
      // A rank that writes nothing (its boxes are another's) sends an empty file: nothing to hold.
      if (!bytes.empty()) {
        RETURN_IF_ERROR(WriteWholeFile(
            dir + "/" + checkpoint::ShardFileName(static_cast<int64_t>(from)), bytes));
      }
      received.push_back(static_cast<uint32_t>(from));
    }
  }
  return received;
}

void PruneMemorySteps(const MemoryTierOptions& options, int64_t keep_from,
                      std::map<int64_t, std::vector<std::string>>& received) {
  std::error_code error;
  for (auto it = received.begin(); it != received.end() && it->first < keep_from;) {
    for (const std::string& file : it->second) std::filesystem::remove(file, error);
    it = received.erase(it);
  }
  const absl::StatusOr<std::string> job = checkpoint::MemoryJobDir(options.store, options.job_id);
  const absl::StatusOr<std::string> mine =
      checkpoint::MemoryGenerationDir(options.store, options.job_id, options.generation);
  if (!job.ok() || !mine.ok()) return;
  for (const auto& generation : std::filesystem::directory_iterator(*job, error)) {
    std::error_code inner;
    const bool own_generation = generation.path() == std::filesystem::path(*mine);
    for (const auto& step : std::filesystem::directory_iterator(generation.path(), inner)) {
      const std::optional<int64_t> number =
          checkpoint::ParseStepDirName(step.path().filename().string());
      if (!number || *number >= keep_from) continue;
      // Another rank of this node may prune the same folder at once: whoever loses finds it
      // gone. This generation's folders go once their files have (rmdir fails while not empty).
      if (own_generation) {
        std::filesystem::remove(step.path(), inner);
      } else {
        std::filesystem::remove_all(step.path(), inner);
      }
    }
  }
}

absl::StatusOr<std::string> FetchMemoryStep(const MemoryTierOptions& options, int rank,
                                            const checkpoint::MemoryResume& resume,
                                            model::ShardedGpt& gpt) {
  const checkpoint::Manifest& manifest = resume.manifest;
  ASSIGN_OR_RETURN(
      const std::string generation_dir,
      checkpoint::MemoryGenerationDir(options.store, options.job_id, resume.generation));
  const std::string dir = checkpoint::StepDir(generation_dir, manifest.step);
  // The boxes this rank's load reads, recorded by a dry run of it (the real one follows), and
  // for each stored box they overlap one file holding it: this node's own copy when it has one
  // (identical replicas: data-parallel ranks' copies, tensor-parallel replicas), else the first.
  const auto here = [&](const std::string& file) {
    return std::filesystem::exists(dir + "/" + file);
  };
  std::set<std::string> wanted;
  RETURN_IF_ERROR(gpt.LoadState(
      [&](const std::string& name, const std::vector<int64_t>& offsets,
          const std::vector<int64_t>& shape) -> absl::StatusOr<std::vector<float>> {
        int64_t numel = 1;
        for (int64_t d : shape) numel *= d;
        if (auto tensor = manifest.tensors.find(name); tensor != manifest.tensors.end()) {
          const std::vector<checkpoint::ShardSlice>& slices = tensor->second.shards;
          for (size_t i = 0; i < slices.size(); ++i) {
            if (!Overlaps(offsets, shape, slices[i].offsets, slices[i].shape)) continue;
            const auto same_box = [&](const checkpoint::ShardSlice& other) {
              return other.offsets == slices[i].offsets && other.shape == slices[i].shape;
            };
            // Each set of replicas once, at its first.
            if (std::any_of(slices.begin(), slices.begin() + i, same_box)) continue;
            const bool held = std::any_of(slices.begin() + i, slices.end(), [&](const auto& s) {
              return same_box(s) && here(s.file);
            });
            if (!held) wanted.insert(slices[i].file);
          }
        }
        return std::vector<float>(static_cast<size_t>(numel), 0.0f);
      },
      /*with_moments=*/true,
      [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
        auto tensor = manifest.tensors.find(name);
        if (tensor == manifest.tensors.end()) return std::nullopt;
        return tensor->second.global_shape;
      }));
  // Which files each rank lacks: a flag per file of the manifest, in its order, gathered.
  std::vector<std::string> files;
  for (const auto& [file, info] : manifest.files) files.push_back(file);
  std::vector<int64_t> lacks(files.size(), 0);
  for (size_t f = 0; f < files.size(); ++f) lacks[f] = wanted.contains(files[f]);
  std::map<std::string, int64_t> provider;
  for (const checkpoint::MemoryResume::Source& source : resume.sources) {
    provider[source.file] = source.rank;
  }
  comm::Communicator* comm = options.transfers;
  const int world = comm != nullptr ? comm->size() : 1;
  std::vector<int64_t> all(lacks);
  if (comm != nullptr && !files.empty()) {
    all.assign(files.size() * static_cast<size_t>(world), 0);
    RETURN_IF_ERROR(comm->AllGather(lacks.data(), all.data(), files.size(), DType::kInt64));
  }
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& file = files[f];
    const int from = static_cast<int>(provider.at(file));
    std::vector<std::byte> held;  // the provider's copy, read once
    for (int to = 0; to < world; ++to) {
      if (all[static_cast<size_t>(to) * files.size() + f] == 0) continue;
      if (comm == nullptr || to == from) {
        return absl::NotFoundError(absl::StrCat(
            "memory step ", manifest.step, ": ", file, " is not in the memory store of rank ", to,
            "'s node (", dir, "), which the coordinator named to send it"));
      }
      if (rank == from) {
        if (held.empty()) {
          ASSIGN_OR_RETURN(held, ReadWholeFile(dir + "/" + file));
        }
        RETURN_IF_ERROR(SendFile(*comm, to, held));
      } else if (rank == to) {
        ASSIGN_OR_RETURN(const std::vector<std::byte> bytes, RecvFile(*comm, from));
        const uint64_t expected = manifest.files.at(file).bytes;
        if (bytes.size() != expected) {
          return absl::DataLossError(absl::StrCat("memory step ", manifest.step, ": rank ", from,
                                                  " sent ", file, " of ", bytes.size(),
                                                  " bytes; the manifest says ", expected));
        }
        RETURN_IF_ERROR(WriteWholeFile(dir + "/" + file, bytes));
      }
    }
  }
  // The manifest beside the files, each set of replicas listed with the files here first: the
  // reader takes the first of a set. Every rank of the node writes it, atomically; a rank's
  // manifest lists first what its own load needs, which another rank's may list second: one
  // file per rank.
  checkpoint::Manifest local = manifest;
  for (auto& [name, tensor] : local.tensors) {
    std::stable_partition(tensor.shards.begin(), tensor.shards.end(),
                          [&](const checkpoint::ShardSlice& slice) { return here(slice.file); });
  }
  const std::string path = dir + "/manifest-rank-" + std::to_string(rank) + ".json";
  RETURN_IF_ERROR(checkpoint::DefaultFileSystem().CreateDirectories(dir));
  RETURN_IF_ERROR(checkpoint::WriteManifest(checkpoint::DefaultFileSystem(), path, local));
  return path;
}

}  // namespace shardline::training
