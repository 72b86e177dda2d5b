#include "coordinator/job.h"

#include <filesystem>

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

std::string ResolveUnder(const std::string& base, const std::string& path) {
  if (path.empty()) return path;
  const std::filesystem::path p(path);
  std::filesystem::path resolved =
      (p.is_absolute() ? p : std::filesystem::path(base) / p).lexically_normal();
  if (!resolved.has_filename() && resolved.has_relative_path()) resolved = resolved.parent_path();
  return resolved.string();
}

std::string AbsoluteDir(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path here = std::filesystem::current_path(ec);
  return ResolveUnder(ec ? std::string("/") : here.string(), dir);
}

}  // namespace shardline::coordinator
