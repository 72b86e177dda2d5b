// A generation's communicator bootstrap as its ranks report it: which ranks started joining each
// group (CommJoin), which are ready (CommReady), when a group and the whole generation are
// ready, and — at the bootstrap deadline — which ranks never came, group by group. No I/O, no
// clock of its own: the coordinator passes the time and acts on what is returned.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/job.h"

namespace shardline::coordinator {

// The group `group_id` of the job's current generation, with `rank` a member of it; an error
// saying why not (no such group, not a member).
absl::StatusOr<GroupRecord*> MemberGroup(Job& job, const std::string& group_id, int rank);

// `actor` started joining `group`.
void OnJoin(GroupRecord& group, ActorRecord& actor);

struct ReadyOutcome {
  // The group just became ready: seconds since the generation started.
  std::optional<double> group_ready_seconds;
  // Every group of the generation is ready: the job's phase is now kRunning.
  bool generation_ready = false;
};
// `actor` has `group` ready. An actor runs once every group it is in is ready.
ReadyOutcome OnReady(Job& job, GroupRecord& group, ActorRecord& actor, TimePoint now);

// At the bootstrap deadline: the members that never came, named ("group tp-0 is missing rank 1
// (node a, cpu:1, pid 42, never joined)"), and those that came and waited, counted. Empty when
// every group is ready.
std::string DescribeMissingRanks(const Job& job);

}  // namespace shardline::coordinator
