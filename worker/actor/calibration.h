// Start-up calibration of a train job's actor: what its device and its links actually achieve,
// measured once after bootstrap and before the first step, and reported to the coordinator
// (wire Calibration), whose placement planner plans later `parallel: auto` jobs with it instead
// of datasheet numbers.
//
//   compute:     one GPT transformer block's forward and backward through the CPU kernels (the
//                trainer's own code), at a thin shape (d_model 64) and a wider one (d_model 256),
//                median of a few passes each; the two rates fit r(x) = R·x/(x + h), x the
//                block's size min(tokens, d_model), so the planner's cost
//                model gets both the large-shape rate R and the fall-off h. Non-GEMM kernels
//                (layer norms, attention, GELU) are in the measurement, as in training; then
//                the optimizer step (AdamW and the gradient norm) over 2M parameters.
//   all-reduce:  per group of more than one rank, an 8-byte all-reduce (idle latency, median of
//                5) and an 8 MiB one (bus bandwidth 2(n-1)/n · bytes / (time - latency), best of
//                2), each after a warm-up, the slowest rank's times (all-reduced max); then the
//                loaded latency: what a 256 KiB all-reduce adds to ~1 ms of GEMMs, as
//                collectives come between kernels in training (median per rank of 32 rounds,
//                the least over the ranks: what it adds to the last to arrive, which is what
//                the step pays; less the bytes' time). All members report the same numbers.
//
// A host whose CPUs the job's ranks outnumber (four single-thread actors on two cores: the
// default `shardline up` job on a 2-core machine) is time-shared. Measured all at once, every
// rank would get half a core and every group's collectives would wait for peers the scheduler
// parked to run another group's GEMMs, so its links would read 50x slower than training, where
// the ranks block on one another's activations and take turns. There the calibration runs in
// turns instead: the compute a few ranks at a time (as many as the CPUs hold), the groups one
// after the other. The actor logs the host's CPU share (HostShare); the planner does not model a
// time-shared host yet (four actors on two cores measure ~1.4x its prediction).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"

namespace shardline::actor {

struct GroupBandwidth {
  std::string id;    // the group's id ("tp-d0-p1")
  std::string kind;  // world | tp | pp | dp
  int ranks = 0;
  double bus_bytes_per_second = 0;
  // One all-reduce's start-up as training pays it: what it adds between kernels less its bytes'
  // time, never less than idle_latency_seconds.
  double latency_seconds = 0;
  double idle_latency_seconds = 0;  // an 8-byte all-reduce back to back with the previous one
};

// A device's compute rate for transformer layers: FLOP/s (counted as the planner counts them,
// model::BlockForwardFlopsPerToken) approached by wide layers, and the size min(tokens, d_model)
// at which a layer gets half of it.
struct LayerRate {
  double flops = 0;  // 0: not measured
  double half_dim = 0;
};

// How the job's ranks share the CPUs of this rank's host.
struct HostShare {
  int ranks = 1;    // the job's ranks on this host
  int index = 0;    // this rank's place among them, by rank
  int threads = 1;  // the kernel threads of one rank (CpuThreads())
  int cpus = 1;     // the CPUs a rank may run on (its affinity)
  // The fraction of its threads' time a rank gets when all ranks of the host compute at once.
  double cpu_share() const;
  // How many ranks' worth of threads the CPUs run at once (at least 1).
  int concurrent_ranks() const;
};

struct CalibrationResult {
  LayerRate compute;
  HostShare host;
  // The AdamW step with the gradient norm's read, in placement::kOptimizerBytesPerParam bytes
  // per parameter per second; 0: not measured.
  double optimizer_bytes_per_second = 0;
  std::vector<GroupBandwidth> groups;
};

// One communicator group as the calibration sees it. The list holds the job's groups in the
// job's group order (RankGrid::AllGroups), the same list on every rank: each group's collectives
// then run in an order no two ranks disagree on, so they cannot deadlock. A time-shared host
// measures them in turns and needs every group, the calling rank's and the others'.
struct CalibrationGroup {
  std::string id;
  std::string kind;
  // Null for a group the calling rank is not in; groups of one rank are skipped (may be null).
  // The "world" group is not measured (no training collective runs over it); it is the group
  // the turns of a time-shared host are kept on.
  comm::Communicator* communicator = nullptr;
  // The job's ranks in the group; a time-shared host needs them (to take turns, every rank must
  // know each group's size, its own or not).
  std::vector<uint32_t> ranks;
};

struct CalibrationOptions {
  bool measure_compute = true;  // false on a device the CPU kernels do not run on
  int64_t small_bytes = 8;
  int64_t large_bytes = int64_t{8} << 20;
  int small_reps = 5;
  int large_reps = 2;
  // The loaded latency: what an all-reduce of loaded_bytes (a tensor-parallel activation's size)
  // adds to busy_seconds of compute, over loaded_reps rounds.
  int64_t loaded_bytes = int64_t{256} << 10;
  int loaded_reps = 32;
  double busy_seconds = 0.001;
  // The host share's inputs, 0: measured (CpuThreads(), the affinity's CPUs); tests set them.
  int threads = 0;
  int cpus = 0;
  std::string host_id;  // empty: comm::LocalHostIdentity()
};

// A GPT block's shape: batch, sequence, d_model, heads (d_ff = 4·d_model), and the share of it
// one rank holds: 1/tp of the heads and of d_ff, as tensor parallelism cuts it.
struct BlockShape {
  int B, T, C, NH;
  int tp = 1;
};
// A block's size min(tokens, d_model): the variable of the cost model's measured fall-off.
double ThinDim(const BlockShape& shape);
// The median FLOP/s of `reps` forward + backward passes of a stack of `blocks` blocks of `shape`
// through the CPU kernels (forward through all, backward in reverse, as in training; after one
// untimed pass, which also starts the BLAS).
absl::StatusOr<double> MeasureBlockRate(const BlockShape& shape, int blocks, int reps);
// R and h of r(x) = R·x/(x + h) through (x1, r1) and (x2, r2), x1 < x2; h = 0 and R the larger
// rate when the thinner shape was not slower.
absl::StatusOr<LayerRate> FitLayerRate(double x1, double r1, double x2, double r2);

// The optimizer step's rate (CalibrationResult::optimizer_bytes_per_second): AdamW and the
// gradient's sum of squares over 2M parameters (32 MiB of state, past most caches), median of 3.
absl::StatusOr<double> MeasureOptimizerRate();

// The fp32 layer rate of this process's threads (the OpenMP and BLAS threads it was given),
// while the ranks the host's CPUs run at once calibrate at the same time.
absl::StatusOr<LayerRate> MeasureLayerRate();

// The all-reduce bus bandwidth and latency of `comm`; every rank of the group must call it with
// the same options. An error only when a collective fails (the job's links are then broken).
absl::StatusOr<GroupBandwidth> MeasureAllReduce(comm::Communicator& comm,
                                                const CalibrationOptions& options);

// The host share of every rank of `world` (a collective; every rank gets its own host's).
absl::StatusOr<HostShare> MeasureHostShare(comm::Communicator& world,
                                           const CalibrationOptions& options);

// Both, for every group of `groups` but the world with more than one rank, in list order; in
// turns when the host is time-shared (above).
absl::StatusOr<CalibrationResult> Calibrate(const std::vector<CalibrationGroup>& groups,
                                            const CalibrationOptions& options = {});

}  // namespace shardline::actor
