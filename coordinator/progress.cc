#include "coordinator/progress.h"

#include <algorithm>
#include <cmath>

namespace shardline::coordinator {
namespace {

// Logged steps whose StepReports are still being gathered from the ranks; a report of an older
// step is too late to change what `status` shows.
constexpr size_t kRecentSteps = 8;

}  // namespace

std::optional<Recovery> RecordStep(Job& job, int rank, const StepSample& sample, TimePoint now) {
  TrainRecord& progress = job.train;
  const int64_t step = sample.step;
  if (progress.recent.size() >= kRecentSteps && step < progress.recent.begin()->first) {
    return std::nullopt;
  }
  StepAggregate& aggregate = progress.recent[step];
  aggregate.ranks.insert(rank);
  // Only the last pipeline stage computes the loss; the others report NaN. Rank world-1 is on
  // it; another rank's loss stands in until that one's arrives.
  const bool last_rank = rank == job.World() - 1;
  if (!std::isnan(sample.loss) && (last_rank || !aggregate.loss_from_last_rank)) {
    aggregate.loss = sample.loss;
    aggregate.loss_from_last_rank = last_rank;
  }
  // A step takes as long as its slowest rank: show that rank's split and throughput.
  const double seconds = sample.compute_seconds + sample.comm_seconds + sample.bubble_seconds;
  if (seconds > aggregate.slowest_seconds) {
    aggregate.slowest_seconds = seconds;
    aggregate.tokens_per_second = sample.tokens_per_second;
    aggregate.compute_seconds = sample.compute_seconds;
    aggregate.comm_seconds = sample.comm_seconds;
    aggregate.bubble_seconds = sample.bubble_seconds;
  }
  // The rank that moved the most: the busiest link sets the pace on a slow network, as the
  // slowest rank does for the timings. Its own breakdown is kept, not a mix of ranks'.
  if (sample.network_bytes_per_step &&
      (!aggregate.network_bytes ||
       sample.network_bytes_per_step->Total() > aggregate.network_bytes->Total())) {
    aggregate.network_bytes = sample.network_bytes_per_step;
  }
  while (progress.recent.size() > kRecentSteps) progress.recent.erase(progress.recent.begin());
  job.watchdog.OnStep(step, now);
  if (!job.generations.empty()) {
    GenerationRecord& current = job.generations.back();
    current.last_step = std::max(current.last_step, step);
  }
  std::optional<Recovery> recovery;
  if (job.recovering_since && job.generations.size() >= 2) {
    // The restarted job's first new step: the recovery is over.
    GenerationRecord& ended = job.generations[job.generations.size() - 2];
    ended.recovery_seconds = Seconds(now - *job.recovering_since);
    job.recovering_since.reset();
    const std::string& from = job.generations.back().resumed_from;
    recovery = Recovery{ended.generation,
                        ended.cause ? std::string(FaultKindName(ended.cause->kind)) : "other",
                        ended.recovery_seconds, ended.steps_lost,
                        from.empty()               ? "fresh"
                        : from == "memory replica" ? "memory_replica"
                                                   : from};
  }
  if (step < progress.step && progress.first_step >= 0) return recovery;
  if (progress.first_step < 0) {
    progress.first_step = step;
    progress.first_report = now;
  }
  if (step > progress.step || progress.first_step == step) {
    progress.last_report = now;  // when the step was first seen: the rate behind the ETA
  }
  progress.step = step;
  if (sample.logged) progress.logged_step = std::max(progress.logged_step, step);
  if (!std::isnan(aggregate.loss)) progress.loss = aggregate.loss;
  progress.tokens_per_second = aggregate.tokens_per_second;
  progress.compute_seconds = aggregate.compute_seconds;
  progress.comm_seconds = aggregate.comm_seconds;
  progress.bubble_seconds = aggregate.bubble_seconds;
  if (aggregate.network_bytes) progress.network_bytes_per_step = aggregate.network_bytes;
  return recovery;
}

std::optional<Recovery> RecordServing(Job& job, const ServingRecord& report, TimePoint now) {
  const bool became_ready = report.ready && !job.serving.ready;
  job.serving = report;
  // "http://HOST:PORT": a restart listens there again.
  constexpr std::string_view kScheme = "http://";
  if (report.ready && report.url.rfind(kScheme, 0) == 0) {
    job.serve_listen = report.url.substr(kScheme.size());
  }
  if (!became_ready || !job.recovering_since || job.generations.size() < 2) return std::nullopt;
  GenerationRecord& ended = job.generations[job.generations.size() - 2];
  ended.recovery_seconds = Seconds(now - *job.recovering_since);
  job.recovering_since.reset();
  return Recovery{ended.generation,
                  ended.cause ? std::string(FaultKindName(ended.cause->kind)) : "other",
                  ended.recovery_seconds, 0, /*source=*/""};
}

double EtaSeconds(const Job& job) {
  const TrainRecord& progress = job.train;
  const placement::TrainSpec& spec = job.spec.train;
  const int64_t left = spec.steps - progress.step;
  if (job.state != JobState::kRunning || progress.step <= 0 || left <= 0) return 0;
  if (progress.step > progress.first_step && progress.first_step >= 0) {
    return Seconds(progress.last_report - progress.first_report) /
           static_cast<double>(progress.step - progress.first_step) * static_cast<double>(left);
  }
  if (progress.tokens_per_second > 0) {
    return static_cast<double>(left * spec.batch * spec.seq_len) / progress.tokens_per_second;
  }
  return 0;
}

}  // namespace shardline::coordinator
