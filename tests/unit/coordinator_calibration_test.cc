// The coordinator's calibration book and the ClusterSpec it builds for the planner
// (coordinator/calibration.h): measurements land on the right node and link kind, a newer job
// generation replaces an older one's, one generation keeps its most conservative numbers, and the
// spec built from membership carries them (and only the free devices when asked).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/calibration.h"

namespace shardline::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CalibrationBookTest, GroupsCalibrateIntraOrInterNodeLinks) {
  CalibrationBook book;
  book.RecordCompute("a", "cpu:0", {2e10, 30, 4e9}, "job-1", 100);
  book.RecordCompute("a", "cpu:1", {1e10, 50, 6e9}, "job-1", 100);
  book.RecordCompute("a", "cpu:2", {0, 10}, "job-1", 100);     // not measured: ignored
  book.RecordCompute("a", "cpu:3", {5e9, -1}, "job-1", 100);   // garbage: ignored
  // A group on node a alone, and one over a and b. A collective of n ranks pays 2·ceil(log2 n)
  // link latencies in the cost model: the book keeps the measured time over that.
  book.RecordGroup({"a", "a"}, 5e9, 4e-5, "job-1/1", "job-1", 100);
  book.RecordGroup({"a", "b", "b"}, 1e9, 4e-4, "job-1/1", "job-1", 100);

  const NodeCalibration* a = book.Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->Compute().flops, 1e10);  // the slowest device, with its fall-off
  EXPECT_EQ(a->Compute().half_dim, 50);
  EXPECT_EQ(a->Compute().optimizer_bytes_per_second, 4e9);  // the slowest of any device
  EXPECT_EQ(a->device_compute.size(), 2u);
  EXPECT_EQ(a->intra.bus_bytes_per_second, 5e9);
  EXPECT_EQ(a->intra.latency_seconds, 2e-5);  // 4e-5 over 2 steps
  EXPECT_EQ(a->inter.bus_bytes_per_second, 1e9);
  const NodeCalibration* b = book.Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->Compute().flops, 0);
  EXPECT_EQ(b->intra.bus_bytes_per_second, 0);  // its only group spanned nodes
  EXPECT_EQ(b->inter.bus_bytes_per_second, 1e9);
  EXPECT_EQ(b->inter.latency_seconds, 1e-4);  // 4e-4 over 4 steps (3 ranks)
  EXPECT_EQ(book.Find("c"), nullptr);
}

TEST(CalibrationBookTest, OneGenerationIsConservativeANewerOneReplaces) {
  CalibrationBook book;
  book.RecordGroup({"a", "a"}, 5e9, 2e-5, "job-1/1", "job-1", 100);
  book.RecordGroup({"a", "a"}, 4e9, 1e-5, "job-1/1", "job-1", 100);
  book.RecordGroup({"a", "a"}, 6e9, 3e-5, "job-1/1", "job-1", 100);
  EXPECT_EQ(book.Find("a")->intra.bus_bytes_per_second, 4e9);
  EXPECT_EQ(book.Find("a")->intra.latency_seconds, 1.5e-5);  // per link step: 2 in a pair
  // The next job measured a faster link: its numbers stand, whatever the older ones said.
  book.RecordGroup({"a", "a"}, 7e9, 1e-6, "job-2/1", "job-2", 200);
  EXPECT_EQ(book.Find("a")->intra.bus_bytes_per_second, 7e9);
  EXPECT_EQ(book.Find("a")->intra.latency_seconds, 5e-7);
  EXPECT_EQ(book.Find("a")->job_id, "job-2");
  EXPECT_EQ(book.Find("a")->measured_unix_ms, 200);
  // Garbage is not a measurement.
  book.RecordGroup({"a", "a"}, -1, 1e-6, "job-3/1", "job-3", 300);
  book.RecordGroup({"a"}, 1e9, 1e-6, "job-3/1", "job-3", 300);
  EXPECT_EQ(book.Find("a")->intra.bus_bytes_per_second, 7e9);
}

NodeInfo Node(const std::string& id, int cpus, bool alive = true) {
  NodeInfo node;
  node.node_id = id;
  node.alive = alive;
  for (int d = 0; d < cpus; ++d) {
    DeviceInfo device;
    device.index = d;
    device.memory_bytes = uint64_t{4} << 30;
    device.name = "cpu";
    node.devices.push_back(device);
  }
  return node;
}

TEST(ClusterSpecTest, FromMembershipWithMeasurements) {
  Membership membership(std::chrono::milliseconds(1000));
  ASSERT_TRUE(membership.Register(Node("a", 2), TimePoint()).ok());
  ASSERT_TRUE(membership.Register(Node("b", 2), TimePoint()).ok());
  ASSERT_TRUE(membership.Register(Node("c", 2), TimePoint()).ok());
  membership.Find("c")->alive = false;
  membership.Find("b")->devices[0].busy_job = "other-1";
  CalibrationBook book;
  book.RecordCompute("a", "cpu:0", {3e10, 40, 5e9}, "job-1", 1);
  book.RecordGroup({"a", "a"}, 5e9, 4e-5, "job-1/1", "job-1", 1);
  book.RecordGroup({"a", "b"}, 1e9, 2e-4, "job-1/1", "job-1", 1);

  std::map<std::string, std::vector<int>> slots;
  const std::vector<PlannableNode> free_nodes =
      PlannableNodes(membership, book, DeviceInfo::Kind::kCpu, true, &slots);
  ASSERT_EQ(free_nodes.size(), 2u);  // c is dead
  EXPECT_EQ(free_nodes[0].devices, 2);
  EXPECT_EQ(free_nodes[1].devices, 1);  // b's device 0 is busy
  EXPECT_THAT(slots["b"], ElementsAre(1));
  EXPECT_EQ(free_nodes[0].memory_bytes, int64_t{4} << 30);

  absl::StatusOr<placement::ClusterSpec> spec = BuildClusterSpec("test", free_nodes);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices(), 3);
  ASSERT_EQ(spec->nodes.size(), 2u);
  const placement::NodeSpec& a = spec->nodes[0];
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.device_kind, "cpu");
  EXPECT_EQ(a.measured_flops_fp32, 3e10);
  EXPECT_EQ(a.measured_half_dim, 40);
  EXPECT_EQ(a.memory_bandwidth, 5e9);  // the measured optimizer step replaces the kind's
  EXPECT_EQ(a.intra_node.measured_bandwidth, 5e9);
  EXPECT_EQ(a.intra_node.latency_s, 2e-5);  // measured latency replaces the nominal one
  EXPECT_EQ(a.inter_node.measured_bandwidth, 1e9);
  EXPECT_EQ(a.inter_node.latency_s, 1e-4);
  EXPECT_EQ(spec->nodes[1].measured_flops_fp32, 0);
  EXPECT_LT(spec->nodes[1].measured_half_dim, 0);
  EXPECT_EQ(spec->nodes[1].memory_bandwidth, placement::FindDeviceKind("cpu")->memory_bandwidth);

  // Every alive device, busy or not.
  const auto all = PlannableNodes(membership, book, DeviceInfo::Kind::kCpu, false, nullptr);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].devices, 2);
  // No device of the kind: nothing to plan on.
  const auto cuda = PlannableNodes(membership, book, DeviceInfo::Kind::kCuda, false, nullptr);
  EXPECT_TRUE(cuda.empty());
  EXPECT_THAT(std::string(BuildClusterSpec("test", cuda).status().message()),
              HasSubstr("cluster 'test' has no device to plan on"));
}

}  // namespace
}  // namespace shardline::coordinator
