// JobSpec: what a user submits (`shardline submit job.yaml`), parsed and validated from YAML.
// Three kinds: the communication check, which runs every collective over a range of message sizes
// between N actors and compares results with a reference; a sharded training job, whose model,
// data, optimizer and schedule are those of `shardline train` (train_spec.h) plus a parallel layout
// (parallel_layout.h) that is checked against the model, the batch and the actors at parse time;
// and a serving job: a checkpoint cut over tp × pp actors behind the OpenAI-compatible HTTP API
// that `shardline serve` runs on one host (ServeSpec).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/data_parallel_spec.h"
#include "placement/parallel_layout.h"
#include "placement/train_spec.h"

namespace shardline::placement {

enum class JobKind { kCommCheck, kTrain, kServe };
enum class DeviceKind { kCpu, kCuda };
// kAuto picks by device: NCCL on CUDA, kShm on CPU, and kShm for a serve job on any device (its
// ranks exchange host memory; see ResolveBackend). kShm is shared memory
// between the ranks of a group on one host, a hierarchical shm + Gloo all-reduce for a group over
// hosts with as many ranks on each, and Gloo otherwise (worker/comm/cpu_communicator.h); kGloo
// forces Gloo over TCP for every group.
enum class Backend { kAuto, kGloo, kNccl, kShm };

// The operations a comm-check can run, in the order it runs and reports them.
inline constexpr std::array<std::string_view, 9> kCommCheckOps = {
    "all_reduce_sum", "all_reduce_avg", "all_reduce_max", "all_reduce_min", "all_gather",
    "reduce_scatter", "broadcast",      "send_recv",      "barrier",
};

// Messages are f32 tensors, so sizes are whole elements of 4 bytes.
inline constexpr int64_t kCommCheckElementBytes = 4;
// Larger messages add run time without exercising anything new, and 1 GiB per buffer already needs
// several GiB per actor (input, output, reference).
inline constexpr int64_t kCommCheckMaxBytes = int64_t{1} << 30;
inline constexpr int kMaxActors = 65536;

struct CommCheckSpec {
  int64_t min_bytes = 4;         // smallest message (1 f32 element)
  int64_t max_bytes = 64 << 20;  // largest message
  // As nccl-tests (-w, -n): per (op, size), untimed warm-up runs, then `iterations` back to back,
  // timed from a barrier, then one run whose output is checked. kAutoWarmup (the key left out):
  // kMinAutoWarmups, then more up to kMaxAutoWarmups while they fit in kAutoWarmupSeconds, as
  // the ranks agree from the first ones' slowest time. The shared-memory all-reduce tries each of
  // its five algorithms twice in its first runs at a size, then one every 32 runs
  // (comm/all_reduce_tuner.h): with fewer warm-ups the table times it trying slow ones or keeping
  // a choice one noisy sample made (bench/comm_check_compare.py).
  static constexpr int kAutoWarmup = -1;
  static constexpr int kMinAutoWarmups = 10;
  static constexpr int kMaxAutoWarmups = 200;
  static constexpr double kAutoWarmupSeconds = 0.25;
  int warmup_iterations = kAutoWarmup;
  int iterations = 20;
  // Empty means all of kCommCheckOps; otherwise a subset, each op at most once.
  std::vector<std::string> ops;
  // Also test a few element counts that are not powers of two (see CommCheckSizesBytes).
  bool uneven_sizes = true;
};

// A train job's `elastic:` section: the job survives faults. Absent (enabled false): the first
// fault fails the job, as before. With a fixed layout tp and pp stay and each generation takes the
// largest dp whose world tp·pp·dp is in [min_actors, max_actors], fits the devices available and
// divides the global batch (ElasticLayout); with `parallel: auto` the planner re-plans on at most
// max_actors devices. A restart resumes from the last committed checkpoint step.
struct ElasticSpec {
  bool enabled = false;
  int min_actors = 0;  // default tp·pp (auto: 1)
  int max_actors = 0;  // default the spec's world tp·pp·dp (auto: `actors`, or 0 = any)
  // The crash-loop breaker: more than max_restarts restarts within restart_window, or the same
  // root cause at the same step three times, fails the job with the list of causes.
  int max_restarts = 10;
  std::chrono::milliseconds restart_window{std::chrono::minutes(10)};
  // How long a job below min_actors waits for devices before it fails.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(5)};
  // The progress watchdog's floor: a generation with no new step for max(this, 5 × the measured
  // step time) is hung.
  std::chrono::milliseconds progress_timeout{std::chrono::seconds(10)};
};

// A serve job's `limits:`: the engine's sizing on every rank (serving::BatchingEngineOptions) and
// the leader's queue, as `shardline serve`'s flags of the same names.
struct ServeLimits {
  int max_running = 8;            // sequences in the running batch
  int max_tokens_per_step = 256;  // prefill + decode tokens per step
  int max_queue = 64;             // requests waiting to join the batch; past it 429
  int block_size = 16;            // KV-cache positions per block
  int64_t kv_cache_bytes = 0;     // per rank; 0: room for max_running whole contexts
};

// Only meaningful for kServe. Paths are resolved like a train job's: the checkpoint against the
// submitter's working directory, the tokenizer and the key file against the spec's folder.
struct ServeSpec {
  std::string checkpoint;  // required: anything `shardline generate --checkpoint` takes
  // "bytes", a folder or the files of a GPT-2 tokenizer; empty: the files next to a Hugging Face
  // checkpoint, else bytes (as `generate`).
  std::string tokenizer;
  int hf_heads = 12;              // the heads of a Hugging Face checkpoint without config.json
  std::string model_name;         // what /v1/models lists; empty: the checkpoint's name
  std::string listen = "127.0.0.1:8000";  // the leader's HTTP address, HOST:PORT (port 0: any)
  std::string api_key;            // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::string api_key_file;       // the key from this file's first line (read by the leader)
  ServeLimits limits;
};

struct JobSpec {
  std::string name;  // [a-z0-9-_]{1,63}: it becomes part of metric labels and file names
  JobKind kind = JobKind::kCommCheck;
  // The number of actor processes (the world size). For kTrain it is optional in YAML and
  // defaults to parallel.world(); when given it must equal it. With parallel_auto it is the most
  // devices the planner may use, 0 (absent) meaning every free device.
  int actors = 0;
  DeviceKind devices = DeviceKind::kCpu;
  Backend backend = Backend::kAuto;
  std::chrono::milliseconds bootstrap_timeout{30000};  // YAML: bootstrap_timeout_s
  std::chrono::milliseconds run_timeout{600000};       // YAML: run_timeout_s
  CommCheckSpec comm_check;                            // only meaningful for kCommCheck
  // Only meaningful for kTrain. train.name is the job's name; train.batch is the global batch
  // (sequences per step, over all data-parallel ranks). In YAML every TrainSpec key sits at the
  // top level (model, data, optimizer, steps, batch, seq_len, seed, checkpoint, log_interval).
  TrainSpec train;
  // Only meaningful for kTrain: YAML `parallel: {tp, pp, dp, zero, stages, schedule,
  // virtual_stages, recompute}` (stages → stage_layers; schedule 1f1b | interleaved, virtual_stages
  // default 2 when interleaved, else 1; recompute none | selective | full) and the top-level
  // `micro_batch`, kept 0 when absent (batch / dp, whatever dp a re-plan picks: read it through
  // MicroBatchSize). Validated by ValidateParallel; `parallel: auto` leaves the schedule and the
  // recomputation to the planner too.
  ParallelSpec parallel;
  // Only meaningful for kTrain: YAML `parallel: auto`. The placement planner picks the layout
  // when the job starts, on the devices that are free then; until ApplyPlannedLayout, `parallel`
  // is the one-rank default (but for a top-level micro_batch, which the plan must keep) and
  // ValidateParallel has not run.
  bool parallel_auto = false;
  // Only meaningful for kTrain: YAML `data_parallel: {bucket_mb, compression, rank, sync, every,
  // outer_lr, outer_momentum, fragments}` (data_parallel_spec.h), checked against the layout by
  // CheckDataParallel (for `parallel: auto`, when the plan is applied).
  DataParallelSpec data_parallel;
  // kTrain: YAML `elastic`. kServe: the same section, restarting the service on the same tp × pp
  // after a fault (min_actors = max_actors = tp·pp; only max_restarts, restart_window_s and
  // wait_timeout_s may be given).
  ElasticSpec elastic;
  // kServe only: `parallel: {tp, pp}` sits in `parallel` (dp 1, zero 0), or `parallel: auto`
  // sets parallel_auto (the coordinator plans tp × pp on at most `actors` devices, 0: any, from
  // the checkpoint's shape and the devices' memory: serve_memory.h); every other key here.
  ServeSpec serve;
};

// Where a job spec's relative paths point. Both empty (the default) leave paths as written. (The
// `= {}` lets callers write PathBase{.spec_dir = d} without -Wmissing-field-initializers.)
struct PathBase {
  // A relative data.path of a train job is resolved against this folder (the spec file's).
  std::string spec_dir = {};
  // A relative checkpoint.dir of a train job is resolved against this folder (the submitter's
  // working directory, as `shardline train` does).
  std::string work_dir = {};
};

// Parses and validates a job spec. Every error is InvalidArgument in the form
// "SOURCE:LINE:COL: PATH: message" (see yaml_reader.h); `source_name` is the SOURCE. A train job's
// layout errors (ValidateParallel) are placed at its `parallel` key. No I/O.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source_name,
                                     const PathBase& base = {});
// Reads `path` and parses it with spec_dir = the file's folder and work_dir = the current
// directory (both absolute); NotFound naming the path when the file does not exist.
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path);

// Sets a `parallel: auto` train job's layout to `layout` (the plan) and its actors to the plan's
// world, after checking it with ValidateParallel against the job's model and batch and, when the
// spec gave `actors`, that the plan stays within them, and when it gave `micro_batch`, that the
// plan keeps it. InvalidArgument saying which rule fails; `spec` is unchanged on error. Also
// accepts a fixed layout equal to the spec's own (an actor applies what the coordinator sent).
absl::Status ApplyPlannedLayout(JobSpec& spec, const ParallelSpec& layout);

// An elastic job's fixed layout for `devices` available: its tp, pp, zero and stages with the
// largest dp such that min_actors ≤ tp·pp·dp ≤ min(max_actors, devices) and the layout is valid
// for the model and batch (ValidateParallel). FailedPrecondition saying what is missing when no
// dp fits (fewer devices than min_actors). Expects a validated elastic spec with a fixed layout.
absl::StatusOr<ParallelSpec> ElasticLayout(const JobSpec& spec, int devices);

// "HOST:PORT" split, the port in 0..65535; InvalidArgument saying what is wrong with `address`.
absl::Status ParseHostPort(const std::string& address, std::string* host, int* port);

// The YAML spellings: "comm-check", "train", "serve"; "cpu", "cuda"; "auto", "gloo", "nccl",
// "shm".
std::string_view JobKindName(JobKind kind);
std::string_view DeviceKindName(DeviceKind kind);
std::string_view BackendName(Backend backend);

// The backend the actors will actually use: kGloo, kShm or kNccl, never kAuto.
Backend ResolveBackend(const JobSpec& spec);

// The message sizes, in bytes, that a comm-check tests: min_bytes·4^k up to max_bytes, max_bytes
// itself, and, when uneven_sizes is set, the element counts 3, 1000, 65537 and 4194305 (×4 bytes)
// that fall in [min_bytes, max_bytes]. Those counts divide evenly by no power-of-two world size and
// leave ragged last chunks in the backends' pipelined algorithms, which is where chunking bugs
// live; 3 is smaller than most world sizes, so some ranks get empty reduce_scatter shards. Sorted,
// unique, every one a multiple of 4. Expects a validated spec.
std::vector<int64_t> CommCheckSizesBytes(const CommCheckSpec& spec);

}  // namespace shardline::placement
