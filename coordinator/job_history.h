// The coordinator's job history: a job as the JSON record its state dir keeps
// (STATE_DIR/jobs/ID.json), and a job from that record as a coordinator that starts on the
// state dir takes it over — a pending job still wants devices, a running elastic job restarts
// from its newest committed step as its next generation (cause coordinator_restart), any other
// running job failed with its coordinator. JobRecord and JobFromRecord do no I/O; JobHistory is
// the thin store that writes and reads the files.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/job.h"
#include "nlohmann/json.hpp"

namespace shardline::coordinator {

nlohmann::json JobRecord(const Job& job);

// The job of `record` (read from `where`, named in errors), taken over at `now`. An error when
// the record is malformed or its spec no longer parses.
absl::StatusOr<Job> JobFromRecord(const nlohmann::json& record, const std::string& where,
                                  TimePoint now, int64_t unix_ms);

class JobHistory {
 public:
  // `state_dir` empty: nothing is kept.
  explicit JobHistory(std::string state_dir) : state_dir_(std::move(state_dir)) {}

  // Writes the job's record atomically; an error is logged (the job goes on).
  void Save(const Job& job) const;
  // Every job the state dir holds, in submission order; unreadable records are logged and
  // skipped.
  std::vector<Job> Load(TimePoint now) const;

 private:
  std::string state_dir_;
};

}  // namespace shardline::coordinator
