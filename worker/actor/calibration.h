// Start-up calibration of a train job's actor: what its device and its links actually achieve,
// measured once after bootstrap and before the first step, and reported to the coordinator
// (wire Calibration), whose placement planner plans later `parallel: auto` jobs with it instead
// of datasheet numbers.
//
//   GEMM:        a square fp32 GEMM through the CPU kernels (OpenBLAS), sized from a first small
//                run so that one repetition takes ~25 ms, best of a few; well under 0.2 s.
//   all-reduce:  per group of more than one rank, an 8-byte all-reduce (latency, median of 5)
//                and an 8 MiB one (bus bandwidth 2(n-1)/n · bytes / (time - latency), best of 2),
//                each after a warm-up; every time is the slowest rank's (all-reduced max), so all
//                members report the same numbers.
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
  double latency_seconds = 0;
};

struct CalibrationResult {
  double gemm_flops = 0;  // 0: not measured
  std::vector<GroupBandwidth> groups;
};

// One communicator group as the calibration sees it. The list must hold the calling rank's
// groups in the job's group order (RankGrid::AllGroups), the same order on every rank: each
// group's collectives then run in an order no two ranks disagree on, so they cannot deadlock.
struct CalibrationGroup {
  std::string id;
  std::string kind;
  comm::Communicator* communicator = nullptr;  // groups of one rank are skipped (may be null)
};

struct CalibrationOptions {
  bool measure_gemm = true;  // false on a device the CPU kernels do not run on
  int64_t small_bytes = 8;
  int64_t large_bytes = int64_t{8} << 20;
  int small_reps = 5;
  int large_reps = 2;
};

// fp32 GEMM FLOP/s of this process's share of the CPU (the BLAS threads it was given).
absl::StatusOr<double> MeasureGemmFlops();

// The all-reduce bus bandwidth and latency of `comm`; every rank of the group must call it with
// the same options. An error only when a collective fails (the job's links are then broken).
absl::StatusOr<GroupBandwidth> MeasureAllReduce(comm::Communicator& comm,
                                                const CalibrationOptions& options);

// Both, for every group of `groups` with more than one rank, in list order.
absl::StatusOr<CalibrationResult> Calibrate(const std::vector<CalibrationGroup>& groups,
                                            const CalibrationOptions& options = {});

}  // namespace shardline::actor
