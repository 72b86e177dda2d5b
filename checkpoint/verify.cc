#include "checkpoint/verify.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_reader.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

// Hashes every tensor of one rank file and its header region: DataLoss naming the first tensor
// whose bytes no longer hash to the manifest's checksum, or the header when every tensor does but
// the file's checksum (FileChecksum) does not.
absl::Status CheckFileContents(const Manifest& manifest, const std::string& path,
                               const std::string& name, const std::string& which) {
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  if (!reader.ok()) {
    return absl::DataLossError(absl::StrCat(which, ": its header no longer reads: ",
                                            reader.status().message()));
  }
  std::map<std::string, std::pair<std::string, uint64_t>> expected;  // in-file name → tensor
  for (const auto& [tensor_name, tensor] : manifest.tensors) {
    for (const ShardSlice& slice : tensor.shards) {
      if (slice.file == name) expected[slice.tensor] = {tensor_name, slice.xxh3};
    }
  }
  std::vector<const TensorInfo*> order;
  for (const auto& [stored, info] : reader->tensors()) order.push_back(&info);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  std::vector<uint64_t> checksums;
  for (const TensorInfo* info : order) {
    checksums.push_back(Xxh3Of(reader->Data(*info)));
    const auto want = expected.find(info->name);
    if (want != expected.end() && want->second.second != checksums.back()) {
      return absl::DataLossError(absl::StrCat(which, " fails its checksum: the bytes of tensor '",
                                              want->second.first, "' changed"));
    }
  }
  for (const auto& [stored, tensor] : expected) {
    if (reader->Find(stored) == nullptr) {
      return absl::DataLossError(
          absl::StrCat(which, " fails its checksum: tensor '", tensor.first, "' is gone from it"));
    }
  }
  const uint64_t file = FileChecksum(reader->HeaderRegion(), checksums);
  if (file != manifest.files.at(name).xxh3) {
    return absl::DataLossError(absl::StrCat(which, " fails its checksum (",
                                            ChecksumHex(file), ", the manifest says ",
                                            ChecksumHex(manifest.files.at(name).xxh3),
                                            "): its header changed"));
  }
  return absl::OkStatus();
}

}  // namespace

bool LooksLikeGpt2Parameter(const std::string& name) {
  static constexpr const char* kOuter[] = {"wte", "wpe", "lnf.w", "lnf.b", "lm_head.w"};
  for (const char* outer : kOuter) {
    if (name == outer) return true;
  }
  if (!name.starts_with("h.")) return false;
  int64_t layer = 0;
  const char* begin = name.data() + 2;
  const char* end = name.data() + name.size();
  const auto [rest, error] = std::from_chars(begin, end, layer);
  if (error != std::errc() || rest == begin || rest == end || *rest != '.') return false;
  static constexpr const char* kBlock[] = {"ln1.w",       "ln1.b",       "qkv.w",     "qkv.b",
                                           "attn_proj.w", "attn_proj.b", "ln2.w",     "ln2.b",
                                           "fc.w",        "fc.b",        "fc_proj.w", "fc_proj.b"};
  const std::string_view suffix(rest + 1, end);
  for (const char* block : kBlock) {
    if (suffix == block) return true;
  }
  return false;
}

absl::Status CheckModelTensors(const Manifest& manifest, const std::string& where) {
  ASSIGN_OR_RETURN(const model::ModelConfig config,
                   ModelConfigFromMetadata(manifest.metadata, where));
  const bool with_optimizer =
      manifest.tensors.contains(StateTensorName(StateKind::kExpAvg, "wte"));
  std::map<std::string, std::vector<int64_t>> expected;
  for (const model::TensorRow& spec : model::ModelRows(config)) {
    expected[spec.name] = spec.sharded_shape;
    if (!with_optimizer) continue;
    for (const StateKind kind : {StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      expected[StateTensorName(kind, spec.name)] = spec.sharded_shape;
    }
  }
  for (const auto& [name, shape] : expected) {
    const auto it = manifest.tensors.find(name);
    if (it == manifest.tensors.end()) {
      return absl::NotFoundError(absl::StrCat(
          where, ": tensor '", name, "' is missing (the config in the metadata has it",
          ParseStateTensorName(name).kind == StateKind::kParam
              ? ")"
              : ", and the checkpoint holds optimizer state for other parameters)"));
    }
    if (it->second.global_shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", name, "' has global shape ",
          ShapeString(it->second.global_shape), ", expected ", ShapeString(shape),
          name.ends_with("qkv.w") || name.ends_with("qkv.b")
              ? " (checkpoints store the fused QKV as (3, C, C) and (3, C))"
              : " for the config in the metadata"));
    }
  }
  for (const auto& [name, tensor] : manifest.tensors) {
    const StateTensor state = ParseStateTensorName(name);
    // A data-parallel strategy's state (DiLoCo's, error feedback) is checked by the run that
    // loads it, against its own plan.
    if (IsStrategyState(state.kind)) continue;
    if (!expected.contains(name) && LooksLikeGpt2Parameter(state.param)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", name, "' is not ",
          state.kind == StateKind::kParam ? "a parameter" : "the state of a parameter",
          " of the config in the metadata (n_layer, tied_embeddings)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFileSize(const std::string& path, uint64_t expected, const std::string& which) {
  std::error_code ec;
  const uintmax_t size = stdfs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(which, " is missing (", ec.message(), ")"));
  if (size == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(which, " has ", size, " bytes, the manifest says ",
                                          expected, size < expected ? " (truncated)" : ""));
}

absl::Status VerifyStep(const std::string& manifest_path, VerifyDepth depth) {
  return ReadVerifiedStep(manifest_path, depth).status();
}

absl::StatusOr<Manifest> ReadVerifiedStep(const std::string& manifest_path, VerifyDepth depth) {
  ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(manifest_path));
  const std::string where = absl::StrCat("checkpoint step ", manifest.step);
  RETURN_IF_ERROR(CheckModelTensors(manifest, absl::StrCat(where, " (", manifest_path, ")")));
  const std::string directory = stdfs::path(manifest_path).parent_path().string();
  for (const auto& [name, file] : manifest.files) {
    const std::string path = (stdfs::path(directory) / name).string();
    const std::string which = absl::StrCat(where, ": rank ", file.rank, "'s file ", path);
    RETURN_IF_ERROR(CheckFileSize(path, file.bytes, which));
    if (depth == VerifyDepth::kSizes) continue;
    RETURN_IF_ERROR(CheckFileContents(manifest, path, name, which));
  }
  return manifest;
}

}  // namespace shardline::checkpoint
