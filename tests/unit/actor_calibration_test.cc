// The actor's start-up calibration (worker/actor/calibration.h): a layer rate that is positive and
// finite with a fall-off that is not negative, the fit that recovers a known fall-off, and
// all-reduce numbers that every rank of a group agrees on, with ranks as threads over Gloo and one
// in-memory store; groups of one rank are skipped, groups of ranks already measured reuse them.
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

TEST(CalibrationTest, FitRecoversTheFallOff) {
  // Two points of r(x) = 80·x/(x + 200) give back R = 80 and h = 200.
  auto rate = [](double x) { return 80e9 * x / (x + 200); };
  absl::StatusOr<LayerRate> fit = FitLayerRate(64, rate(64), 256, rate(256));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->flops, 80e9, 1e3);
  EXPECT_NEAR(fit->half_dim, 200, 1e-6);
  // A thin layer no slower than a wide one (noise): no fall-off, the faster rate.
  fit = FitLayerRate(64, 50e9, 256, 40e9);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->flops, 50e9);
  EXPECT_EQ(fit->half_dim, 0);
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
      // A group of the same ranks as the world reports the world's numbers.
      std::vector<CalibrationGroup> groups = {{"world", "world", world->get(), {0, 1, 2}},
                                              {"tp-d0-p0", "tp", nullptr, {0}},
                                              {"dp-t0-p0", "dp", world->get(), {0, 1, 2}}};
      results[rank] = Calibrate(groups, calibration);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].status();
    const CalibrationResult& result = *results[rank];
    EXPECT_EQ(result.compute.flops > 0, rank == 0);
    EXPECT_EQ(result.optimizer_bytes_per_second > 0, rank == 0);
    ASSERT_EQ(result.groups.size(), 2u);
    const GroupBandwidth& group = result.groups[0];
    const GroupBandwidth& same_ranks = result.groups[1];
    EXPECT_EQ(same_ranks.id, "dp-t0-p0");
    EXPECT_EQ(same_ranks.kind, "dp");
    EXPECT_EQ(same_ranks.bus_bytes_per_second, group.bus_bytes_per_second);
    EXPECT_EQ(same_ranks.latency_seconds, group.latency_seconds);
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
