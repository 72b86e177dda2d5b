// TrainSpec: what `shardline train SPEC.yaml` runs — the model, the data, the optimizer and the
// schedule — parsed and validated from YAML before any work starts. (Cluster training jobs
// reuse the model/data/optimizer sections when sharded execution lands.)
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace shardline::placement {

struct ModelSpec {
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;        // 0 in YAML: 4 · d_model
  int64_t vocab = 257;     // the byte tokenizer's 256 bytes + end-of-text
  int64_t max_seq_len = 0; // the position table's length
  bool tied_embeddings = true;
};

struct DataSpec {
  std::string path;               // a text file (relative to the spec's folder), or empty:
  uint64_t synthetic_seed = 1;    // the built-in synthetic corpus of this seed
  int64_t synthetic_bytes = 1 << 20;
};

struct OptimizerSpec {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // global-norm clipping; 0 turns it off
  int64_t warmup_steps = 0;  // linear warm-up, then constant
};

struct TrainSpec {
  std::string name;
  ModelSpec model;
  DataSpec data;
  OptimizerSpec optimizer;
  int64_t steps = 0;
  int64_t batch = 0;    // sequences per step
  int64_t seq_len = 0;  // ≤ model.max_seq_len
  uint64_t seed = 1;    // initialisation and data order
  std::string checkpoint_dir;        // relative to the working directory; empty: no checkpoints
  int64_t checkpoint_interval = 0;   // steps; 0: only at the end
  int64_t log_interval = 10;
};

// Every error is InvalidArgument "SOURCE:LINE:COL: PATH: message" (see yaml_reader.h), among them
// inconsistent sizes: d_model not divisible by heads, seq_len past max_seq_len.
absl::StatusOr<TrainSpec> ParseTrainSpec(const std::string& yaml_text,
                                         const std::string& source_name);
// Reads and parses `path`; a relative data path is resolved against the spec's folder.
absl::StatusOr<TrainSpec> LoadTrainSpecFile(const std::string& path);

}  // namespace shardline::placement
