#include "coordinator/job.h"

namespace shardline::coordinator {

std::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kPending: return "pending";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kNone: return "";
    case Phase::kSpawning: return "spawning";
    case Phase::kBootstrapping: return "bootstrapping";
    case Phase::kRunning: return "running";
    case Phase::kAborting: return "aborting";
    case Phase::kRestarting: return "restarting";
  }
  return "unknown";
}

std::string_view ActorStateName(ActorState state) {
  switch (state) {
    case ActorState::kSpawning: return "spawning";
    case ActorState::kRegistered: return "registered";
    case ActorState::kBootstrapping: return "bootstrapping";
    case ActorState::kReady: return "ready";
    case ActorState::kRunning: return "running";
    case ActorState::kSucceeded: return "succeeded";
    case ActorState::kFailed: return "failed";
    case ActorState::kLost: return "lost";
  }
  return "unknown";
}

bool IsFinal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

}  // namespace shardline::coordinator
