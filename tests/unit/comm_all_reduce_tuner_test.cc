// The shared-memory all-reduce's tuner: it tries every candidate, runs the fastest, retries the
// others now and then, follows a machine whose speeds change, and drops what cannot run.
#include <gtest/gtest.h>

#include <map>

#include "worker/comm/all_reduce_tuner.h"

namespace shardline::comm {
namespace {

// Runs `runs` all-reduces in `bucket`, each taking seconds_of(algorithm); counts the choices.
template <typename Seconds>
std::map<ShmAlgorithm, int> Drive(AllReduceTuner& tuner, int bucket, int runs, Seconds seconds_of) {
  std::map<ShmAlgorithm, int> chosen;
  for (int i = 0; i < runs; ++i) {
    const ShmAlgorithm next = tuner.Next(bucket);
    ++chosen[next];
    tuner.Record(bucket, next, seconds_of(next));
  }
  return chosen;
}

// The streamed variants take `streamed` (by default slower than every other speed below).
double Speeds(ShmAlgorithm a, double one_shot, double chunked, double single,
              double streamed = 9e-4) {
  switch (a) {
    case ShmAlgorithm::kOneShot:
      return one_shot;
    case ShmAlgorithm::kChunked:
      return chunked;
    case ShmAlgorithm::kSingleCopy:
      return single;
    case ShmAlgorithm::kOneShotStreamed:
    case ShmAlgorithm::kChunkedStreamed:
      return streamed;
  }
  return 1;
}

TEST(AllReduceTunerTest, BucketsArePowersOfTwo) {
  EXPECT_EQ(AllReduceTuner::Bucket(1), 0);
  EXPECT_EQ(AllReduceTuner::Bucket(4096), 12);
  EXPECT_EQ(AllReduceTuner::Bucket(8191), 12);
  EXPECT_EQ(AllReduceTuner::Bucket(8192), 13);
  EXPECT_EQ(AllReduceTuner::Bucket(SIZE_MAX), AllReduceTuner::kBuckets - 1);
}

TEST(AllReduceTunerTest, TriesEveryCandidateThenRunsTheFastest) {
  AllReduceTuner tuner;
  const int bucket = 20;
  // Warm-up: each candidate kWarmRuns times, before anything else.
  const auto warm = Drive(tuner, bucket, AllReduceTuner::kWarmRuns * kShmAlgorithms,
                          [](ShmAlgorithm a) { return Speeds(a, 3e-4, 1e-4, 2e-4); });
  for (const auto& [algorithm, runs] : warm) {
    EXPECT_EQ(runs, AllReduceTuner::kWarmRuns) << ShmAlgorithmName(algorithm);
  }
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kChunked);
  const int runs = 320;
  const auto chosen =
      Drive(tuner, bucket, runs, [](ShmAlgorithm a) { return Speeds(a, 3e-4, 1e-4, 2e-4); });
  // The fastest nearly always; the others in turn, one run in kRetryEvery among them all.
  EXPECT_EQ(chosen.at(ShmAlgorithm::kChunked), runs - runs / AllReduceTuner::kRetryEvery);
  for (int a = 0; a < kShmAlgorithms; ++a) {
    const auto algorithm = static_cast<ShmAlgorithm>(a);
    if (algorithm == ShmAlgorithm::kChunked) continue;
    EXPECT_GE(chosen.count(algorithm) ? chosen.at(algorithm) : 0,
              runs / AllReduceTuner::kRetryEvery / (kShmAlgorithms - 1))
        << ShmAlgorithmName(algorithm);
  }
  // Other sizes are tuned on their own.
  EXPECT_EQ(tuner.Next(bucket + 1), ShmAlgorithm::kOneShot);
}

TEST(AllReduceTunerTest, FollowsAMachineWhoseSpeedsChange) {
  AllReduceTuner tuner;
  const int bucket = 18;
  Drive(tuner, bucket, 100, [](ShmAlgorithm a) { return Speeds(a, 1e-4, 2e-4, 3e-4); });
  ASSERT_EQ(tuner.Best(bucket), ShmAlgorithm::kOneShot);
  // The cores move apart: every algorithm slows down, the single copy least.
  Drive(tuner, bucket, 400, [](ShmAlgorithm a) { return Speeds(a, 6e-4, 7e-4, 4e-4); });
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kSingleCopy);
  // Stores to lines the peer has read turn slow: the streamed copies win.
  Drive(tuner, bucket, 400, [](ShmAlgorithm a) {
    return Speeds(a, 6e-4, 7e-4, 8e-4, a == ShmAlgorithm::kChunkedStreamed ? 2e-4 : 3e-4);
  });
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kChunkedStreamed);
  // And back.
  Drive(tuner, bucket, 400, [](ShmAlgorithm a) { return Speeds(a, 1e-4, 2e-4, 3e-4); });
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kOneShot);
}

TEST(AllReduceTunerTest, OneSlowRunDoesNotUnseatTheFastest) {
  AllReduceTuner tuner;
  const int bucket = 16;
  Drive(tuner, bucket, 64, [](ShmAlgorithm a) { return Speeds(a, 1e-4, 1.5e-4, 2e-4); });
  ASSERT_EQ(tuner.Best(bucket), ShmAlgorithm::kOneShot);
  tuner.Record(bucket, ShmAlgorithm::kOneShot, 1.0);  // preempted for a second
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kOneShot);
}

TEST(AllReduceTunerTest, ADisallowedAlgorithmIsNeverChosen) {
  AllReduceTuner tuner;
  const int bucket = 22;
  tuner.Disallow(ShmAlgorithm::kSingleCopy);
  EXPECT_FALSE(tuner.allowed(ShmAlgorithm::kSingleCopy));
  const auto chosen =
      Drive(tuner, bucket, 500, [](ShmAlgorithm a) { return Speeds(a, 3e-4, 2e-4, 1e-6); });
  EXPECT_EQ(chosen.count(ShmAlgorithm::kSingleCopy), 0u);
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kChunked);
}

TEST(AllReduceTunerTest, ReportsAChangeOfTheFastestOnlyAfterWarmUp) {
  AllReduceTuner tuner;
  const int bucket = 19;
  int changes = 0;
  for (int i = 0; i < AllReduceTuner::kWarmRuns * kShmAlgorithms; ++i) {
    const ShmAlgorithm next = tuner.Next(bucket);
    // The last candidate to warm up (kChunkedStreamed) is the fastest.
    const double streamed = next == ShmAlgorithm::kChunkedStreamed ? 5e-5 : 4e-4;
    changes += tuner.Record(bucket, next, Speeds(next, 3e-4, 2e-4, 1e-4, streamed)) ? 1 : 0;
  }
  EXPECT_EQ(changes, 1);  // the warm-up's last run settles on it
  EXPECT_EQ(tuner.Best(bucket), ShmAlgorithm::kChunkedStreamed);
}

}  // namespace
}  // namespace shardline::comm
