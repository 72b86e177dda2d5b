// The actor: one process per assigned device. It registers with the coordinator, receives its
// assignment, joins its communicator groups through the coordinator's store, runs its part of
// the job and reports. Errors are reported to the coordinator, never hidden in a crash.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "protocol/curve.h"

namespace shardline::actor {

struct ActorOptions {
  std::string coordinator;
  std::string cluster_id = "shardline";
  std::string job_id;
  uint32_t generation = 0;
  uint32_t rank = 0;
  std::string node_id;
  std::string device = "cpu:0";  // cpu:N | cuda:N
  std::string metrics_address;   // empty: loopback, any port
  // Its agent's advertised address (protocol/address_rule.h); empty: the route to the coordinator.
  std::string advertise_address;
  protocol::CurveSetup curve;    // its agent's: the node key, or --insecure
  // Its node's memory store (checkpoint/memory_step.h): where memory steps go; empty: none.
  std::string memory_store;
};

// The environment variable through which an agent hands an actor its per-generation token (hex;
// the environment, unlike the command line, is readable only by the actor's user).
inline constexpr const char* kActorTokenEnv = "SHARDLINE_ACTOR_TOKEN";

// Points where a test may act inside an actor (fault injection); empty in the product. A test's
// own actor program (tests/support/stopping_actor_main.cc) sets them and the agent runs it in
// place of `shardline actor` (`shardline agent --actor-binary`).
struct ActorHooks {
  // Once registered and assigned, before joining any group: a moment a signal sent from outside
  // cannot hit reliably.
  std::function<void(uint32_t rank)> before_bootstrap;
};

// Runs the actor to the end and returns the process exit code: 0 when its part succeeded,
// 1 when it failed and said so to the coordinator, 2 when it could not reach the coordinator.
int RunActor(const ActorOptions& options, const ActorHooks& hooks = {});

}  // namespace shardline::actor
