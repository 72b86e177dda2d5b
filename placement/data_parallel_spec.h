// How a train job's data-parallel replicas stay in step (YAML `data_parallel:`), apart from the
// ZeRO stage, which says where the state lives (parallel.zero):
//   bucket_mb: gradients are all-reduced in buckets of about this size as the backward produces
//     them (DDP's bucket_cap_mb), so that the reduction overlaps the rest of the backward;
//   compression: powersgd (rank R) | int8: the gradient's reduction between hosts is lossy with
//     error feedback; inside a host it stays exact (worker/model/gradient_compression.h);
//   sync: diloco (every H, outer_lr, outer_momentum, fragments): each replica trains alone with
//     its own AdamW for H steps, then the replicas average their parameters' change and take one
//     outer Nesterov step (Douillard et al. 2023); with fragments > 1 the model is synced one
//     fragment at a time on a staggered schedule, each fragment's exchange overlapping the next
//     inner step (Streaming DiLoCo).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "placement/parallel_layout.h"

namespace shardline::placement {

enum class GradientCompression { kNone, kPowerSgd, kInt8 };
enum class DataParallelSync { kEveryStep, kDiloco };

// 4 MiB, by measurement (Zen 4 VM, 2026-12-07): bench/slow_link_compare.py --quick --rates 1gbit
// --only shardline --modes plain --bucket-mb N on sharded_step_bench's GPT (25.7 MB of gradients,
// 3.1 MB a layer) ran 3549 tok/s at 4 MiB against 2857 at DDP's 25 (two buckets: little of the
// reduction overlaps the backward), and on one host bench/dp_compare.py lost 2.6% at 25 MiB
// against reducing each layer alone. A bucket of about a layer keeps every reduction overlapped;
// Gloo's per-message cost is small next to a 4 MiB message even at 10 Gbit.
inline constexpr int64_t kDefaultBucketBytes = int64_t{4} << 20;

struct DataParallelSpec {
  int64_t bucket_bytes = kDefaultBucketBytes;
  GradientCompression compression = GradientCompression::kNone;
  int rank = 1;  // PowerSGD's matrix approximation rank (PyTorch's default 1)
  DataParallelSync sync = DataParallelSync::kEveryStep;
  int64_t every = 500;    // DiLoCo: inner steps per outer step (the paper's H)
  double outer_lr = 0.7;  // the paper's outer Nesterov step
  double outer_momentum = 0.9;
  int fragments = 1;

  bool diloco() const { return sync == DataParallelSync::kDiloco; }
  bool compressed() const { return compression != GradientCompression::kNone; }
};

// "none", "powersgd", "int8"; "every_step", "diloco": the YAML spellings.
std::string_view GradientCompressionName(GradientCompression compression);
std::string_view DataParallelSyncName(DataParallelSync sync);

// ", powersgd rank 4", ", int8", ", diloco every 50 (2 fragments)": what a plan line adds for a
// data-parallel mode other than plain every-step reduction; empty for that.
std::string DataParallelSuffix(const DataParallelSpec& spec);

// OK when `spec` can run on `layout` for `model`; otherwise InvalidArgument whose message names
// the key and its value ("data_parallel.compression: powersgd needs data parallelism, but dp is
// 1"): compression or DiLoCo with dp = 1; DiLoCo with a ZeRO stage (any stage shards some state
// across the sites, which would cross sites every step); compression with ZeRO 2 or 3 (their
// gradients are reduce-scattered, not all-reduced); a PowerSGD rank above the smallest dimension
// of the per-rank gradient matrices; more fragments than the model has layers.
absl::Status CheckDataParallel(const DataParallelSpec& spec, const ParallelSpec& layout,
                               const model::ModelConfig& model);

// The smallest dimension of the gradient matrices one rank holds at tensor parallelism `tp`: the
// bound of a PowerSGD rank.
int64_t SmallestGradientMatrixDimension(const model::ModelConfig& model, int tp);

}  // namespace shardline::placement
