#include "tests/support/chaos.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "common/clock.h"

namespace shardline::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// The job is training in its current generation: running, and a step past the one it resumed
// from reported.
bool Trains(const json& job) {
  if (job["state"] != "running" || job["phase"] != "running") return false;
  const json& generations = job["train"]["generations"];
  if (generations.empty()) return false;
  return job["train"]["step"].get<int64_t>() > generations.back()["resumed_step"].get<int64_t>();
}

const json* GenerationRecord(const json& job, int generation) {
  for (const json& g : job["train"]["generations"]) {
    if (g["generation"].get<int>() == generation) return &g;
  }
  return nullptr;
}

}  // namespace

std::string ChaosFaultName(ChaosFault fault) {
  switch (fault) {
    case ChaosFault::kKillActor: return "kill -9 actor";
    case ChaosFault::kStopActor: return "SIGSTOP actor";
    case ChaosFault::kKillAgent: return "kill -9 agent";
    case ChaosFault::kRestartCoordinator: return "kill -9 coordinator";
    case ChaosFault::kCutLink: return "link cut";
  }
  return "unknown";
}

std::string ExpectedCause(ChaosFault fault) {
  switch (fault) {
    case ChaosFault::kKillActor: return "actor_exit";
    case ChaosFault::kStopActor: return "hung";
    case ChaosFault::kKillAgent: return "node_lost";
    case ChaosFault::kRestartCoordinator: return "coordinator_restart";
    case ChaosFault::kCutLink: return "node_lost";
  }
  return "unknown";
}

absl::StatusOr<std::vector<ChaosRecord>> RunChaos(LocalCluster& cluster, const std::string& job_id,
                                                  const ChaosOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::vector<ChaosRecord> records;
  std::set<pid_t> stopped;
  int full_world = 0;
  // Faults that landed in a grow and were injected again; past this many the next counts as is.
  constexpr int kMaxGrowsHit = 10;
  int grows_hit = 0;
  const auto fail = [&](const std::string& what, const absl::Status& status) {
    for (pid_t pid : stopped) ::kill(pid, SIGCONT);
    return absl::Status(status.code(), "chaos fault " + std::to_string(records.size() + 1) + " (" +
                                           what + "): " + std::string(status.message()));
  };
  for (int i = 0; i < options.faults; ++i) {
    // Training, and back to full size (a lost agent's node has rejoined and the job grown onto
    // it) or past a commit of this generation without growing (the devices a fault pointed at
    // are left out, so full size may not come back; a grow happens at a commit).
    auto job = cluster.WaitForJob(
        job_id,
        [&](const json& j) {
          const bool waiting = j["state"] == "running" || j["state"] == "pending";
          if (!waiting) return true;
          if (!Trains(j)) return false;
          return j["world_size"].get<int>() >= full_world ||
                 j["train"]["last_committed_step"].get<int64_t>() >
                     j["train"]["generations"].back()["resumed_step"].get<int64_t>();
        },
        options.recovery_timeout);
    if (!job.ok()) return fail("waiting for the job to train", job.status());
    if ((*job)["state"] != "running") {
      return fail("before injecting", absl::FailedPreconditionError(
                                          "the job is " + (*job)["state"].get<std::string>() +
                                          ": " + (*job)["error"].get<std::string>()));
    }
    full_world = std::max(full_world, (*job)["world_size"].get<int>());
    const int generation = (*job)["generation"].get<int>();
    const auto gap = std::uniform_int_distribution<int64_t>(options.min_gap.count(),
                                                            options.max_gap.count())(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(gap));
    ChaosRecord record;
    record.fault = options.kinds[rng() % options.kinds.size()];
    const json& actors = (*job)["actors"];
    const json& actor = actors[rng() % actors.size()];
    const pid_t actor_pid = actor["pid"].get<pid_t>();
    // An agent to kill or cut off: one of those the driver may restart that holds an actor of
    // the job (one without any would end no generation). None: the fault is an actor's kill.
    std::vector<std::string> hosting;
    for (const auto& [node_id, devices] : options.agents) {
      for (const json& a : actors) {
        if (a["node_id"] == node_id) {
          hosting.push_back(node_id);
          break;
        }
      }
    }
    std::string node;
    if (!hosting.empty()) node = hosting[rng() % hosting.size()];
    if (node.empty() &&
        (record.fault == ChaosFault::kKillAgent || record.fault == ChaosFault::kCutLink)) {
      record.fault = ChaosFault::kKillActor;
    }
    const int64_t injected_ms = UnixMillis();
    switch (record.fault) {
      case ChaosFault::kKillActor:
        ::kill(actor_pid, SIGKILL);
        break;
      case ChaosFault::kStopActor:
        ::kill(actor_pid, SIGSTOP);
        stopped.insert(actor_pid);
        break;
      case ChaosFault::kKillAgent: {
        auto devices = options.agents.find(node);
        if (devices == options.agents.end() || cluster.agent_pid(node) == 0) {
          return fail(ChaosFaultName(record.fault),
                      absl::InvalidArgumentError("no agent of node " + node + " to kill"));
        }
        ::kill(cluster.agent_pid(node), SIGKILL);
        // Restarted once the coordinator has declared it dead, as an operator (or systemd) would.
        auto dead = cluster.WaitForJob(
            job_id, [&](const json& j) { return j["generation"].get<int>() > generation; },
            options.recovery_timeout);
        if (!dead.ok()) return fail(ChaosFaultName(record.fault), dead.status());
        auto netns = options.agent_netns.find(node);
        auto restarted = netns == options.agent_netns.end()
                             ? cluster.StartAgent(node, devices->second)
                             : cluster.StartAgentIn(netns->second, node, devices->second);
        if (!restarted.ok()) return fail("restarting the agent", restarted.status());
        break;
      }
      case ChaosFault::kCutLink: {
        if (!options.set_link || node.empty()) {
          return fail(ChaosFaultName(record.fault),
                      absl::InvalidArgumentError("no host link to cut (set_link, agents)"));
        }
        if (auto cut = options.set_link(node, false); !cut.ok()) {
          return fail("cutting the link of " + node, cut);
        }
        // Restored once the supervisor has lost the node, as a repaired cable or switch would.
        auto lost = cluster.WaitForJob(
            job_id, [&](const json& j) { return j["generation"].get<int>() > generation; },
            options.recovery_timeout);
        const absl::Status restored = options.set_link(node, true);
        if (!lost.ok()) return fail(ChaosFaultName(record.fault), lost.status());
        if (!restored.ok()) return fail("restoring the link of " + node, restored);
        break;
      }
      case ChaosFault::kRestartCoordinator: {
        absl::Status restarted = cluster.RestartCoordinator();
        if (!restarted.ok()) return fail(ChaosFaultName(record.fault), restarted);
        break;
      }
    }
    // Back: the generation the fault ended has its recovery measured (the next one's first step).
    // A generation that ended to grow just before the fault has none when the fault also ended
    // the next one before its first step (a coordinator killed then): that fault is re-injected.
    auto back = cluster.WaitForJob(
        job_id,
        [&](const json& j) {
          if (j["state"] != "running") return true;
          const json* ended = GenerationRecord(j, generation);
          if (ended == nullptr) return false;
          return (*ended)["recovery_seconds"].get<double>() >= 0 ||
                 ((*ended)["ending"] == "grow" && j["generation"].get<int>() > generation + 1);
        },
        options.recovery_timeout);
    if (!back.ok()) return fail(ChaosFaultName(record.fault), back.status());
    if ((*back)["state"] != "running") {
      return fail(ChaosFaultName(record.fault),
                  absl::FailedPreconditionError("the job is " +
                                                (*back)["state"].get<std::string>() + ": " +
                                                (*back)["error"].get<std::string>()));
    }
    const json& ended = *GenerationRecord(*back, generation);
    if (ended["ending"] == "grow" && ++grows_hit <= kMaxGrowsHit) {
      // The fault landed as the job grew onto a returned node (a commit ended the generation
      // first): it named nothing. Inject another in its place.
      --i;
      continue;
    }
    record.cause_kind = ended["cause_kind"];
    record.cause = ended["cause"];
    record.abort_seconds = ended["abort_seconds"];
    record.steps_lost = ended["steps_lost"];
    if (const json* next = GenerationRecord(*back, generation + 1); next != nullptr) {
      record.resumed_from = next->value("resumed_from", "");
      record.resume_note = next->value("resume_note", "");
      record.resumed_step = next->value("resumed_step", int64_t{0});
    }
    const double aborted_at_ms =
        ended["ended_unix_ms"].get<double>() -
        std::max(0.0, record.abort_seconds) * 1000.0;
    record.detection_seconds = std::max(0.0, (aborted_at_ms - injected_ms) / 1000.0);
    record.first_step_seconds = record.detection_seconds + ended["recovery_seconds"].get<double>();
    records.push_back(record);
  }
  for (pid_t pid : stopped) ::kill(pid, SIGCONT);
  return records;
}

std::pair<double, double> Percentiles(std::vector<double> values) {
  if (values.empty()) return {-1, -1};
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) {
    const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
    return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  return {at(0.5), at(0.99)};
}

int OpenFds(pid_t pid) {
  std::error_code ec;
  int count = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++count;
  }
  return ec ? -1 : count;
}

int64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

}  // namespace shardline::testing
