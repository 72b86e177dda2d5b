// TrainSpec: what `shardline train SPEC.yaml` runs — the model, the data, the optimizer and the
// schedule — parsed and validated from YAML before any work starts. (Cluster training jobs
// reuse the model/data/optimizer sections when sharded execution lands.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/resume.h"
#include "model/model_config.h"

namespace shardline::placement {

struct DataSpec {
  std::string path;               // a text file (relative to the spec's folder), or empty:
  uint64_t synthetic_seed = 1;    // the built-in synthetic corpus of this seed
  int64_t synthetic_bytes = 1 << 20;
  // YAML `per_site: [FILE, ...]`, a cluster job's federated data: data-parallel rank (site) i reads
  // only file i (relative to the spec's folder; on the site's own machine), one per site.
  std::vector<std::string> per_site;
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

// Where `shardline train` computes: YAML `device: cpu | cuda | cuda:N` (default cpu).
enum class TrainDevice { kCpu, kCuda };
// How its matrix products compute: YAML `precision: fp32 | bf16`. bf16 (CUDA only, and its default
// there) multiplies bf16 operands with f32 accumulation over f32 master weights; fp32 is f32
// throughout (the CPU's only mode; on CUDA the mode that matches the CPU to rounding).
enum class TrainPrecision { kFloat32, kBFloat16 };

// YAML `checkpoint: {dir, interval, keep, resume}`.
struct CheckpointSpec {
  std::string dir;       // relative to the working directory; empty: no checkpoints
  int64_t interval = 0;  // steps; 0: only at the end
  int64_t keep = 0;      // the newest `keep` committed steps stay, older ones are removed; 0: all
  // `resume: latest` (the default): from the newest committed step of `dir` that verifies, if any;
  // `none`: fresh (refused when `dir` already holds committed steps); a path: from that step.
  checkpoint::ResumeMode resume = checkpoint::ResumeMode::kLatest;
  std::string resume_path;  // for a path; relative to the working directory
  // The memory tier (a train job of the cluster): every `memory_interval` steps (0: never) each
  // rank copies its shard into its node's memory, where it outlives the rank (a step killed ranks
  // had reached stays loadable), and with `memory_replicas: 1` sends a copy to a rank on another
  // node, so that a lost node loses no step either. Disk steps stay the durable layer.
  int64_t memory_interval = 0;
  int64_t memory_replicas = 0;
};

struct TrainSpec {
  std::string name;
  TrainDevice device = TrainDevice::kCpu;
  int device_index = 0;  // N of cuda:N
  TrainPrecision precision = TrainPrecision::kFloat32;
  model::ModelConfig model;
  DataSpec data;
  OptimizerSpec optimizer;
  int64_t steps = 0;
  int64_t batch = 0;    // sequences per step
  int64_t seq_len = 0;  // ≤ model.max_seq_len
  uint64_t seed = 1;    // initialisation and data order
  CheckpointSpec checkpoint;
  // YAML `init_from: PATH`: a run that starts fresh (nothing to resume) takes its parameters from
  // this checkpoint (ours, one step of a sharded run, or a Hugging Face GPT-2 file) with a fresh
  // optimizer; relative to the working directory. Empty: GPT-2 initialisation from `seed`.
  std::string init_from;
  int64_t log_interval = 10;
};

// Where and how `spec` trains, from the names of YAML `device` and `precision` (or the command
// line's overrides). SetTrainDevice also resets the precision to the device's default (bf16 on
// cuda, fp32 on cpu); SetTrainPrecision refuses bf16 on the CPU. InvalidArgument saying what is
// wrong; the caller adds where.
absl::Status SetTrainDevice(std::string_view device, TrainSpec& spec);
absl::Status SetTrainPrecision(std::string_view precision, TrainSpec& spec);
// OK unless `spec` gives both init_from and checkpoint.resume: PATH (a run starts from one or the
// other); InvalidArgument saying so, the caller adds where.
absl::Status CheckStartSources(const TrainSpec& spec);
// checkpoint.resume from its YAML spelling (or --resume): "latest", "none", or anything else as
// the path of a step. InvalidArgument for an empty one.
absl::Status SetResume(std::string_view resume, CheckpointSpec& checkpoint);
// "cpu, fp32", "cuda:0, bf16": where and how a spec trains, for progress output.
std::string TrainDeviceName(const TrainSpec& spec);

// A standalone model spec (examples/model-*.yaml): the keys of a train job's `model:` section at
// the top level — arch (gpt | llama: a preset of ModelConfig's choices), layers, heads, kv_heads,
// d_model, d_ff, vocab, max_seq_len, tied_embeddings, norm_eps, rope_theta. The one YAML reader of
// model::ModelConfig. Errors as ParseTrainSpec's (heads not divisible by kv_heads, ...).
absl::StatusOr<model::ModelConfig> ParseModelConfig(const std::string& yaml_text,
                                                    const std::string& source_name);
absl::StatusOr<model::ModelConfig> LoadModelConfigFile(const std::string& path);

// Every error is InvalidArgument "SOURCE:LINE:COL: PATH: message" (see yaml_reader.h), among them
// inconsistent sizes: d_model not divisible by heads, seq_len past max_seq_len, a model the
// engine cannot run (model::ModelConfig::EngineSupports: arch llama today), and bf16 asked of the
// CPU. (`device` and `precision`
// are keys of a standalone train spec only: a cluster job's devices are those it is placed on.)
absl::StatusOr<TrainSpec> ParseTrainSpec(const std::string& yaml_text,
                                         const std::string& source_name);
// Reads and parses `path`; a relative data path is resolved against the spec's folder.
absl::StatusOr<TrainSpec> LoadTrainSpecFile(const std::string& path);

}  // namespace shardline::placement
