// The command line an agent gives each actor (worker/agent/agent.cc builds it), as one set of
// CLI11 options: `shardline actor` and the tests' own actor programs parse it the same way.
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "worker/actor/actor.h"

namespace shardline::actor {

inline void AddActorFlags(CLI::App& command, ActorOptions& options, std::string& log_level) {
  command.add_option("--coordinator", options.coordinator)->required();
  command.add_option("--cluster-id", options.cluster_id);
  command.add_option("--job", options.job_id)->required();
  command.add_option("--generation", options.generation)->required();
  command.add_option("--rank", options.rank)->required();
  command.add_option("--node-id", options.node_id)->required();
  command.add_option("--device", options.device);
  command.add_option("--metrics", options.metrics_address);
  command.add_option("--advertise-address", options.advertise_address);
  command.add_option("--memory-store", options.memory_store);
  command.add_option("--log-level", log_level);
  command.add_option("--keys", options.curve.key_dir);
  command.add_option("--key", options.curve.identity);
  command.add_flag("--insecure", options.curve.insecure);
}

}  // namespace shardline::actor
