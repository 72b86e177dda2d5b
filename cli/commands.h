// The `shardline` subcommands. Each returns the process exit code.
#pragma once

#include <atomic>
#include <chrono>
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

// The embedded default job of `shardline up` for `actors` CPU actors.
std::string DefaultJobYaml(int actors);

}  // namespace shardline::cli
