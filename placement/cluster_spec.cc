#include "placement/cluster_spec.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "placement/string_view_compat.h"
#include "placement/yaml_reader.h"

namespace shardline::placement {
namespace {

constexpr double kGB = 1e9;  // decimal, as bandwidths are quoted
constexpr double kTera = 1e12;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr double kMicro = 1e-6;

// The known device kinds. Bandwidths are per device and per direction (see LinkSpec).
//
// Latencies are the start-up cost of one collective step, not a port's wire latency; they only
// matter for small messages (tensor-parallel all-reduces of small models, pipeline sends of one
// short sequence). The GPU values are the order of nccl-tests' small-message times inside an
// NVLink/NVSwitch node (a few µs) and over InfiniBand (5-10 µs).
//
// runtime_memory on GPUs: the CUDA context (~0.5 GiB with the kernels of cuBLAS/cuDNN loaded),
// cuBLAS workspaces and NCCL's channel buffers (NCCL_BUFFSIZE 4 MiB per channel per peer) — 2 GiB
// is what Megatron-LM/DeepSpeed users commonly see unavailable to tensors on an 80 GB card.
const std::vector<DeviceKindDefaults>& Kinds() {
  static const std::vector<DeviceKindDefaults> kinds = {
      // NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 80 GB HBM2e at 2,039 GB/s, BF16 tensor
      // 312 TFLOP/s dense (624 with sparsity), FP32 19.5 TFLOP/s, NVLink 600 GB/s (both directions
      // together). DGX A100 datasheet: 8 GPUs per node on NVSwitch, 8 × 200 Gb/s HDR InfiniBand
      // compute ports (one per GPU: 25 GB/s per direction).
      {.kind = "a100-80gb",
       .devices_per_node = 8,
       .device_memory = 80 * kGiB,
       .peak_flops_fp32 = 19.5 * kTera,
       .peak_flops_bf16 = 312 * kTera,
       .memory_bandwidth = 2039 * kGB,
       .runtime_memory = 2 * kGiB,
       .intra_node = {.bandwidth = 300 * kGB, .latency_s = 3 * kMicro},
       .inter_node = {.bandwidth = 25 * kGB, .latency_s = 6 * kMicro}},
      // The same datasheet, SXM4 40GB: 40 GB HBM2 at 1,555 GB/s; compute and links as above.
      {.kind = "a100-40gb",
       .devices_per_node = 8,
       .device_memory = 40 * kGiB,
       .peak_flops_fp32 = 19.5 * kTera,
       .peak_flops_bf16 = 312 * kTera,
       .memory_bandwidth = 1555 * kGB,
       .runtime_memory = 2 * kGiB,
       .intra_node = {.bandwidth = 300 * kGB, .latency_s = 3 * kMicro},
       .inter_node = {.bandwidth = 25 * kGB, .latency_s = 6 * kMicro}},
      // NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3 at 3.35 TB/s, BF16 tensor 989.4
      // TFLOP/s dense (1,979 with sparsity), FP32 67 TFLOP/s, NVLink 900 GB/s (both directions).
      // DGX H100 datasheet: 8 GPUs on NVSwitch, 8 × 400 Gb/s NDR ConnectX-7 (50 GB/s per GPU).
      {.kind = "h100-sxm",
       .devices_per_node = 8,
       .device_memory = 80 * kGiB,
       .peak_flops_fp32 = 67 * kTera,
       .peak_flops_bf16 = 989.4 * kTera,
       .memory_bandwidth = 3350 * kGB,
       .runtime_memory = 2 * kGiB,
       .intra_node = {.bandwidth = 450 * kGB, .latency_s = 3 * kMicro},
       .inter_node = {.bandwidth = 50 * kGB, .latency_s = 6 * kMicro}},
      // NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s; compute and NVLink as H100 SXM.
      // DGX H200: 8 × 400 Gb/s ConnectX-7 as DGX H100.
      {.kind = "h200",
       .devices_per_node = 8,
       .device_memory = int64_t{141'000'000'000},
       .peak_flops_fp32 = 67 * kTera,
       .peak_flops_bf16 = 989.4 * kTera,
       .memory_bandwidth = 4800 * kGB,
       .runtime_memory = 2 * kGiB,
       .intra_node = {.bandwidth = 450 * kGB, .latency_s = 3 * kMicro},
       .inter_node = {.bandwidth = 50 * kGB, .latency_s = 6 * kMicro}},
      // A CPU actor (one process; the agent gives it a share of the node's cores). No memory
      // default: that is the host's to say. Peak: one x86 core with two AVX2 FMA units, 8 fp32
      // lanes each, at ~3 GHz is 2·8·2·3e9 ≈ 96 GFLOP/s (Intel's optimization manual gives 32
      // fp32 FLOP/cycle for Haswell and later); CPUs have no faster bf16 GEMM in OpenBLAS, so bf16
      // is the same. Memory bandwidth: a DDR4-3200 channel is 25.6 GB/s, shared by the actors of
      // a node; 10 GB/s is one actor's share on a small host. Links: Gloo over TCP loopback moves
      // ~1-3 GB/s with ~30 µs per round; between hosts, 10 Gb Ethernet (1.25 GB/s, ~50 µs).
      // Calibration replaces the compute and link numbers, which vary by host far more than
      // between GPU boards.
      {.kind = "cpu",
       .devices_per_node = 0,
       .device_memory = 0,
       .peak_flops_fp32 = 96e9,
       .peak_flops_bf16 = 96e9,
       .memory_bandwidth = 10 * kGB,
       .runtime_memory = 0,
       .intra_node = {.bandwidth = 1 * kGB, .latency_s = 30 * kMicro},
       .inter_node = {.bandwidth = 1.25 * kGB, .latency_s = 50 * kMicro}},
  };
  return kinds;
}

std::string KnownKindList() {
  std::vector<std::string> names;
  for (const DeviceKindDefaults& kind : Kinds()) names.emplace_back(kind.kind);
  return absl::StrJoin(names, ", ");
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// "nodes[2] (id 'gpu-2')" for validation messages.
std::string NodeName(size_t index, const NodeSpec& node) {
  return absl::StrCat("nodes[", index, "] (id '", node.id, "')");
}

absl::Status FieldError(size_t index, const NodeSpec& node, std::string_view field,
                        std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(NodeName(index, node), ".", AbslView(field), ": ", AbslView(message)));
}

NodeSpec FromDefaults(const DeviceKindDefaults& d) {
  NodeSpec node;
  node.device_kind = std::string(d.kind);
  node.devices = d.devices_per_node;
  node.device_memory = d.device_memory;
  node.peak_flops_fp32 = d.peak_flops_fp32;
  node.peak_flops_bf16 = d.peak_flops_bf16;
  node.memory_bandwidth = d.memory_bandwidth;
  node.runtime_memory = d.runtime_memory;
  node.intra_node = d.intra_node;
  node.inter_node = d.inter_node;
  return node;
}

// ---- YAML ----

constexpr std::string_view kName = "name";
constexpr std::string_view kDevices = "devices";
constexpr std::string_view kNodes = "nodes";
constexpr std::string_view kCount = "count";
constexpr std::string_view kDeviceKind = "device_kind";
constexpr std::string_view kDeviceMemory = "device_memory";
constexpr std::string_view kPeakTflops = "peak_tflops";
constexpr std::string_view kMeasuredTflops = "measured_tflops";
constexpr std::string_view kMeasuredHalfDim = "measured_half_dim";
constexpr std::string_view kMemoryBandwidth = "memory_bandwidth_gb_s";
constexpr std::string_view kRuntimeMemory = "runtime_memory";
constexpr std::string_view kIntraNode = "intra_node";
constexpr std::string_view kInterNode = "inter_node";
constexpr std::string_view kFp32 = "fp32";
constexpr std::string_view kBf16 = "bf16";
constexpr std::string_view kBandwidth = "bandwidth_gb_s";
constexpr std::string_view kLatency = "latency_us";
constexpr std::string_view kMeasuredBandwidth = "measured_bandwidth_gb_s";

// Past these a spec is a typo: a million nodes, 1024 devices in one node, a PiB per device.
constexpr int64_t kMaxNodes = 1 << 20;
constexpr int64_t kMaxDevicesPerNode = 1024;
constexpr int64_t kMaxDeviceMemory = int64_t{1} << 50;

// "required for device_kind 'x', which has no defaults (known kinds: ...)".
absl::Status MissingForUnknownKind(const YamlMap& map, std::string_view key,
                                   const std::string& kind) {
  return map.ErrorAt(key,
                     absl::StrCat("required for device_kind '", kind,
                                  "', which has no defaults (known kinds: ", KnownKindList(), ")"));
}

absl::Status ParseLink(const YamlMap& parent, std::string_view key, bool known_kind,
                       const std::string& kind, LinkSpec& link) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   parent.OptionalMap(key, {kBandwidth, kLatency, kMeasuredBandwidth}));
  if (!known_kind && !map.Has(kBandwidth)) {
    return MissingForUnknownKind(map, kBandwidth, kind);
  }
  ASSIGN_OR_RETURN(const double bandwidth,
                   map.OptionalDouble(kBandwidth, link.bandwidth / kGB,
                                      {.min = 0, .max = 1e6, .min_exclusive = true}));
  ASSIGN_OR_RETURN(const double latency,
                   map.OptionalDouble(kLatency, link.latency_s / kMicro, {.min = 0, .max = 1e6}));
  ASSIGN_OR_RETURN(const double measured,
                   map.OptionalDouble(kMeasuredBandwidth, link.measured_bandwidth / kGB,
                                      {.min = 0, .max = 1e6}));
  link.bandwidth = bandwidth * kGB;
  link.latency_s = latency * kMicro;
  link.measured_bandwidth = measured * kGB;
  return absl::OkStatus();
}

// One `nodes:` entry: `count` identical nodes.
absl::Status ParseNodeGroup(const YamlMap& map, std::vector<NodeSpec>& nodes) {
  ASSIGN_OR_RETURN(const std::string name, map.RequiredString(kName));
  if (name.empty()) return map.ErrorAt(kName, "must not be empty");
  ASSIGN_OR_RETURN(const int64_t count, map.OptionalInt64(kCount, 1, {.min = 1, .max = kMaxNodes}));
  ASSIGN_OR_RETURN(const std::string kind, map.RequiredString(kDeviceKind));
  const DeviceKindDefaults* defaults = FindDeviceKind(kind);
  const bool known = defaults != nullptr;
  NodeSpec node = known ? FromDefaults(*defaults) : NodeSpec{};
  node.device_kind = kind;

  if (!map.Has(kDevices) && node.devices == 0) {
    return known ? map.ErrorAt(kDevices, absl::StrCat("required for device_kind '", kind,
                                                      "' (devices per node)"))
                 : MissingForUnknownKind(map, kDevices, kind);
  }
  ASSIGN_OR_RETURN(const int64_t devices, map.OptionalInt64(kDevices, node.devices,
                                                            {.min = 1, .max = kMaxDevicesPerNode}));
  node.devices = static_cast<int>(devices);

  if (!map.Has(kDeviceMemory) && node.device_memory == 0) {
    return known ? map.ErrorAt(kDeviceMemory, absl::StrCat("required for device_kind '", kind,
                                                           "' (memory per device, e.g. 8GiB)"))
                 : MissingForUnknownKind(map, kDeviceMemory, kind);
  }
  ASSIGN_OR_RETURN(node.device_memory, map.OptionalBytes(kDeviceMemory, node.device_memory,
                                                         {.min = 1, .max = kMaxDeviceMemory}));

  ASSIGN_OR_RETURN(const YamlMap peak, map.OptionalMap(kPeakTflops, {kFp32, kBf16}));
  if (!known && !peak.Has(kFp32)) return MissingForUnknownKind(peak, kFp32, kind);
  const DoubleRange tflops{.min = 0, .max = 1e6, .min_exclusive = true};
  ASSIGN_OR_RETURN(const double fp32,
                   peak.OptionalDouble(kFp32, node.peak_flops_fp32 / kTera, tflops));
  // An unknown device without a bf16 figure: assume no faster bf16 path (as CPUs).
  const double bf16_default = known ? node.peak_flops_bf16 / kTera : fp32;
  ASSIGN_OR_RETURN(const double bf16, peak.OptionalDouble(kBf16, bf16_default, tflops));
  node.peak_flops_fp32 = fp32 * kTera;
  node.peak_flops_bf16 = bf16 * kTera;

  ASSIGN_OR_RETURN(const YamlMap measured, map.OptionalMap(kMeasuredTflops, {kFp32, kBf16}));
  ASSIGN_OR_RETURN(const double m32, measured.OptionalDouble(kFp32, 0, {.min = 0, .max = 1e6}));
  ASSIGN_OR_RETURN(const double m16, measured.OptionalDouble(kBf16, 0, {.min = 0, .max = 1e6}));
  node.measured_flops_fp32 = m32 * kTera;
  node.measured_flops_bf16 = m16 * kTera;
  ASSIGN_OR_RETURN(node.measured_half_dim,
                   map.OptionalDouble(kMeasuredHalfDim, -1, {.min = 0, .max = 1e9}));

  if (!known && !map.Has(kMemoryBandwidth)) {
    return MissingForUnknownKind(map, kMemoryBandwidth, kind);
  }
  ASSIGN_OR_RETURN(const double memory_bandwidth,
                   map.OptionalDouble(kMemoryBandwidth, node.memory_bandwidth / kGB,
                                      {.min = 0, .max = 1e6, .min_exclusive = true}));
  node.memory_bandwidth = memory_bandwidth * kGB;
  ASSIGN_OR_RETURN(node.runtime_memory,
                   map.OptionalBytes(kRuntimeMemory, node.runtime_memory, {.min = 0}));
  if (node.runtime_memory >= node.device_memory) {
    return map.ErrorAt(kRuntimeMemory, absl::StrCat("runtime_memory (", node.runtime_memory,
                                                    " bytes) leaves nothing of device_memory (",
                                                    node.device_memory, " bytes) for the model"));
  }
  RETURN_IF_ERROR(ParseLink(map, kIntraNode, known, kind, node.intra_node));
  RETURN_IF_ERROR(ParseLink(map, kInterNode, known, kind, node.inter_node));

  for (int64_t i = 0; i < count; ++i) {
    node.id = count == 1 ? name : absl::StrCat(name, "-", i);
    nodes.push_back(node);
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view PrecisionName(Precision precision) {
  return precision == Precision::kFp32 ? "fp32" : "bf16";
}

const std::vector<DeviceKindDefaults>& KnownDeviceKinds() { return Kinds(); }

const DeviceKindDefaults* FindDeviceKind(std::string_view kind) {
  for (const DeviceKindDefaults& d : Kinds()) {
    if (d.kind == kind) return &d;
  }
  return nullptr;
}

std::string NormalizeDeviceKind(std::string_view reported) {
  const std::string name = Lower(reported);
  if (FindDeviceKind(name) != nullptr) return name;
  // The names nvidia-smi and cudaGetDeviceProperties report: "NVIDIA A100-SXM4-80GB",
  // "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA H200".
  if (Contains(name, "a100")) return Contains(name, "80g") ? "a100-80gb" : "a100-40gb";
  if (Contains(name, "h200")) return "h200";
  if (Contains(name, "h100")) return "h100-sxm";
  return name;
}

absl::Status ValidateClusterSpec(const ClusterSpec& spec) {
  if (spec.nodes.empty()) {
    return absl::InvalidArgumentError("nodes: the cluster has no node: a plan needs a device");
  }
  absl::flat_hash_map<std::string, size_t> ids;
  int64_t total = 0;
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const NodeSpec& n = spec.nodes[i];
    if (n.id.empty()) return FieldError(i, n, "id", "must not be empty");
    const auto [it, inserted] = ids.emplace(n.id, i);
    if (!inserted) {
      return FieldError(i, n, "id",
                        absl::StrCat("'", n.id, "' is also the id of nodes[", it->second,
                                     "]: node ids must be unique"));
    }
    if (n.devices < 1) {
      return FieldError(i, n, "devices", absl::StrCat("must be at least 1, got ", n.devices));
    }
    if (n.device_memory <= 0) {
      return FieldError(i, n, "device_memory",
                        absl::StrCat("must be more than 0 bytes, got ", n.device_memory));
    }
    if (n.runtime_memory < 0 || n.runtime_memory >= n.device_memory) {
      return FieldError(i, n, "runtime_memory",
                        absl::StrCat("must be in [0, device_memory ", n.device_memory, "), got ",
                                     n.runtime_memory));
    }
    for (const Precision p : {Precision::kFp32, Precision::kBf16}) {
      const std::string field = absl::StrCat("peak_flops_", AbslView(PrecisionName(p)));
      if (!(n.MeasuredFlops(p) >= 0) || !std::isfinite(n.MeasuredFlops(p))) {
        return FieldError(i, n, absl::StrCat("measured_flops_", AbslView(PrecisionName(p))),
                          absl::StrCat("must be ≥ 0, got ", n.MeasuredFlops(p)));
      }
      if (!(n.PeakFlops(p) > 0) && !(n.MeasuredFlops(p) > 0)) {
        return FieldError(
            i, n, field,
            absl::StrCat("must be more than 0 FLOP/s (or measured), got ", n.PeakFlops(p)));
      }
    }
    if (!(n.memory_bandwidth > 0)) {
      return FieldError(i, n, "memory_bandwidth",
                        absl::StrCat("must be more than 0 bytes/s, got ", n.memory_bandwidth));
    }
    for (const auto& [name, link] :
         {std::pair<std::string_view, const LinkSpec*>{"intra_node", &n.intra_node},
          {"inter_node", &n.inter_node}}) {
      if (!(link->bandwidth > 0) && !(link->measured_bandwidth > 0)) {
        return FieldError(i, n, absl::StrCat(AbslView(name), ".bandwidth"),
                          absl::StrCat("must be more than 0 bytes/s, got ", link->bandwidth));
      }
      if (!(link->measured_bandwidth >= 0)) {
        return FieldError(i, n, absl::StrCat(AbslView(name), ".measured_bandwidth"),
                          absl::StrCat("must be ≥ 0, got ", link->measured_bandwidth));
      }
      if (!(link->latency_s >= 0)) {
        return FieldError(i, n, absl::StrCat(AbslView(name), ".latency_s"),
                          absl::StrCat("must be ≥ 0, got ", link->latency_s));
      }
    }
    total += n.devices;
    if (total > INT_MAX) {
      return FieldError(i, n, "devices",
                        absl::StrCat("the cluster's devices add up to ", total,
                                     ", more than a rank number can count"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ParseClusterSpec(const std::string& yaml_text,
                                             const std::string& source_name) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   YamlMap::Parse(yaml_text, source_name, {kName, kDevices, kNodes}));
  ClusterSpec spec;
  ASSIGN_OR_RETURN(spec.name, map.RequiredString(kName));
  ASSIGN_OR_RETURN(const std::vector<YamlMap> groups,
                   map.RequiredMapList(kNodes, {kName, kCount, kDevices, kDeviceKind, kDeviceMemory,
                                                kPeakTflops, kMeasuredTflops, kMeasuredHalfDim,
                                                kMemoryBandwidth,
                                                kRuntimeMemory, kIntraNode, kInterNode}));
  int64_t total = 0;
  std::vector<std::string> parts;
  for (const YamlMap& group : groups) {
    const size_t before = spec.nodes.size();
    RETURN_IF_ERROR(ParseNodeGroup(group, spec.nodes));
    const int64_t count = static_cast<int64_t>(spec.nodes.size() - before);
    total += count * spec.nodes.back().devices;
    parts.push_back(absl::StrCat(count, "×", spec.nodes.back().devices));
    if (total > INT_MAX) {
      return group.ErrorAt(kCount, absl::StrCat("the cluster's devices add up to ", total,
                                                ", more than a rank number can count"));
    }
  }
  if (map.Has(kDevices)) {
    ASSIGN_OR_RETURN(const int64_t devices, map.RequiredInt64(kDevices, {.min = 1}));
    if (devices != total) {
      return map.ErrorAt(kDevices, absl::StrCat("says ", devices, " devices but the nodes have ",
                                                total, " (", absl::StrJoin(parts, " + "), ")"));
    }
  }
  // Node ids come from the group names; two groups can still collide ("a" with count 2 makes
  // "a-0", which a second group may name itself).
  absl::flat_hash_map<std::string, size_t> ids;
  size_t node_index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    ASSIGN_OR_RETURN(const int64_t count, groups[g].OptionalInt64(kCount, 1));
    for (int64_t i = 0; i < count; ++i, ++node_index) {
      const std::string& id = spec.nodes[node_index].id;
      if (!ids.emplace(id, g).second) {
        return groups[g].ErrorAt(kName, absl::StrCat("makes node id '", id, "', which nodes[",
                                                     ids[id], "] makes too: ids must be unique"));
      }
    }
  }
  RETURN_IF_ERROR(ValidateClusterSpec(spec));
  return spec;
}

absl::StatusOr<ClusterSpec> LoadClusterSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParseClusterSpec(text, path);
}

absl::StatusOr<ClusterSpec> ClusterSpecFromNodes(std::string name,
                                                 const std::vector<NodeReport>& reports) {
  ClusterSpec spec;
  spec.name = std::move(name);
  if (reports.empty()) {
    return absl::InvalidArgumentError("the cluster has no node: a plan needs a device");
  }
  const DeviceKindDefaults* cpu = FindDeviceKind("cpu");
  for (const NodeReport& r : reports) {
    const std::string kind = NormalizeDeviceKind(r.device_kind);
    const DeviceKindDefaults* defaults = FindDeviceKind(kind);
    NodeSpec node = FromDefaults(defaults != nullptr ? *defaults : *cpu);
    node.id = r.node_id;
    node.device_kind = kind;
    node.devices = r.devices;
    if (r.devices < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", r.node_id, "': devices must be at least 1, got ", r.devices));
    }
    if (r.memory_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", r.node_id, "': memory_bytes must be ≥ 0, got ", r.memory_bytes));
    }
    if (r.memory_bytes > 0) node.device_memory = r.memory_bytes;
    if (node.device_memory == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", r.node_id, "': device kind '", kind,
                       "' has no default memory: report memory_bytes"));
    }
    if (node.runtime_memory >= node.device_memory) node.runtime_memory = 0;
    if (!(r.measured_flops >= 0) || !(r.measured_intra_bandwidth >= 0) ||
        !(r.measured_inter_bandwidth >= 0) || !(r.measured_memory_bandwidth >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", r.node_id, "': measurements must be ≥ 0 (0: not measured), got flops ",
          r.measured_flops, ", intra ", r.measured_intra_bandwidth, ", inter ",
          r.measured_inter_bandwidth, ", optimizer ", r.measured_memory_bandwidth));
    }
    if (defaults == nullptr && kind != "cpu" && !(r.measured_flops > 0)) {
      // An unknown accelerator with the CPU's peak would be planned as a CPU; better to say so.
      return absl::InvalidArgumentError(absl::StrCat("node '", r.node_id, "': device kind '", kind,
                                                     "' is unknown (known kinds: ", KnownKindList(),
                                                     "): report measured_flops from calibration"));
    }
    if (r.measured_precision == Precision::kFp32) {
      node.measured_flops_fp32 = r.measured_flops;
    } else {
      node.measured_flops_bf16 = r.measured_flops;
    }
    if (r.measured_flops > 0) node.measured_half_dim = r.measured_half_dim;
    if (r.measured_memory_bandwidth > 0) node.memory_bandwidth = r.measured_memory_bandwidth;
    // An unknown kind's peak is what was measured: nothing better is known.
    if (defaults == nullptr && r.measured_flops > 0) {
      node.peak_flops_fp32 = node.peak_flops_bf16 = r.measured_flops;
    }
    node.intra_node.measured_bandwidth = r.measured_intra_bandwidth;
    node.inter_node.measured_bandwidth = r.measured_inter_bandwidth;
    spec.nodes.push_back(std::move(node));
  }
  RETURN_IF_ERROR(ValidateClusterSpec(spec));
  return spec;
}

}  // namespace shardline::placement
