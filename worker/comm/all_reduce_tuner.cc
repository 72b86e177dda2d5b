#include "worker/comm/all_reduce_tuner.h"

#include <algorithm>
#include <bit>

namespace shardline::comm {
namespace {
// Weight of a new run in the estimate, and the most one run may count as (a multiple of the
// estimate): one preempted run must not bury the fastest algorithm for long.
constexpr double kWeight = 0.25;
constexpr double kOutlier = 2.0;
}  // namespace

const char* ShmAlgorithmName(ShmAlgorithm algorithm) {
  switch (algorithm) {
    case ShmAlgorithm::kOneShot: return "one-shot";
    case ShmAlgorithm::kChunked: return "chunked";
    case ShmAlgorithm::kSingleCopy: return "single-copy";
    case ShmAlgorithm::kOneShotStreamed: return "one-shot-streamed";
    case ShmAlgorithm::kChunkedStreamed: return "chunked-streamed";
  }
  return "?";
}

int AllReduceTuner::Bucket(size_t bytes) {
  if (bytes == 0) return 0;
  return std::min(kBuckets - 1, static_cast<int>(std::bit_width(bytes)) - 1);
}

ShmAlgorithm AllReduceTuner::Best(int bucket) const {
  const Slot& slot = buckets_[bucket];
  int best = -1;
  for (int a = 0; a < kShmAlgorithms; ++a) {
    if (!allowed_[a] || slot.arms[a].runs < kWarmRuns) continue;
    if (best < 0 || slot.arms[a].estimate < slot.arms[best].estimate) best = a;
  }
  return best < 0 ? ShmAlgorithm::kOneShot : static_cast<ShmAlgorithm>(best);
}

ShmAlgorithm AllReduceTuner::Next(int bucket) const {
  const Slot& slot = buckets_[bucket];
  for (int a = 0; a < kShmAlgorithms; ++a) {
    if (allowed_[a] && slot.arms[a].runs < kWarmRuns) return static_cast<ShmAlgorithm>(a);
  }
  const ShmAlgorithm best = Best(bucket);
  if ((slot.runs + 1) % kRetryEvery != 0) return best;
  int oldest = -1;
  for (int a = 0; a < kShmAlgorithms; ++a) {
    if (!allowed_[a] || a == Index(best)) continue;
    if (oldest < 0 || slot.arms[a].last_run < slot.arms[oldest].last_run) oldest = a;
  }
  return oldest < 0 ? best : static_cast<ShmAlgorithm>(oldest);
}

bool AllReduceTuner::Record(int bucket, ShmAlgorithm algorithm, double seconds) {
  Slot& slot = buckets_[bucket];
  const ShmAlgorithm before = Best(bucket);
  Arm& arm = slot.arms[Index(algorithm)];
  ++slot.runs;
  ++arm.runs;
  arm.last_run = slot.runs;
  if (arm.runs <= kWarmRuns) {
    arm.estimate = seconds;  // the first run (page faults, first touches) is overwritten
  } else {
    arm.estimate += kWeight * (std::min(seconds, kOutlier * arm.estimate) - arm.estimate);
  }
  for (int a = 0; a < kShmAlgorithms; ++a) {
    if (allowed_[a] && slot.arms[a].runs < kWarmRuns) return false;  // still warming up
  }
  return Best(bucket) != before;
}

void AllReduceTuner::Disallow(ShmAlgorithm algorithm) { allowed_[Index(algorithm)] = false; }

}  // namespace shardline::comm
