// `shardline actor` for the liveness tests: the real actor, except that the rank named by
// $SHARDLINE_TEST_STOP_RANK stops itself (SIGSTOP) as its bootstrap begins, as a SIGSTOP from
// outside would at a moment a test cannot otherwise hit reliably. A test's agent runs it for each
// actor (`shardline agent --actor-binary`), so the product itself reads no fault switches.
#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "spdlog/spdlog.h"
#include "worker/actor/actor.h"
#include "worker/actor/actor_flags.h"

int main(int argc, char** argv) {
  namespace actor = shardline::actor;
  // The command line the agent gives `shardline actor`, parsed by the same options.
  CLI::App app{"shardline actor whose rank $SHARDLINE_TEST_STOP_RANK stops before bootstrap"};
  app.require_subcommand(1);
  std::string log_level = "info";
  actor::ActorOptions options;
  auto* actor_cmd = app.add_subcommand("actor", "Run one actor (spawned by an agent)");
  actor::AddActorFlags(*actor_cmd, options, log_level);
  CLI11_PARSE(app, argc, argv);

  if (auto status = shardline::InitLogging("actor", log_level); !status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return 2;
  }
  actor::ActorHooks hooks;
  const char* stop_rank = std::getenv("SHARDLINE_TEST_STOP_RANK");
  if (stop_rank != nullptr && *stop_rank != '\0') {
    hooks.before_bootstrap = [stop = std::string(stop_rank)](uint32_t rank) {
      if (std::to_string(rank) != stop) return;
      spdlog::warn("fault injection: rank {} stops itself before bootstrap", rank);
      ::raise(SIGSTOP);
    };
  }
  return actor::RunActor(options, hooks);
}
