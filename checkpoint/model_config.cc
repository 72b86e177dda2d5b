#include "checkpoint/model_config.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/gpt2_hf_import.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {

absl::StatusOr<Gpt2Config> ReadCheckpointConfig(const std::string& path, int64_t hf_n_head) {
  ASSIGN_OR_RETURN(const std::string file, ResolveCheckpoint(path));
  if (IsManifestPath(file)) {
    ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(file));
    return Gpt2ConfigFromMetadata(manifest.metadata, absl::StrCat("sharded checkpoint ", file));
  }
  ASSIGN_OR_RETURN(const SafetensorsReader reader, SafetensorsReader::Open(file));
  if (IsHuggingFaceGpt2File(reader)) return ReadHfGpt2Config(file, hf_n_head);
  return Gpt2ConfigFromMetadata(reader.metadata(), absl::StrCat("checkpoint ", file));
}

}  // namespace shardline::checkpoint
