// ClusterSpec: the devices a job may run on, as the placement planner sees them — nodes of devices
// with their memory and speed, and the two kinds of link between devices (inside a node, between
// nodes). It comes from YAML (`shardline plan --cluster FILE`, examples/cluster-*.yaml) or from the
// live coordinator's membership (ClusterSpecFromNodes), and start-up calibration by the actors
// fills in what was measured (the measured_* fields; see planner.h for how the time model uses
// them). No I/O here beyond loading YAML.
//
// Units are SI base units throughout: bytes, bytes per second, FLOP per second, seconds. YAML
// spells the big ones in the units people quote (GiB of memory, TFLOP/s, GB/s, µs) and says so in
// the key's name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::placement {

// The arithmetic precision of training: kFp32 is the CPU path (fp32 everywhere), kBf16 the GPU
// path (bf16 compute with fp32 master weights). YAML spellings "fp32", "bf16".
enum class Precision { kFp32, kBf16 };
std::string_view PrecisionName(Precision precision);

// One kind of link as one device sees it. Bandwidths are per device and per direction: what one
// device can push while every device of its node pushes at the same time (NVLink per GPU; for the
// inter-node link, the node's network bandwidth divided among its devices).
struct LinkSpec {
  double bandwidth = 0;           // bytes/s, nominal (datasheet)
  double latency_s = 0;           // start-up cost of one message or one collective step
  double measured_bandwidth = 0;  // bytes/s, calibration (all-reduce bus bandwidth); 0: unmeasured

  // What the time model uses: the measurement when there is one, else the nominal bandwidth.
  double Effective() const { return measured_bandwidth > 0 ? measured_bandwidth : bandwidth; }
};

struct NodeSpec {
  std::string id;              // unique in the cluster; the coordinator's node id
  std::string device_kind;     // "a100-80gb", "h100-sxm", "h200", "cpu", or any label (see below)
  int devices = 0;             // devices (actors) on this node
  int64_t device_memory = 0;   // bytes per device
  double peak_flops_fp32 = 0;  // FLOP/s per device, dense, datasheet
  double peak_flops_bf16 = 0;
  // Calibration: the FLOP/s one device reaches on a transformer layer's forward and backward
  // (FLOPs counted as DeriveModel counts them), approached by wide layers; 0: unmeasured.
  double measured_flops_fp32 = 0;
  double measured_flops_bf16 = 0;
  // Calibration: the layer size x = min(tokens per micro-batch, d_model) at which a layer gets
  // half of measured_flops; a layer of size x runs at measured·x/(x + h). < 0: not measured (the
  // cost model's default fall-off).
  double measured_half_dim = -1;
  double memory_bandwidth = 0;  // bytes/s per device (HBM, or the DRAM share of a CPU actor)
  // Bytes per device the runtime holds before the model allocates anything (CUDA context, cuBLAS
  // workspace, NCCL buffers); the planner takes it off device_memory.
  int64_t runtime_memory = 0;
  LinkSpec intra_node;  // between devices of this node (NVLink; loopback for CPUs)
  LinkSpec inter_node;  // from this node's devices to other nodes (InfiniBand, TCP)

  double PeakFlops(Precision p) const {
    return p == Precision::kFp32 ? peak_flops_fp32 : peak_flops_bf16;
  }
  double MeasuredFlops(Precision p) const {
    return p == Precision::kFp32 ? measured_flops_fp32 : measured_flops_bf16;
  }
};

struct ClusterSpec {
  std::string name;
  std::vector<NodeSpec> nodes;  // in the order given; node order is the planner's tie-break

  int64_t devices() const {
    int64_t n = 0;
    for (const NodeSpec& node : nodes) n += node.devices;
    return n;
  }
};

// What a known device kind brings when the spec does not say otherwise. Every number's source is
// written next to it in cluster_spec.cc.
struct DeviceKindDefaults {
  std::string_view kind;
  int devices_per_node = 0;  // 0: no default (the spec must say)
  int64_t device_memory = 0;
  double peak_flops_fp32 = 0;
  double peak_flops_bf16 = 0;
  double memory_bandwidth = 0;
  int64_t runtime_memory = 0;
  LinkSpec intra_node;
  LinkSpec inter_node;
};

// The known kinds: "a100-80gb", "a100-40gb", "h100-sxm", "h200", "cpu" (see cluster_spec.cc).
const std::vector<DeviceKindDefaults>& KnownDeviceKinds();
// The defaults of `kind` (exact spelling), or nullptr.
const DeviceKindDefaults* FindDeviceKind(std::string_view kind);
// A known kind for what a driver reports ("NVIDIA A100-SXM4-80GB" → "a100-80gb",
// "NVIDIA H100 80GB HBM3" → "h100-sxm", "cpu" → "cpu"); anything else is returned lower-cased, as
// an unknown kind.
std::string NormalizeDeviceKind(std::string_view reported);

// OK, or InvalidArgument naming the field: "nodes[2] (id 'gpu-2').devices: must be at least 1,
// got 0". Checks: at least one node; ids non-empty and unique; devices >= 1; device_memory > 0;
// peak FLOP/s of both precisions > 0 (or a measurement for it); bandwidths > 0; latencies >= 0;
// measurements >= 0; the total device count fits in an int.
absl::Status ValidateClusterSpec(const ClusterSpec& spec);

// Parses and validates a cluster spec (examples/cluster-*.yaml document the keys):
//
//   name: a100-64x8
//   devices: 512              # optional: the total, checked against the nodes
//   nodes:
//     - name: a100            # ids a100-0 .. a100-63 (just "a100" when count is 1)
//       count: 64             # identical nodes; default 1
//       devices: 8            # per node; default: the kind's
//       device_kind: a100-80gb
//       device_memory: 80GiB  # per device; default: the kind's
//       peak_tflops: {fp32: 19.5, bf16: 312}
//       measured_tflops: {fp32: 0, bf16: 0}   # layer rate (calibration), 0: unmeasured
//       measured_half_dim: 64   # its fall-off with min(tokens, d_model); default: none
//       memory_bandwidth_gb_s: 2039
//       runtime_memory: 2GiB  # per device, taken by CUDA/NCCL before the model
//       intra_node: {bandwidth_gb_s: 300, latency_us: 3, measured_bandwidth_gb_s: 0}
//       inter_node: {bandwidth_gb_s: 25, latency_us: 5, measured_bandwidth_gb_s: 0}
//
// Errors are InvalidArgument "SOURCE:LINE:COL: PATH: message" (yaml_reader.h), e.g.
// "c.yaml:4:14: nodes[0].devices: must be ≥ 1, got 0"; an unknown device_kind without every
// number given names the missing key.
absl::StatusOr<ClusterSpec> ParseClusterSpec(const std::string& yaml_text,
                                             const std::string& source_name);
// Reads and parses `path`; NotFound naming the path when it does not exist.
absl::StatusOr<ClusterSpec> LoadClusterSpecFile(const std::string& path);

// AdamW's update touches every parameter it owns: reads p, g, m, v and writes p, m, v (7 fp32
// words; under mixed precision the fp32 master, m and v are read and written, the bf16 gradient
// read and the bf16 copy written: about the same), plus one read of the gradient for the global
// norm: 8 × 4 bytes. On GPUs the update is memory-bound (a handful of FLOPs per 32 bytes), and the
// time model divides these bytes by NodeSpec::memory_bandwidth; on CPU actors calibration measures
// the update and reports its rate in these bytes.
inline constexpr double kOptimizerBytesPerParam = 32;

// One node as the coordinator's membership knows it, with what calibration measured.
struct NodeReport {
  std::string node_id;
  std::string device_kind;  // "cpu", "cuda", or a driver's device name (NormalizeDeviceKind)
  int devices = 0;
  int64_t memory_bytes = 0;   // per device; 0: the kind's default
  double measured_flops = 0;  // layer FLOP/s per device in measured_precision (NodeSpec); 0: none
  double measured_half_dim = -1;  // its fall-off (NodeSpec::measured_half_dim); < 0: none
  // The optimizer step's rate in kOptimizerBytesPerParam bytes per parameter (calibration);
  // replaces the kind's memory_bandwidth, which the time model uses for nothing else. 0: none.
  double measured_memory_bandwidth = 0;
  Precision measured_precision = Precision::kFp32;
  double measured_intra_bandwidth = 0;  // bytes/s per device (all-reduce bus bandwidth); 0: none
  double measured_inter_bandwidth = 0;
};

// A validated ClusterSpec from membership: each node takes its kind's defaults (an unknown kind
// takes the "cpu" defaults for the links and needs memory_bytes and a measured_flops), then the
// report's numbers. InvalidArgument naming the node and field ("node 'n3': devices must be at
// least 1, got 0"; "node 'n3': device kind 'cuda' is unknown: report memory_bytes").
absl::StatusOr<ClusterSpec> ClusterSpecFromNodes(std::string name,
                                                 const std::vector<NodeReport>& nodes);

}  // namespace shardline::placement
