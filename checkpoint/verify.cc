#include "checkpoint/verify.h"

#include <charconv>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/safetensors_reader.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;

// Names the first piece of `file` whose bytes no longer hash to the manifest's checksum.
std::string FindChangedTensor(const Manifest& manifest, const std::string& directory,
                              const std::string& file) {
  absl::StatusOr<SafetensorsReader> reader =
      SafetensorsReader::Open((stdfs::path(directory) / file).string());
  if (!reader.ok()) return absl::StrCat("its header no longer reads: ", reader.status().message());
  for (const auto& [name, tensor] : manifest.tensors) {
    for (const ShardSlice& slice : tensor.shards) {
      if (slice.file != file) continue;
      const TensorInfo* info = reader->Find(slice.tensor);
      if (info == nullptr) return absl::StrCat("tensor '", name, "' is gone from it");
      if (Xxh3Of(reader->Data(*info)) != slice.xxh3) {
        return absl::StrCat("the bytes of tensor '", name, "' changed");
      }
    }
  }
  return "the header changed";
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
  ASSIGN_OR_RETURN(const Gpt2Config config, Gpt2ConfigFromMetadata(manifest.metadata, where));
  const bool with_optimizer =
      manifest.tensors.contains(StateTensorName(StateKind::kExpAvg, "wte"));
  std::map<std::string, std::vector<int64_t>> expected;
  for (const Gpt2TensorSpec& spec : Gpt2TensorSpecs(config)) {
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
    if (!expected.contains(name) && LooksLikeGpt2Parameter(state.param)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", name, "' is not ",
          state.kind == StateKind::kParam ? "a parameter" : "the state of a parameter",
          " of the config in the metadata (n_layer, tied_embeddings)"));
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyStep(const std::string& manifest_path, VerifyDepth depth) {
  ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(manifest_path));
  const std::string where = absl::StrCat("checkpoint step ", manifest.step);
  RETURN_IF_ERROR(CheckModelTensors(manifest, absl::StrCat(where, " (", manifest_path, ")")));
  const std::string directory = stdfs::path(manifest_path).parent_path().string();
  for (const auto& [name, file] : manifest.files) {
    const std::string path = (stdfs::path(directory) / name).string();
    const std::string which = absl::StrCat(where, ": rank ", file.rank, "'s file ", path);
    std::error_code ec;
    const uintmax_t size = stdfs::file_size(path, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(which, " is missing (", ec.message(), ")"));
    if (size != file.bytes) {
      return absl::DataLossError(absl::StrCat(which, " has ", size, " bytes, the manifest says ",
                                              file.bytes,
                                              size < file.bytes ? " (truncated)" : ""));
    }
    if (depth == VerifyDepth::kSizes) continue;
    absl::StatusOr<FileDigest> digest = DigestFile(path);
    if (!digest.ok()) return Annotate(digest.status(), which);
    if (digest->xxh3 != file.xxh3) {
      return absl::DataLossError(absl::StrCat(which, " fails its checksum (",
                                              ChecksumHex(digest->xxh3), ", the manifest says ",
                                              ChecksumHex(file.xxh3), "): ",
                                              FindChangedTensor(manifest, directory, name)));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardline::checkpoint
