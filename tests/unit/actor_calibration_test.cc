// The actor's start-up calibration (worker/actor/calibration.h): a layer rate that is positive and
// finite with a fall-off that is not negative, and all-reduce numbers that every rank of a group agrees on, with ranks as threads over
// Gloo and one in-memory store; groups of one rank are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "worker/actor/calibration.h"
#include "worker/comm/store.h"

namespace shardline::actor {
namespace {

TEST(CalibrationTest, LayerRateIsPositive) {
  absl::StatusOr<LayerRate> rate = MeasureLayerRate();
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GT(rate->flops, 1e6);  // any CPU of this century does a MFLOP/s
  EXPECT_TRUE(std::isfinite(rate->flops));
  EXPECT_GE(rate->half_dim, 0);
  EXPECT_TRUE(std::isfinite(rate->half_dim));
}

TEST(CalibrationTest, RanksOfAGroupAgree) {
  constexpr int kRanks = 3;
  comm::InMemoryStore store;
  std::vector<absl::StatusOr<CalibrationResult>> results(kRanks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      comm::GlooOptions options;
      options.hostname = "127.0.0.1";
      auto world = comm::CreateGlooCommunicator(store, rank, kRanks, options);
      if (!world.ok()) {
        results[rank] = world.status();
        return;
      }
      CalibrationOptions calibration;
      calibration.measure_compute = rank == 0;  // one layer rate is enough for this test
      calibration.large_bytes = 1 << 20;
      // A group of one has no link to measure: it is skipped, with or without a communicator.
      std::vector<CalibrationGroup> groups = {{"world", "world", world->get()},
                                              {"tp-d0-p0", "tp", nullptr}};
      results[rank] = Calibrate(groups, calibration);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].status();
    const CalibrationResult& result = *results[rank];
    EXPECT_EQ(result.compute.flops > 0, rank == 0);
    ASSERT_EQ(result.groups.size(), 1u);
    const GroupBandwidth& group = result.groups[0];
    EXPECT_EQ(group.id, "world");
    EXPECT_EQ(group.kind, "world");
    EXPECT_EQ(group.ranks, kRanks);
    EXPECT_GT(group.bus_bytes_per_second, 0);
    EXPECT_GT(group.latency_seconds, 0);
    // The slowest rank's times, all-reduced: the same numbers on every rank.
    EXPECT_EQ(group.bus_bytes_per_second, results[0]->groups[0].bus_bytes_per_second);
    EXPECT_EQ(group.latency_seconds, results[0]->groups[0].latency_seconds);
  }
}

}  // namespace
}  // namespace shardline::actor
