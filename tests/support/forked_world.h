// A sharded world of real processes on this machine, for tests and benchmarks: forks one child per
// rank of a (tp, pp, dp) layout, bootstraps each rank's world/tp/pp/dp communicators through a
// FileStore directory (the CPU backend training uses, shared memory on one host, or Gloo over
// loopback), runs a body in every rank, and waits for all of them.
//
// The calling process must not have started OpenMP or OpenBLAS threads (they do not survive
// fork()): it forks and waits, the children compute.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "placement/parallel_layout.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::testing {

// Runs in a child: returns its exit code (0 = success).
using RankBody = std::function<int(int rank, const placement::RankCoords& coords,
                                   const model::ShardedGroups& groups)>;

struct ForkedWorldResult {
  std::vector<int> exit_codes;  // per rank; -1: killed at the deadline or by a signal
  bool ok() const;
  std::string Describe() const;  // "rank 2 exited with 6; rank 3 was killed"
};

enum class ForkedBackend {
  kCpu,   // comm::CreateCpuCommunicator, what `backend: auto` gives CPU actors: shared memory here
  kGloo,  // Gloo over TCP on loopback, what `backend: gloo` forces
};

// `store_dir` must exist and be empty. Groups of one rank are passed as null. A child that has not
// finished by `deadline` is killed.
ForkedWorldResult RunForkedWorld(const placement::RankGrid& grid, const std::string& store_dir,
                                 const RankBody& body,
                                 std::chrono::seconds deadline = std::chrono::seconds(120),
                                 ForkedBackend backend = ForkedBackend::kCpu);

// A fresh directory under /tmp, or "" on failure.
std::string MakeTempDir(const std::string& prefix);

// Why no CUDA device can run here (kernels::CreateBackend's reason), asked in a child process:
// CUDA does not survive fork(), so the parent of a forked world must not initialise it. Empty
// when a GPU runs.
std::string GpuUnavailableFromAChild();

}  // namespace shardline::testing
