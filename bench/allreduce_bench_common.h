// Shared by the all-reduce benchmarks (Shardline's GlooCommunicator, raw Gloo, MPI): the same
// sizes, iteration counts, timing and output, so that their numbers compare one to one.
// Output, one line per size and implementation on rank 0:
//   RESULT impl=NAME n=RANKS bytes=B iters=I seconds_per_op=S busbw_gbps=G
// Bus bandwidth as nccl-tests defines it for all-reduce: 2(n-1)/n * bytes / time.
#pragma once

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "worker/comm/all_reduce_tuner.h"

namespace shardline::bench {

struct AllreduceBenchArgs {
  int ranks = 2;
  size_t min_bytes = 4 << 10;
  size_t max_bytes = 256 << 20;
  std::string impl = "shm,shardline,gloo,memcpy";  // allreduce_gloo: the implementations, interleaved
  std::string label;  // overrides the implementation's name in the output (e.g. "mpi_ring")
  std::string store;  // allreduce_mpi: the directory of the shm communicators' rendezvous
};

inline bool ParseArgs(int argc, char** argv, AllreduceBenchArgs& args, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: %s needs a value\nusage: %s\n", argv[0], flag.c_str(), usage);
      return false;
    }
    const char* value = argv[++i];
    if (flag == "--ranks") {
      args.ranks = atoi(value);
    } else if (flag == "--min-bytes") {
      args.min_bytes = strtoull(value, nullptr, 10);
    } else if (flag == "--max-bytes") {
      args.max_bytes = strtoull(value, nullptr, 10);
    } else if (flag == "--impl") {
      args.impl = value;
    } else if (flag == "--label") {
      args.label = value;
    } else if (flag == "--store") {
      args.store = value;
    } else {
      fprintf(stderr, "%s: unknown flag %s\nusage: %s\n", argv[0], flag.c_str(), usage);
      return false;
    }
  }
  if (args.ranks < 2 || args.min_bytes < 4 || args.max_bytes < args.min_bytes) {
    fprintf(stderr, "%s: need --ranks >= 2 and 4 <= --min-bytes <= --max-bytes\n", argv[0]);
    return false;
  }
  return true;
}

// 4 KiB, 16 KiB, ... : x4 steps.
inline std::vector<size_t> Sizes(const AllreduceBenchArgs& args) {
  std::vector<size_t> sizes;
  for (size_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) sizes.push_back(bytes);
  return sizes;
}

// One implementation under test: `all_reduce(buffer, count)` sums `count` floats in place
// across the ranks and `barrier()` lines them up; both return false on failure.
struct AllreduceImpl {
  std::string name;
  std::function<bool(float*, size_t)> all_reduce;
  std::function<bool()> barrier;
  bool reduces = true;  // false for a baseline that only moves the bytes (memcpy): not checked
  // Its own buffer of --max-bytes (memory the communicator's peers map: shm-shared), instead of
  // the one every other implementation uses.
  float* buffer = nullptr;
};

// Implementations alternate operation by operation in the same processes, each operation timed
// on its own: load from elsewhere on a shared machine then hits them alike, instead of whichever
// happened to run during a burst. About kSecondsPerImpl of operations per implementation and
// point, at least 5 (the huge sizes take seconds per operation on a loaded machine). Before them,
// as many untimed operations per implementation as Shardline's shared-memory all-reduce needs to
// time each of its candidate algorithms at a size (all_reduce_tuner.h): a cost once per size,
// which a training job pays in its first steps and which five timed operations of 256 MiB would
// otherwise be mostly made of.
constexpr int kWarmupIterations =
    shardline::comm::AllReduceTuner::kWarmRuns * shardline::comm::kShmAlgorithms;
constexpr double kSecondsPerImpl = 0.5;

inline double BusBandwidthGBps(int ranks, size_t bytes, double seconds_per_op) {
  return 2.0 * (ranks - 1) / ranks * static_cast<double>(bytes) / seconds_per_op / 1e9;
}

// Checks one result of every implementation, then times every size. Returns an exit code.
inline int RunAllreduceBench(int rank, int ranks, const AllreduceBenchArgs& args,
                             const std::vector<AllreduceImpl>& impls) {
  using Clock = std::chrono::steady_clock;
  std::vector<float> common(args.max_bytes / sizeof(float));
  const size_t elements = common.size();
  const auto buffer_of = [&](const AllreduceImpl& impl) {
    return impl.buffer != nullptr ? impl.buffer : common.data();
  };
  // Checked at the largest size too: the single copy and the chunked path run only above 16 KiB.
  for (const size_t check_count : {std::min<size_t>(elements, 4099), elements}) {
    for (const AllreduceImpl& impl : impls) {
      if (!impl.reduces) continue;
      float* buffer = buffer_of(impl);
      std::fill(buffer, buffer + check_count, static_cast<float>(rank + 1));
      if (!impl.all_reduce(buffer, check_count)) return 10;
      const float want = static_cast<float>(ranks * (ranks + 1) / 2);
      for (const size_t at : {size_t{0}, check_count / 2, check_count - 1}) {
        if (buffer[at] != want) {
          fprintf(stderr, "%s rank %d: wrong all-reduce result %g at %zu of %zu, want %g\n",
                  impl.name.c_str(), rank, buffer[at], at, check_count, want);
          return 11;
        }
      }
    }
  }
  // Small values that stay finite long enough not to matter (x86 adds inf at full speed anyway).
  for (const AllreduceImpl& impl : impls) {
    std::fill(buffer_of(impl), buffer_of(impl) + elements, 1e-3f);
  }
  for (size_t bytes : Sizes(args)) {
    const size_t count = bytes / sizeof(float);
    // Iterations from the first implementation's warm-up, averaged over the ranks by
    // an all-reduce so that every rank runs the same count.
    const auto warm_start = Clock::now();
    for (int i = 0; i < kWarmupIterations; ++i) {
      if (!impls[0].all_reduce(buffer_of(impls[0]), count)) return 12;
    }
    float estimate = static_cast<float>(
        std::chrono::duration<double>(Clock::now() - warm_start).count() /
        kWarmupIterations);
    if (!impls[0].all_reduce(&estimate, 1)) return 12;
    const int iters = static_cast<int>(std::clamp(kSecondsPerImpl / (estimate / ranks), 5.0,
                                                  5000.0));
    for (size_t k = 1; k < impls.size(); ++k) {  // impls[0] was warmed up above
      for (int i = 0; i < kWarmupIterations; ++i) {
        if (!impls[k].all_reduce(buffer_of(impls[k]), count)) return 12;
      }
    }
    std::vector<double> total(impls.size(), 0.0);
    for (size_t k = 0; k < impls.size(); ++k) {
      if (!impls[k].barrier()) return 13;
    }
    for (int i = 0; i < iters; ++i) {
      for (size_t j = 0; j < impls.size(); ++j) {
        // Every other iteration in reverse order, so that neither always runs first.
        const size_t k = i % 2 == 0 ? j : impls.size() - 1 - j;
        const auto start = Clock::now();
        if (!impls[k].all_reduce(buffer_of(impls[k]), count)) return 14;
        total[k] += std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
    std::vector<double> mean(impls.size());
    for (size_t k = 0; k < impls.size(); ++k) mean[k] = total[k] / iters;
    if (rank == 0) {
      for (size_t k = 0; k < impls.size(); ++k) {
        printf("RESULT impl=%s n=%d bytes=%zu iters=%d seconds_per_op=%.9f busbw_gbps=%.4f\n",
               impls[k].name.c_str(), ranks, bytes, iters, mean[k],
               BusBandwidthGBps(ranks, bytes, mean[k]));
      }
      fflush(stdout);
    }
  }
  return 0;
}

// Runs rank_main(rank) in `ranks` forked processes (forked before any thread exists) and waits
// for them; a failing rank takes the others down. Returns an exit code.
inline int ForkRanks(int ranks, const std::function<int(int)>& rank_main) {
  fflush(stdout);
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      for (pid_t child : children) kill(child, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      const int code = rank_main(rank);
      fflush(stdout);
      _exit(code);
    }
    children.push_back(pid);
  }
  int result = 0;
  for (int done = 0; done < ranks; ++done) {
    int status = 0;
    const pid_t pid = wait(&status);
    if (pid < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "a rank (pid %d) failed with status %d; stopping the others\n", pid, status);
      for (pid_t child : children) kill(child, SIGKILL);
      result = 1;
    }
  }
  return result;
}

// A fresh directory for a file-store rendezvous; removed by the caller.
inline std::string MakeTempDir(const char* tag) {
  std::string pattern = std::string("/tmp/shardline_") + tag + "_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    perror("mkdtemp");
    exit(1);
  }
  return pattern;
}

inline void RemoveDir(const std::string& dir) {
  const std::string command = "rm -rf '" + dir + "'";
  if (system(command.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());
}

}  // namespace shardline::bench
