// Checking a committed step before anything trusts it: that its manifest describes the whole model
// (and, if any, the whole optimizer state), and that its files are on disk whole and unchanged —
// what `shardline checkpoint inspect --verify` reports and what `resume: latest` relies on to
// fall back past a damaged step.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "checkpoint/manifest.h"

namespace shardline::checkpoint {

// OK when the manifest holds every parameter of the GPT-2 config in its metadata with its global
// shape (model::TensorRow::sharded_shape), both AdamW moments of every parameter or of none, and no
// tensor named like a parameter the config lacks (a writer that forgot tied_embeddings=false, or a
// wrong n_layer). NotFound / InvalidArgument prefixed by `where`, naming the tensor.
absl::Status CheckModelTensors(const Manifest& manifest, const std::string& where);

// Whether `name` has the form of one of our GPT parameters of some config ("wte", "h.3.fc.w").
bool LooksLikeGpt2Parameter(const std::string& name);

// That the rank file at `path` has the size its writer reported: NotFound when it is missing,
// DataLoss when it has another size (saying "truncated" when shorter); both prefixed by `which`.
absl::Status CheckFileSize(const std::string& path, uint64_t expected, const std::string& which);

// kChecksums first: a value-initialised depth is the thorough one.
enum class VerifyDepth {
  kChecksums,  // every file is there with its size, and its bytes hash to the manifest's
               // checksums: catches any changed byte
  kSizes,      // only the sizes: catches missing and truncated shards
};

// Checks the committed step whose manifest is at `manifest_path`: the manifest parses and
// validates (ReadManifest), CheckModelTensors holds, and every file it lists passes `depth`.
// Errors name the step and the file and, for a changed byte, the tensor whose bytes changed
// (found by hashing that file's pieces): InvalidArgument for a bad manifest, NotFound for a missing
// file, DataLoss for a file of the wrong size or content.
absl::Status VerifyStep(const std::string& manifest_path,
                        VerifyDepth depth = VerifyDepth::kChecksums);
// The same, handing out the manifest it verified (for callers that go on to use it).
absl::StatusOr<Manifest> ReadVerifiedStep(const std::string& manifest_path,
                                          VerifyDepth depth = VerifyDepth::kChecksums);

}  // namespace shardline::checkpoint
