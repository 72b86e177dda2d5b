// The comm-check job: every collective over a range of message sizes, each result verified
// against a reference computed locally, each timed and reported as bus bandwidth the way
// nccl-tests does (busbw = algbw · factor, factor 2(n−1)/n for all-reduce, (n−1)/n for
// all-gather and reduce-scatter, 1 for broadcast and send/recv).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/job_spec.h"
#include "worker/comm/communicator.h"

namespace shardline::actor {

struct CommCheckResult {
  std::string op;
  uint64_t bytes = 0;  // the whole buffer: recv of all-gather, send of reduce-scatter
  int ranks = 0;
  double seconds = 0;  // mean over iterations, slowest rank
  double algorithm_gbps = 0;
  double bus_gbps = 0;
  bool ok = false;  // every rank's verdict
  std::string detail;
};

// Runs on every rank of `comm`, which must all call it with the same spec. After each op (all
// its sizes) `on_op_done` gets that op's results, identical on every rank. Returns every result;
// an error only when a collective itself failed (a mismatch is a result with ok = false, and
// this rank's first mismatch is logged and kept in `local_mismatch`).
absl::StatusOr<std::vector<CommCheckResult>> RunCommCheck(
    comm::Communicator& comm, const placement::CommCheckSpec& spec,
    const std::function<void(const std::vector<CommCheckResult>&)>& on_op_done,
    std::string* local_mismatch);

}  // namespace shardline::actor
