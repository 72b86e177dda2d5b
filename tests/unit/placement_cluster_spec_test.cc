#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "placement/cluster_spec.h"
#include "tests/support/source_dir.h"

namespace shardline::placement {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

using test_support::SourceDir;

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(text, "c.yaml");
  EXPECT_FALSE(spec.ok()) << "parsed unexpectedly:\n" << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return Message(spec.status());
}

TEST(ClusterSpecTest, KnownKindFillsEverything) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "name: a\n"
      "nodes:\n"
      "  - name: gpu\n"
      "    count: 3\n"
      "    device_kind: a100-80gb\n",
      "c.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "a");
  ASSERT_EQ(spec->nodes.size(), 3u);
  EXPECT_EQ(spec->devices(), 24);
  EXPECT_EQ(spec->nodes[0].id, "gpu-0");
  EXPECT_EQ(spec->nodes[2].id, "gpu-2");
  const NodeSpec& n = spec->nodes[1];
  EXPECT_EQ(n.devices, 8);
  EXPECT_EQ(n.device_memory, int64_t{80} << 30);
  EXPECT_DOUBLE_EQ(n.peak_flops_bf16, 312e12);
  EXPECT_DOUBLE_EQ(n.peak_flops_fp32, 19.5e12);
  EXPECT_DOUBLE_EQ(n.intra_node.bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(n.inter_node.bandwidth, 25e9);
  EXPECT_EQ(n.measured_flops_bf16, 0);
  EXPECT_EQ(n.intra_node.Effective(), 300e9);
}

TEST(ClusterSpecTest, OverridesAndMeasurements) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "name: a\n"
      "nodes:\n"
      "  - name: one\n"
      "    devices: 4\n"
      "    device_kind: h100-sxm\n"
      "    device_memory: 40GiB\n"
      "    measured_tflops: {bf16: 700}\n"
      "    measured_half_dim: 96\n"
      "    intra_node: {measured_bandwidth_gb_s: 380, latency_us: 1.5}\n",
      "c.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->nodes.size(), 1u);
  const NodeSpec& n = spec->nodes[0];
  EXPECT_EQ(n.id, "one");
  EXPECT_EQ(n.devices, 4);
  EXPECT_EQ(n.device_memory, int64_t{40} << 30);
  EXPECT_DOUBLE_EQ(n.measured_flops_bf16, 700e12);
  EXPECT_DOUBLE_EQ(n.MeasuredFlops(Precision::kBf16), 700e12);
  EXPECT_DOUBLE_EQ(n.measured_half_dim, 96);
  EXPECT_DOUBLE_EQ(n.intra_node.bandwidth, 450e9);  // the kind's
  EXPECT_DOUBLE_EQ(n.intra_node.measured_bandwidth, 380e9);
  EXPECT_DOUBLE_EQ(n.intra_node.Effective(), 380e9);
  EXPECT_DOUBLE_EQ(n.intra_node.latency_s, 1.5e-6);
}

TEST(ClusterSpecTest, ExamplesParse) {
  for (const char* name : {"cluster-local-cpu.yaml", "cluster-a100-80gb.yaml", "cluster-h100.yaml",
                           "cluster-mixed.yaml"}) {
    absl::StatusOr<ClusterSpec> spec = LoadClusterSpecFile(SourceDir() + "/examples/" + name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_GT(spec->devices(), 0) << name;
  }
  absl::StatusOr<ClusterSpec> h100 =
      LoadClusterSpecFile(SourceDir() + "/examples/cluster-h100.yaml");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->devices(), 512);
  absl::StatusOr<ClusterSpec> cpu =
      LoadClusterSpecFile(SourceDir() + "/examples/cluster-local-cpu.yaml");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->devices(), 4);
  EXPECT_EQ(cpu->nodes[0].runtime_memory, 0);
}

TEST(ClusterSpecTest, MissingFileIsNotFound) {
  absl::StatusOr<ClusterSpec> spec = LoadClusterSpecFile("/nonexistent/cluster.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
}

TEST(ClusterSpecTest, ZeroDevicesNamesTheField) {
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: gpu\n"
                      "    devices: 0\n"
                      "    device_kind: a100-80gb\n"),
              HasSubstr("c.yaml:4:14: nodes[0].devices: must be between 1 and 1024, got 0"));
}

TEST(ClusterSpecTest, InconsistentTotalNamesTheField) {
  EXPECT_THAT(ErrorOf("name: a\n"
                      "devices: 16\n"
                      "nodes:\n"
                      "  - name: gpu\n"
                      "    count: 3\n"
                      "    device_kind: a100-80gb\n"
                      "  - name: small\n"
                      "    devices: 2\n"
                      "    device_kind: a100-80gb\n"),
              HasSubstr("c.yaml:2:10: devices: says 16 devices but the nodes have 26 (3×8 + 1×2)"));
}

TEST(ClusterSpecTest, UnknownKindNeedsItsNumbers) {
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: x\n"
                      "    devices: 4\n"
                      "    device_kind: mi300x\n"),
              HasSubstr("nodes[0].device_memory: required for device_kind 'mi300x', which has no "
                        "defaults (known kinds: a100-80gb"));
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: x\n"
                      "    devices: 4\n"
                      "    device_kind: mi300x\n"
                      "    device_memory: 192GB\n"
                      "    peak_tflops: {bf16: 1300}\n"),
              HasSubstr("nodes[0].peak_tflops.fp32: required for device_kind 'mi300x'"));
  // Everything given: an unknown kind is fine, and bf16 defaults to fp32.
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "name: a\n"
      "nodes:\n"
      "  - name: x\n"
      "    devices: 4\n"
      "    device_kind: mi300x\n"
      "    device_memory: 192GB\n"
      "    peak_tflops: {fp32: 160}\n"
      "    memory_bandwidth_gb_s: 5300\n"
      "    intra_node: {bandwidth_gb_s: 64}\n"
      "    inter_node: {bandwidth_gb_s: 50}\n",
      "c.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->nodes[0].peak_flops_bf16, 160e12);
}

TEST(ClusterSpecTest, CpuNeedsMemory) {
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: h\n"
                      "    devices: 2\n"
                      "    device_kind: cpu\n"),
              HasSubstr("nodes[0].device_memory: required for device_kind 'cpu'"));
}

TEST(ClusterSpecTest, OtherErrors) {
  EXPECT_THAT(ErrorOf("name: a\nnodes: []\n"), HasSubstr("nodes: the list is empty"));
  EXPECT_THAT(ErrorOf("name: a\nnodes:\n  - name: g\n    device_kind: a100-80gb\n    cout: 2\n"),
              HasSubstr("c.yaml:5:5: nodes[0].cout: unknown key 'cout' in nodes[0]; did you mean "
                        "'count'?"));
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: g\n"
                      "    count: 2\n"
                      "    device_kind: a100-80gb\n"
                      "  - name: g-1\n"
                      "    device_kind: a100-80gb\n"),
              HasSubstr("nodes[1].name: makes node id 'g-1', which nodes[0] makes too"));
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: g\n"
                      "    device_kind: a100-80gb\n"
                      "    intra_node: {bandwidth_gb_s: 0}\n"),
              HasSubstr("nodes[0].intra_node.bandwidth_gb_s: must be > 0, got 0"));
  EXPECT_THAT(ErrorOf("name: a\n"
                      "nodes:\n"
                      "  - name: g\n"
                      "    device_kind: a100-80gb\n"
                      "    measured_half_dim: -3\n"),
              HasSubstr("nodes[0].measured_half_dim: must be"));
  EXPECT_THAT(
      ErrorOf("name: a\n"
              "nodes:\n"
              "  - name: g\n"
              "    device_kind: a100-80gb\n"
              "    device_memory: 1GiB\n"),
      HasSubstr("nodes[0].runtime_memory: runtime_memory (2147483648 bytes) leaves nothing"));
}

TEST(ClusterSpecTest, ValidateNamesNodeAndField) {
  ClusterSpec spec;
  spec.name = "hand";
  NodeSpec a;
  a.id = "a";
  a.device_kind = "cpu";
  a.devices = 2;
  a.device_memory = 1 << 30;
  a.peak_flops_fp32 = a.peak_flops_bf16 = 1e11;
  a.memory_bandwidth = 1e10;
  a.intra_node.bandwidth = a.inter_node.bandwidth = 1e9;
  spec.nodes = {a, a};
  spec.nodes[1].id = "b";
  EXPECT_TRUE(ValidateClusterSpec(spec).ok());

  ClusterSpec zero = spec;
  zero.nodes[1].devices = 0;
  EXPECT_EQ(Message(ValidateClusterSpec(zero)),
            "nodes[1] (id 'b').devices: must be at least 1, got 0");
  ClusterSpec dup = spec;
  dup.nodes[1].id = "a";
  EXPECT_THAT(Message(ValidateClusterSpec(dup)),
              HasSubstr("nodes[1] (id 'a').id: 'a' is also the id of nodes[0]"));
  ClusterSpec no_memory = spec;
  no_memory.nodes[0].device_memory = 0;
  EXPECT_THAT(Message(ValidateClusterSpec(no_memory)),
              HasSubstr("nodes[0] (id 'a').device_memory: must be more than 0 bytes"));
  ClusterSpec no_flops = spec;
  no_flops.nodes[0].peak_flops_bf16 = 0;
  EXPECT_THAT(Message(ValidateClusterSpec(no_flops)),
              HasSubstr("nodes[0] (id 'a').peak_flops_bf16: must be more than 0"));
  no_flops.nodes[0].measured_flops_bf16 = 5e10;  // a measurement is enough
  EXPECT_TRUE(ValidateClusterSpec(no_flops).ok());
  EXPECT_THAT(Message(ValidateClusterSpec(ClusterSpec{})), HasSubstr("the cluster has no node"));
}

TEST(ClusterSpecTest, NormalizeDeviceKind) {
  EXPECT_EQ(NormalizeDeviceKind("NVIDIA A100-SXM4-80GB"), "a100-80gb");
  EXPECT_EQ(NormalizeDeviceKind("NVIDIA A100-SXM4-40GB"), "a100-40gb");
  EXPECT_EQ(NormalizeDeviceKind("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(NormalizeDeviceKind("NVIDIA H200"), "h200");
  EXPECT_EQ(NormalizeDeviceKind("CPU"), "cpu");
  EXPECT_EQ(NormalizeDeviceKind("Something Else"), "something else");
  EXPECT_NE(FindDeviceKind("h100-sxm"), nullptr);
  EXPECT_EQ(FindDeviceKind("h100"), nullptr);
  EXPECT_EQ(KnownDeviceKinds().size(), 5u);
}

TEST(ClusterSpecTest, FromMembership) {
  std::vector<NodeReport> reports(2);
  reports[0].node_id = "host-a";
  reports[0].device_kind = "cpu";
  reports[0].devices = 2;
  reports[0].memory_bytes = int64_t{4} << 30;
  reports[0].measured_flops = 3e10;
  reports[0].measured_intra_bandwidth = 2e9;
  reports[1].node_id = "gpu-b";
  reports[1].device_kind = "NVIDIA H100 80GB HBM3";
  reports[1].devices = 8;
  reports[1].measured_flops = 7e14;
  reports[1].measured_precision = Precision::kBf16;
  absl::StatusOr<ClusterSpec> spec = ClusterSpecFromNodes("live", reports);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "live");
  EXPECT_EQ(spec->devices(), 10);
  EXPECT_EQ(spec->nodes[0].device_kind, "cpu");
  EXPECT_EQ(spec->nodes[0].device_memory, int64_t{4} << 30);
  EXPECT_DOUBLE_EQ(spec->nodes[0].measured_flops_fp32, 3e10);
  EXPECT_DOUBLE_EQ(spec->nodes[0].intra_node.measured_bandwidth, 2e9);
  EXPECT_EQ(spec->nodes[1].device_kind, "h100-sxm");
  EXPECT_EQ(spec->nodes[1].device_memory, int64_t{80} << 30);
  EXPECT_DOUBLE_EQ(spec->nodes[1].measured_flops_bf16, 7e14);
  EXPECT_EQ(spec->nodes[1].measured_flops_fp32, 0);
}

TEST(ClusterSpecTest, FromMembershipErrors) {
  NodeReport r;
  r.node_id = "n3";
  r.device_kind = "cpu";
  r.devices = 0;
  r.memory_bytes = 1 << 30;
  EXPECT_EQ(Message(ClusterSpecFromNodes("c", {r}).status()),
            "node 'n3': devices must be at least 1, got 0");
  r.devices = 2;
  r.memory_bytes = 0;
  EXPECT_THAT(Message(ClusterSpecFromNodes("c", {r}).status()),
              HasSubstr("node 'n3': device kind 'cpu' has no default memory: report memory_bytes"));
  r.device_kind = "cuda";
  r.memory_bytes = int64_t{16} << 30;
  EXPECT_THAT(Message(ClusterSpecFromNodes("c", {r}).status()),
              HasSubstr("node 'n3': device kind 'cuda' is unknown"));
  r.measured_flops = 1e14;  // calibration makes an unknown kind plannable
  absl::StatusOr<ClusterSpec> spec = ClusterSpecFromNodes("c", {r});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->nodes[0].peak_flops_bf16, 1e14);
  NodeReport twin = r;
  EXPECT_THAT(Message(ClusterSpecFromNodes("c", {r, twin}).status()),
              HasSubstr("nodes[1] (id 'n3').id: 'n3' is also the id of nodes[0]"));
  EXPECT_THAT(Message(ClusterSpecFromNodes("c", {}).status()), HasSubstr("no node"));
  // A measured optimizer rate replaces the memory bandwidth; a negative one is refused.
  r.measured_memory_bandwidth = 6e9;
  spec = ClusterSpecFromNodes("c", {r});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->nodes[0].memory_bandwidth, 6e9);
  r.measured_memory_bandwidth = -1;
  EXPECT_THAT(Message(ClusterSpecFromNodes("c", {r}).status()),
              HasSubstr("node 'n3': measurements must be ≥ 0 (0: not measured), got flops 1e+14, "
                        "intra 0, inter 0, optimizer -1"));
}

}  // namespace
}  // namespace shardline::placement
