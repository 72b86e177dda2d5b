// The node agent: registers this node's devices with the coordinator, heartbeats, spawns one
// actor process per assigned device, reaps them and reports every exit at once. It kills its
// actors when their generation is aborted, when the coordinator is gone past the heartbeat
// timeout, and when it stops; actors also die with it (PR_SET_PDEATHSIG), so none is orphaned.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "monitoring/metrics.h"
#include "monitoring/metrics_server.h"
#include "protocol/curve.h"
#include "protocol/rpc_client.h"
#include "worker/agent/devices.h"

namespace shardline::agent {

struct AgentOptions {
  std::string coordinator = "tcp://127.0.0.1:5555";
  std::string cluster_id = "shardline";
  std::string node_id;        // default: the host name
  std::string devices = "auto";
  // What this node advertises to its peers (protocol/address_rule.h): an explicit address, else
  // the interface's, else the address that routes to the coordinator. Its actors' ZeroMQ, Gloo
  // and NCCL sockets use the same.
  std::string advertise_address;
  std::string interface;
  std::string metrics_address = "127.0.0.1:0";
  // Where its actors' metrics endpoints listen (any port): loopback unless a Prometheus on
  // another host is to scrape them (then this node's address, or 0.0.0.0).
  std::string actor_metrics_host = "127.0.0.1";
  // How long to keep trying the first registration before giving up with an error.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  std::string actor_binary;   // default: this executable
  std::string log_dir;        // actor logs (one file per actor); empty: inherit stderr
  std::string log_level = "info";
  protocol::CurveSetup curve;  // the node key (or --insecure), handed on to its actors
  // Where this node's actors keep memory steps (checkpoint/memory_step.h), host memory that
  // outlives them; empty: /dev/shm/shardline/CLUSTER/NODE. A job's folder in it is removed when
  // the job ends.
  std::string memory_store;
};

class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);
  ~Agent();

  // Serves until `stop` is set or the coordinator asks it to shut down. Returns an error when
  // the first registration fails (unreachable coordinator, node id taken).
  absl::Status Run(const std::atomic<bool>& stop);

 private:
  struct Child {
    std::string job_id;
    uint32_t generation = 0;
    uint32_t rank = 0;
    bool killed = false;  // by this agent (an abort): its exit is a consequence, not a fault
    std::chrono::milliseconds stop_grace{0};  // SIGTERM, then SIGKILL this much later (on abort)
    std::optional<std::chrono::steady_clock::time_point> sigkill_at;  // after its SIGTERM
  };

  Agent(AgentOptions options, std::vector<LocalDevice> devices,
        std::unique_ptr<monitoring::MetricsServer> metrics_server);

  absl::Status SendRegistration();
  absl::Status Handle(const protocol::Message& message);
  void SpawnActors(wire::SpawnActors::Reader request);
  // OpenMP/OpenBLAS threads for each actor: the node's cores over its devices, at least 1.
  int ThreadsPerActor() const;
  // Kills the actors of `job_id`'s `generation` (empty, 0: all). With `grace`, one spawned with a
  // stop grace gets SIGTERM and, if still alive when its grace has run out, SIGKILL (ReapActors
  // sends it); every other one SIGKILL at once.
  enum class Grace { kNone, kAsSpawned };
  void KillActors(const std::string& job_id, uint32_t generation, Grace grace = Grace::kNone);
  // Reaps the actors that exited, and sends SIGKILL to those whose stop grace ran out.
  void ReapActors();
  void ReportExit(pid_t pid, const Child& child, const std::string& description, bool signaled,
                  int code, bool killed_by_agent);

  AgentOptions options_;
  std::vector<LocalDevice> devices_;
  std::string instance_id_;
  std::string address_;    // advertised (protocol/address_rule.h)
  std::string interface_;  // the interface holding it; "" when none does
  std::string address_chosen_by_;
  std::unique_ptr<monitoring::MetricsServer> metrics_server_;
  monitoring::WireMetrics wire_metrics_;
  monitoring::AgentMetrics metrics_;
  std::unique_ptr<protocol::WireObserver> wire_observer_;
  std::unique_ptr<protocol::RpcClient> client_;
  std::map<pid_t, Child> children_;
  // Jobs that ended (AbortGeneration.jobEnded) whose memory steps go once their actors are gone.
  std::set<std::string> ended_jobs_;
  void DropEndedJobsMemory();

  bool registered_ = false;
  bool ever_registered_ = false;
  // The coordinator's instance of the last registration: a new one (it restarted) no longer
  // supervises the actors this agent still runs, which are then killed.
  std::string coordinator_instance_;
  uint64_t register_request_ = 0;
  std::chrono::steady_clock::time_point register_sent_;
  std::chrono::steady_clock::time_point last_ack_;
  std::chrono::steady_clock::time_point next_heartbeat_;
  std::chrono::milliseconds heartbeat_interval_{1000};
  std::chrono::milliseconds heartbeat_timeout_{5000};
  bool shutdown_requested_ = false;
  std::string logged_handshake_failure_;  // the last one logged, so each is logged once
  std::string last_refusal_;  // why the coordinator refused the last registration
};

}  // namespace shardline::agent
