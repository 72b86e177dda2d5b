#include "coordinator/bootstrap_tracker.h"

#include <algorithm>

namespace shardline::coordinator {
namespace {

bool IsMember(const GroupRecord& group, int rank) {
  return std::find(group.ranks.begin(), group.ranks.end(), rank) != group.ranks.end();
}

}  // namespace

absl::StatusOr<GroupRecord*> MemberGroup(Job& job, const std::string& group_id, int rank) {
  auto group = std::find_if(job.groups.begin(), job.groups.end(),
                            [&](const GroupRecord& g) { return g.id == group_id; });
  if (group == job.groups.end()) {
    return absl::NotFoundError("job " + job.id + " has no group '" + group_id + "'");
  }
  if (!IsMember(*group, rank)) {
    return absl::PermissionDeniedError("rank " + std::to_string(rank) +
                                       " is not a member of group " + group_id);
  }
  return &*group;
}

void OnJoin(GroupRecord& group, ActorRecord& actor) {
  group.joined.insert(actor.rank);
  if (actor.state == ActorState::kRegistered) actor.state = ActorState::kBootstrapping;
}

ReadyOutcome OnReady(Job& job, GroupRecord& group, ActorRecord& actor, TimePoint now) {
  ReadyOutcome outcome;
  const bool was_ready = group.ready.size() == group.ranks.size();
  group.ready.insert(actor.rank);
  if (!was_ready && group.ready.size() == group.ranks.size()) {
    group.bootstrap_seconds = Seconds(now - job.generation_started);
    outcome.group_ready_seconds = group.bootstrap_seconds;
  }
  const bool actor_ready = std::all_of(job.groups.begin(), job.groups.end(), [&](const auto& g) {
    return !IsMember(g, actor.rank) || g.ready.count(actor.rank) > 0;
  });
  if (actor_ready && actor.state == ActorState::kBootstrapping) actor.state = ActorState::kRunning;
  const bool all_ready = std::all_of(job.groups.begin(), job.groups.end(), [](const auto& g) {
    return g.ready.size() == g.ranks.size();
  });
  if (all_ready && job.phase != Phase::kRunning) {
    job.phase = Phase::kRunning;
    outcome.generation_ready = true;
  }
  return outcome;
}

std::string DescribeMissingRanks(const Job& job) {
  std::string report;
  for (const auto& group : job.groups) {
    std::string missing, waited;
    for (int rank : group.ranks) {
      if (group.ready.count(rank)) continue;
      if (group.joined.count(rank)) {
        waited += (waited.empty() ? "" : ", ") + std::to_string(rank);
        continue;
      }
      const ActorRecord& actor = job.actors.at(static_cast<size_t>(rank));
      const char* why = actor.state == ActorState::kSpawning ? "never registered" : "never joined";
      missing += (missing.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) +
                 " (node " + actor.node_id + ", " + DeviceLabel(actor.device) +
                 (actor.pid ? ", pid " + std::to_string(actor.pid) : std::string()) + ", " + why +
                 ")";
    }
    if (missing.empty() && waited.empty()) continue;
    report += (report.empty() ? "" : "; ") + std::string("group ") + group.id +
              (missing.empty() ? "" : " is missing " + missing) +
              (waited.empty() ? " did not connect"
                              : (missing.empty() ? ": ranks " : ", while ranks ") + waited +
                                    " joined and waited");
  }
  return report;
}

}  // namespace shardline::coordinator
