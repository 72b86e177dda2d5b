// The one fixture of the multi-process tests: a real coordinator and real agents (and through
// them real actors) as processes of the built `shardline` binary, on loopback, ephemeral ports,
// in a fresh temporary directory. Nothing is mocked. Everything it started is killed on
// destruction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "protocol/curve.h"

namespace shardline::testing {

// Path of the `shardline` binary under test ($SHARDLINE_BINARY, set by ctest).
std::string ShardlineBinary();
// The repository root ($SHARDLINE_SOURCE_DIR).
std::string SourceDir();

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr together
};

// Runs `shardline ARGS...` to completion (killed after `timeout`).
CommandResult RunShardline(const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout = std::chrono::seconds(60),
                           const std::vector<std::pair<std::string, std::string>>& env = {});

// Sum of the samples of `metric` whose label set contains `labels` (all when empty) in a
// Prometheus text exposition; -1 when there is none.
double SumOfSamples(const std::string& exposition, const std::string& metric,
                    const std::string& labels = "");
// The same over a GET of http://ADDRESS/metrics; -1 when it cannot be fetched.
double ScrapeSum(const std::string& address, const std::string& metric,
                 const std::string& labels = "");

// Whether this build has AddressSanitizer (scripts/sanitize.sh's asan build).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
inline constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// True while a process with this pid exists (and is not a zombie).
bool ProcessAlive(pid_t pid);

class LocalCluster {
 public:
  struct Options {
    std::chrono::milliseconds heartbeat_interval{200};
    std::chrono::milliseconds heartbeat_timeout{1500};
    // The address the coordinator listens on: another than loopback when agents run in network
    // namespaces of their own (tests/support/net_namespaces.h).
    std::string coordinator_host = "127.0.0.1";
    // Every process without CURVE (--insecure); by default the cluster has keys of its own in
    // DIR/keys, as a real one has.
    bool insecure = false;
    // The test holds the coordinator's or an agent's RSS to a bound: under AddressSanitizer
    // (scripts/sanitize.sh) they then run without its quarantine, which keeps up to 256 MiB of
    // freed blocks from reuse by design and so grows RSS with every free (LeakSanitizer and the
    // other checks stay on).
    bool measures_memory = false;
  };

  LocalCluster() : LocalCluster(Options{}) {}
  explicit LocalCluster(Options options);
  ~LocalCluster();

  // Starts the coordinator and waits until it listens (it writes its endpoint file).
  absl::Status StartCoordinator();
  // kill -9 the coordinator, then start it again on the same endpoint and state dir.
  absl::Status RestartCoordinator();
  // Starts an agent; returns its pid. `env` is added to its (and its actors') environment.
  absl::StatusOr<pid_t> StartAgent(const std::string& node_id, const std::string& devices,
                                   const std::vector<std::pair<std::string, std::string>>& env = {},
                                   const std::vector<std::string>& extra_args = {});
  // The same inside network namespace `netns` (`ip netns exec NETNS shardline agent ...`): a host
  // of its own, whose actors talk to the others by its address there.
  absl::StatusOr<pid_t> StartAgentIn(const std::string& netns, const std::string& node_id,
                                     const std::string& devices,
                                     const std::vector<std::string>& extra_args = {});
  // Waits until `count` nodes are alive.
  absl::Status WaitForAliveNodes(int count, std::chrono::milliseconds timeout);

  absl::StatusOr<std::string> Submit(const std::string& yaml);
  absl::StatusOr<nlohmann::json> Status();
  absl::StatusOr<nlohmann::json> Job(const std::string& job_id);
  // Polls the job until `done(job)` holds; returns the job, or DeadlineExceeded with its last
  // state.
  absl::StatusOr<nlohmann::json> WaitForJob(const std::string& job_id,
                                            const std::function<bool(const nlohmann::json&)>& done,
                                            std::chrono::milliseconds timeout);
  // Waits for the job to reach a final state.
  absl::StatusOr<nlohmann::json> WaitForJobEnd(const std::string& job_id,
                                               std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }
  // The cluster's CURVE key directory (made by the constructor); "" under Options::insecure.
  std::string key_dir() const { return options_.insecure ? "" : dir_ + "/keys"; }
  // The flags a `shardline` client or agent of this cluster takes: --keys DIR or --insecure.
  std::vector<std::string> CurveFlags() const;
  // What the coordinator's and agents' environment gets besides this process's (Options::
  // measures_memory).
  std::vector<std::pair<std::string, std::string>> DaemonEnv() const;
  // The CURVE identities of this cluster's key dir, for in-process clients (null: insecure).
  const protocol::ClientCurve* client_curve() const {
    return client_curve_ ? &*client_curve_ : nullptr;
  }
  const protocol::ClientCurve* node_curve() const { return node_curve_ ? &*node_curve_ : nullptr; }
  std::string metrics_address();  // the coordinator's, from its status
  const std::string& dir() const { return dir_; }
  // Where agent `node_id` keeps its memory steps (`shardline agent --memory-store`), removed with
  // the cluster.
  std::string MemoryStore(const std::string& node_id) const;
  std::string MemoryStoreRoot() const;
  pid_t coordinator_pid() const { return coordinator_pid_; }
  // The pid of the agent started last for `node_id`; 0 when none.
  pid_t agent_pid(const std::string& node_id) const {
    auto it = latest_agent_.find(node_id);
    return it == latest_agent_.end() ? 0 : it->second;
  }
  // The log of a process started here ("coordinator", "agent-NODE").
  std::string Log(const std::string& name) const;

 private:
  // StartAgent and StartAgentIn: `prefix` runs before the agent's command line.
  absl::StatusOr<pid_t> SpawnAgent(const std::vector<std::string>& prefix,
                                   const std::string& node_id, const std::string& devices,
                                   const std::vector<std::pair<std::string, std::string>>& env,
                                   const std::vector<std::string>& extra_args);

  Options options_;
  std::string dir_;
  std::optional<protocol::ClientCurve> client_curve_, node_curve_;
  std::string endpoint_;
  pid_t coordinator_pid_ = 0;
  std::map<std::string, pid_t> agents_;  // by node id
  std::map<std::string, pid_t> latest_agent_;  // by node id: the one started last
};

}  // namespace shardline::testing
