// The actor's start-up calibration (worker/actor/calibration.h): a layer rate that is positive and
// finite with a fall-off that is not negative, the fit that recovers a known fall-off, and
// all-reduce numbers that every rank of a group agrees on, with ranks as threads over Gloo and one
// in-memory store, measured all at once or, on a time-shared host, in turns; the world and groups
// of one rank are not measured; the host share.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
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

// Ranks as threads of this process over Gloo: `threads` kernel threads each on `cpus` CPUs
// (which makes the host time-shared or not), in `groups` of the world's ranks.
std::vector<absl::StatusOr<CalibrationResult>> CalibrateRanks(int ranks, int threads, int cpus,
                     const std::vector<std::vector<uint32_t>>& group_ranks) {
  comm::InMemoryStore store;
  std::vector<absl::StatusOr<CalibrationResult>> results(ranks, absl::UnknownError("not run"));
  std::vector<std::thread> workers;
  for (int rank = 0; rank < ranks; ++rank) {
    workers.emplace_back([&, rank] {
      comm::GlooOptions options;
      options.hostname = "127.0.0.1";
      auto world = comm::CreateGlooCommunicator(store, rank, ranks, options);
      if (!world.ok()) {
        results[rank] = world.status();
        return;
      }
      // Each group's communicator, for its members, on its own store prefix.
      std::vector<std::unique_ptr<comm::Store>> stores;
      std::vector<std::unique_ptr<comm::Communicator>> owned;
      std::vector<CalibrationGroup> groups = {{"world", "world", world->get(), {}}};
      for (uint32_t r = 0; r < static_cast<uint32_t>(ranks); ++r) groups[0].ranks.push_back(r);
      for (size_t g = 0; g < group_ranks.size(); ++g) {
        const auto& members = group_ranks[g];
        CalibrationGroup group{"tp-" + std::to_string(g), "tp", nullptr, members};
        auto me = std::find(members.begin(), members.end(), static_cast<uint32_t>(rank));
        if (me != members.end() && members.size() > 1) {
          stores.push_back(std::make_unique<comm::PrefixStore>(group.id + "/", store));
          auto made = comm::CreateGlooCommunicator(
              *stores.back(), static_cast<int>(me - members.begin()), static_cast<int>(members.size()),
              options);
          if (!made.ok()) {
            results[rank] = made.status();
            return;
          }
          owned.push_back(std::move(*made));
          group.communicator = owned.back().get();
        }
        groups.push_back(group);
      }
      CalibrationOptions calibration;
      calibration.measure_compute = rank == 0;  // one layer rate is enough for these tests
      calibration.large_bytes = 1 << 20;
      calibration.threads = threads;
      calibration.cpus = cpus;
      results[rank] = Calibrate(groups, calibration);
    });
  }
  for (auto& worker : workers) worker.join();
  return results;
}

// Every group's members report the same agreed numbers; the world and groups of one rank are not
// measured; ranks report their host's share. `cpus` decides whether the host is time-shared,
// which measures in turns: the same answers, taken group by group.
void ExpectGroupsAgree(int cpus) {
  constexpr int kRanks = 4;
  const std::vector<std::vector<uint32_t>> groups = {{0, 1}, {2, 3}, {0}};
  const auto results = CalibrateRanks(kRanks, 1, cpus, groups);
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].status();
    const CalibrationResult& result = *results[rank];
    EXPECT_EQ(result.compute.flops > 0, rank == 0);
    EXPECT_EQ(result.optimizer_bytes_per_second > 0, rank == 0);
    EXPECT_EQ(result.host.ranks, kRanks);  // threads of one process: one host
    EXPECT_EQ(result.host.index, rank);
    EXPECT_EQ(result.host.cpus, cpus);
    EXPECT_DOUBLE_EQ(result.host.cpu_share(), std::min(1.0, cpus / 4.0));
    // Its own two-rank group only: not the world, not the group of one, not the other pair.
    ASSERT_EQ(result.groups.size(), 1u) << "rank " << rank;
    const GroupBandwidth& group = result.groups[0];
    EXPECT_EQ(group.id, rank < 2 ? "tp-0" : "tp-1");
    EXPECT_EQ(group.kind, "tp");
    EXPECT_EQ(group.ranks, 2);
    EXPECT_GT(group.bus_bytes_per_second, 0);
    EXPECT_GT(group.latency_seconds, 0);
    // The slowest rank's times, all-reduced: the same numbers on both members.
    const GroupBandwidth& partner = results[rank ^ 1]->groups[0];
    EXPECT_EQ(group.bus_bytes_per_second, partner.bus_bytes_per_second);
    EXPECT_EQ(group.latency_seconds, partner.latency_seconds);
  }
}

TEST(CalibrationTest, RanksOfAGroupAgree) { ExpectGroupsAgree(/*cpus=*/4); }

TEST(CalibrationTest, TimeSharedHostMeasuresInTurns) { ExpectGroupsAgree(/*cpus=*/2); }

TEST(CalibrationTest, HostShare) {
  HostShare host{.ranks = 4, .index = 0, .threads = 1, .cpus = 2};
  EXPECT_DOUBLE_EQ(host.cpu_share(), 0.5);
  EXPECT_EQ(host.concurrent_ranks(), 2);
  host = {.ranks = 2, .index = 1, .threads = 2, .cpus = 8};
  EXPECT_DOUBLE_EQ(host.cpu_share(), 1.0);
  EXPECT_EQ(host.concurrent_ranks(), 4);
  host = {.ranks = 3, .index = 2, .threads = 4, .cpus = 2};  // one rank's threads outnumber CPUs
  EXPECT_DOUBLE_EQ(host.cpu_share(), 2.0 / 12);
  EXPECT_EQ(host.concurrent_ranks(), 1);
}

}  // namespace
}  // namespace shardline::actor
