// The `shardline` subcommands. Each returns the process exit code.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "protocol/curve.h"

namespace shardline::cli {

// Set by SIGINT/SIGTERM; every long-running subcommand polls it.
std::atomic<bool>& StopRequested();
void InstallStopHandlers();
// Set by SIGHUP once InstallReloadHandler ran: the coordinator reads its allowlist again.
std::atomic<bool>& ReloadRequested();
void InstallReloadHandler();

struct ClientOptions {
  std::string coordinator = "tcp://127.0.0.1:5555";
  std::string cluster_id = "shardline";
  std::chrono::milliseconds timeout{5000};
  protocol::CurveSetup curve;  // a client key of the key dir, unless --insecure
};

// `shardline keygen --out DIR`: the cluster's CURVE keys; with --name, one more identity.
struct KeygenOptions {
  std::string out;
  std::string name;  // empty: a whole new key directory
  std::string role = "client";
};
int Keygen(const KeygenOptions& options);

struct SubmitOptions {
  std::string spec_path;
  bool wait = false;
  std::chrono::seconds wait_timeout{3600};
};
int Submit(const ClientOptions& client, const SubmitOptions& options);

struct StatusOptions {
  std::string job_id;  // empty: the whole cluster
  bool json = false;
};
int Status(const ClientOptions& client, const StatusOptions& options);

int Cancel(const ClientOptions& client, const std::string& job_id);

// `shardline slurm SPEC` (cli/slurm.cc): a cluster inside a SLURM allocation, one task per node.
struct SlurmOptions {
  std::string spec_path;
  std::string rendezvous_dir;  // empty: ~/.shardline/slurm/JOB.STEP (a file system nodes share)
  std::string devices;         // empty: the node's allocated GPUs, else its allocated CPUs
  // Every node advertises this interface's address (protocol/address_rule.h); empty: the one that
  // routes to the coordinator. (No --advertise-address: the same command runs on every node.)
  std::string interface;
  std::chrono::seconds start_timeout{120};   // for the first node to publish the coordinator
  std::chrono::seconds wait_timeout{7 * 24 * 3600};  // the job (SLURM's time limit comes first)
  std::string log_level = "info";
};
// `argc`/`argv`: the command line, run again under srun from a batch script.
int Slurm(const SlurmOptions& options, int argc, char** argv);

struct UpOptions {
  int devices = 0;  // 0: DefaultUpDevices() of the cores this process may run on
  std::string job_path;  // empty: the embedded default job
  std::string work_dir;  // empty: a fresh temporary directory
  bool keep = false;     // keep the work dir (logs, state) after a successful run
  std::string log_level = "info";
  bool insecure = false;  // else throwaway CURVE keys in WORK_DIR/keys
};
int Up(const UpOptions& options);
// The CPU devices `shardline up` offers on `cores` cores: 4 (the default job's tp 2 x pp 2) when
// each gets a core, else 2 (tp 2). More actors than cores time-share them: four on two cores
// train no faster than two (36.7k against 37.5k tokens/s) and spend a third of each step
// waiting for a peer the scheduler parked. Both keep one data-parallel rank, so a checkpoint of
// either resumes on the other.
int DefaultUpDevices(int cores);

struct TrainOptions {
  std::string spec_path;
  int64_t steps = 0;           // > 0 overrides the spec
  std::string checkpoint_dir;  // non-empty overrides the spec
  std::string resume;          // non-empty overrides the spec: latest, none or a checkpoint path
  std::string init_from;       // non-empty overrides the spec
  std::string device;          // non-empty overrides the spec: cpu, cuda, cuda:N
  std::string precision;       // non-empty overrides the spec: fp32, bf16
};
int Train(const TrainOptions& options);

struct GenerateCommandOptions {
  std::string checkpoint;  // a file, or a training run's checkpoint folder
  std::string prompt;
  int max_new_tokens = 64;
  double temperature = 0;  // 0: greedy
  int top_k = 0;
  uint64_t seed = 0;
  int hf_heads = 12;       // heads of a Hugging Face GPT-2 file (its tensors do not say)
  bool no_kv_cache = false;
  bool ignore_eos = false;     // go on past the tokenizer's end-of-sequence tokens
  std::string device = "cpu";  // cpu, cuda or cuda:N (placement::SetTrainDevice's names)
  // "bytes" or a path (data::LoadTokenizer); empty: the tokenizer files of a Hugging Face
  // checkpoint's folder when it has them, else bytes.
  std::string tokenizer;
};
int Generate(const GenerateCommandOptions& options);

// `shardline serve`: the OpenAI-compatible API over one checkpoint, in this process (or, with
// --tp/--pp, over tensor-parallel and pipeline processes of this host that it starts).
struct ServeOptions {
  std::string checkpoint;            // anything `generate` takes
  std::string tokenizer;             // as `generate`'s --tokenizer
  std::string listen = "127.0.0.1:8000";  // HOST:PORT; port 0: any free one (printed)
  std::string api_key;               // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::string api_key_file;          // the key from this file's first line
  std::string model_name;            // empty: the checkpoint's file or folder name
  int max_queue = 64;                // requests waiting to join the batch; then 429
  int max_running = 8;               // sequences in the running batch
  int max_tokens_per_step = 256;     // prefill + decode tokens per step
  int block_size = 16;               // KV-cache positions per block
  int64_t kv_cache_mib = 0;          // per rank; 0: room for max_running whole contexts
  int hf_heads = 12;
  // Tensor-parallel ranks and pipeline stages: tp · pp ranks of this host (placement::RankGrid's
  // numbering); this process is rank 0 and starts the others as `serve-rank` processes of this
  // binary; each loads only its part of the model (its heads, MLP columns and vocabulary rows of
  // its stage's layers).
  int tp = 1;
  int pp = 1;                      // 1..the model's layers
  std::string log_level = "info";  // passed on to the other ranks
  std::string device = "cpu";      // cpu, cuda or cuda:N: every rank's (passed on)
};
// Serves until SIGINT/SIGTERM; 0 after a clean stop, 1 when the model cannot be loaded, the
// address bound or a rank fails (at start or while serving), 2 for bad flags.
int Serve(const ServeOptions& options);

// `shardline serve-rank` (hidden): rank `rank` of a `serve --tp T --pp P` group (its
// tensor-parallel index and stage are placement::RankGrid(T, P, 1)'s coordinates), started by
// rank 0 with its engine-sizing flags so that every rank sizes the same cache.
struct ServeRankOptions {
  std::string checkpoint;  // as rank 0 resolved it (checkpoint::ResolveCheckpoint)
  int hf_heads = 12;
  int rank = 1;
  int tp = 2;
  int pp = 1;
  std::string store_dir;  // the group's store (comm::LocalRankGroup)
  int max_running = 8;
  int max_tokens_per_step = 256;
  int block_size = 16;
  int64_t kv_cache_mib = 0;
  std::string log_level = "info";
  std::string device = "cpu";
};
// Runs the steps rank 0 sends until it says stop: 0 then, 1 (the error printed) otherwise.
int ServeRank(const ServeRankOptions& options);

// The backend inference runs on for a --device flag (cpu, cuda or cuda:N: the train spec's names;
// fp32 on either), the CPU's over `allocator`. InvalidArgument for a name that is not a device,
// FailedPrecondition (CreateBackend's reason) for a CUDA device that cannot run.
absl::StatusOr<std::unique_ptr<kernels::Backend>> InferenceBackend(
    const std::string& device, kernels::CpuAllocator& allocator);

// `shardline checkpoint inspect DIR`: the steps of a run's checkpoint folder (or one step of it).
struct CheckpointInspectOptions {
  std::string dir;    // a run's checkpoint dir, a step folder or a step's manifest.json
  int64_t step = -1;  // >= 0: that step's tensors and train section
  bool verify = false;
  bool json = false;
};
// 0 when all is well, 1 when --verify finds a step that fails, 2 for bad input (no such dir or
// step).
int CheckpointInspect(const CheckpointInspectOptions& options);

// `shardline checkpoint export DIR --format hf --out OUT`.
struct CheckpointExportOptions {
  std::string dir;    // anything a loader takes (checkpoint::ResolveCheckpoint)
  int64_t step = -1;  // >= 0: that committed step of the run dir `dir`
  std::string format;
  std::string out;  // must not exist, or be an empty folder
};
// 0 when written, 1 when the checkpoint cannot be read or written out, 2 for bad input.
int CheckpointExport(const CheckpointExportOptions& options);

struct PlanOptions {
  std::string model_path;    // a model spec (examples/model-*.yaml)
  std::string cluster_path;  // a cluster spec; empty: the live coordinator's cluster
  std::string train_path;    // a train set-up (examples/plan-train.yaml); empty: the defaults
  bool json = false;
  bool explain = false;
  // Whether a coordinator was named (--coordinator or $SHARDLINE_COORDINATOR): only then may the
  // cluster come from it.
  bool coordinator_given = false;
  std::string devices = "auto";  // of the live cluster: cpu, cuda or auto
};
// Prints the planner's report (see cli/plan.h); 0 when a plan was found, 1 when none fits or the
// coordinator cannot be reached, 2 for bad input.
int Plan(const ClientOptions& client, const PlanOptions& options);

// The text the default job trains on, a public-domain book in the source tree's examples/data/:
// found next to the binary (in the folders above it, as in a build tree) or under the current
// directory; NotFound naming where it looked.
inline constexpr char kDefaultTrainingText[] = "examples/data/jargon-file.txt";
absl::StatusOr<std::string> DefaultTrainingTextPath();

// The embedded default job of `shardline up` for `actors` CPU actors, training on `text`.
std::string DefaultJobYaml(int actors, const std::string& text);

}  // namespace shardline::cli
