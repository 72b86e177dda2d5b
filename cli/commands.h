// The `shardline` subcommands. Each returns the process exit code.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace shardline::cli {

// Set by SIGINT/SIGTERM; every long-running subcommand polls it.
std::atomic<bool>& StopRequested();
void InstallStopHandlers();

struct ClientOptions {
  std::string coordinator = "tcp://127.0.0.1:5555";
  std::string cluster_id = "shardline";
  std::chrono::milliseconds timeout{5000};
};

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

struct UpOptions {
  int devices = 4;
  std::string job_path;  // empty: the embedded default job
  std::string work_dir;  // empty: a fresh temporary directory
  bool keep = false;     // keep the work dir (logs, state) after a successful run
  std::string log_level = "info";
};
int Up(const UpOptions& options);

struct TrainOptions {
  std::string spec_path;
  int64_t steps = 0;           // > 0 overrides the spec
  std::string checkpoint_dir;  // non-empty overrides the spec
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
};
int Generate(const GenerateCommandOptions& options);

// The embedded default job of `shardline up` for `actors` CPU actors.
std::string DefaultJobYaml(int actors);

}  // namespace shardline::cli
