// What memory steps (checkpoint.memory_interval) cost training: the production loop
// (training::TrainSharded) on sharded_step_bench's GPT (8 layers, d_model 256, ~6.6 M parameters,
// batch 16 of 128 tokens), data parallel over 2 forked ranks on shared memory
// (tests/support/forked_world.h), run without memory steps and with them every --memory-interval
// steps into a memory store under /dev/shm, alternately, --rounds times each: the same cores, the
// same minute. Per run the median wall time of a step (from one progress report to the next, the
// first --warmup steps left out), and the ratio of the medians over the rounds against the target
// (at most 5% slower). Not part of ctest.
//
//   build/bench/memory_tier_bench [--steps 30] [--warmup 5] [--rounds 3] [--memory-interval 1]
//       [--threads T]
//
// Threads per rank default to max(1, cores / 2).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "placement/job_spec.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "worker/training/sharded_trainer.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;

struct Options {
  int steps = 30;
  int warmup = 5;
  int rounds = 3;
  int memory_interval = 1;
  int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
};

std::string JobYaml(const Options& o, int memory_interval) {
  return "name: memory-tier-bench\nkind: train\ndevices: cpu\n"
         "model: {layers: 8, heads: 8, d_model: 256, vocab: 257, max_seq_len: 128}\n"
         "data: {synthetic: {seed: 1, bytes: 1MiB}}\n"
         "optimizer: {lr: 1.0e-4}\n"
         "steps: " +
         std::to_string(o.steps) +
         "\nbatch: 16\nseq_len: 128\nseed: 1\n"
         "parallel: {dp: 2}\nlog_interval: 1\n" +
         (memory_interval > 0
              ? "checkpoint: {memory_interval: " + std::to_string(memory_interval) + "}\n"
              : std::string());
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One run of both ranks; rank 0 writes its step times, one per line, to `out`.
bool Run(const Options& o, int memory_interval, const std::string& out, int64_t* memory_steps) {
  const std::string store = "/dev/shm/shardline-memory-tier-bench-" + std::to_string(::getpid());
  const std::string comm_dir = testing::MakeTempDir("memory-tier-bench");
  auto grid = placement::RankGrid::Create(1, 1, 2);
  const std::string counted = out + ".saves";
  const testing::ForkedWorldResult result = testing::RunForkedWorld(
      *grid, comm_dir,
      [&](int rank, const placement::RankCoords&, const model::ShardedGroups& groups) {
        omp_set_num_threads(o.threads);
        auto job = placement::ParseJobSpec(JobYaml(o, memory_interval), "memory_tier_bench.yaml");
        if (!job.ok()) {
          std::fprintf(stderr, "%s\n", std::string(job.status().message()).c_str());
          return 2;
        }
        training::ShardedTrainOptions options;
        options.spec = *job;
        options.rank = rank;
        options.groups = groups;
        options.memory.store = store;
        options.memory.job_id = "bench";
        options.memory.generation = 1;
        options.memory.interval = memory_interval;
        int64_t saves = 0;
        options.memory.on_saved = [&](const training::MemorySaved&) {
          ++saves;
          return absl::OkStatus();
        };
        std::vector<double> times;
        auto last = std::chrono::steady_clock::now();
        options.on_progress = [&](const training::ShardedProgress&) {
          const auto now = std::chrono::steady_clock::now();
          times.push_back(std::chrono::duration<double>(now - last).count());
          last = now;
        };
        auto trained = training::TrainSharded(options);
        if (!trained.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank,
                       std::string(trained.status().message()).c_str());
          return 3;
        }
        if (rank == 0) {
          std::ofstream file(out);
          for (double t : times) file << t << "\n";
          std::ofstream(counted) << saves << "\n";
        }
        return 0;
      },
      std::chrono::seconds(600));
  std::error_code ignored;
  fs::remove_all(store, ignored);
  fs::remove_all(comm_dir, ignored);
  if (!result.ok()) {
    std::fprintf(stderr, "run failed: %s\n", result.Describe().c_str());
    return false;
  }
  std::ifstream saves(counted);
  saves >> *memory_steps;
  return true;
}

std::vector<double> ReadTimes(const std::string& path, int warmup) {
  std::vector<double> times;
  std::ifstream in(path);
  for (double t; in >> t;) times.push_back(t);
  if (static_cast<int>(times.size()) > warmup) times.erase(times.begin(), times.begin() + warmup);
  return times;
}

}  // namespace
}  // namespace shardline

int main(int argc, char** argv) {
  using namespace shardline;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (flag == "--steps")
      o.steps = next();
    else if (flag == "--warmup")
      o.warmup = next();
    else if (flag == "--rounds")
      o.rounds = next();
    else if (flag == "--memory-interval")
      o.memory_interval = next();
    else if (flag == "--threads")
      o.threads = next();
    else {
      std::fprintf(stderr,
                   "usage: memory_tier_bench [--steps N] [--warmup W] [--rounds R] "
                   "[--memory-interval K] [--threads T]\n");
      return 2;
    }
  }
  if (o.steps <= o.warmup || o.rounds < 1 || o.memory_interval < 1) {
    std::fprintf(stderr, "need --steps > --warmup, --rounds >= 1, --memory-interval >= 1\n");
    return 2;
  }
  const std::string dir = testing::MakeTempDir("memory-tier-bench-out");
  std::printf(
      "memory_tier_bench: GPT 8 layers d_model 256 (~6.6 M parameters), batch 16 x 128, "
      "dp 2 on shared memory, %d threads per rank, %d steps (%d warm-up) per run; memory "
      "steps every %d step(s) into /dev/shm\n",
      o.threads, o.steps, o.warmup, o.memory_interval);
  std::vector<double> without, with;
  for (int round = 1; round <= o.rounds; ++round) {
    for (const int interval : {0, o.memory_interval}) {
      const std::string out = dir + "/r" + std::to_string(round) + "-" + std::to_string(interval);
      int64_t saves = 0;
      if (!Run(o, interval, out, &saves)) return 1;
      const double median = Median(ReadTimes(out, o.warmup));
      (interval == 0 ? without : with).push_back(median);
      std::printf("round %d %-22s median step %.4f s (%lld memory steps)\n", round,
                  interval == 0 ? "without memory steps:" : "with memory steps:", median,
                  static_cast<long long>(saves));
      std::fflush(stdout);
    }
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  const double base = Median(without), cost = Median(with);
  const double ratio = base > 0 ? cost / base : 0;
  std::printf(
      "result memory_tier median_step_without_s=%.4f median_step_with_s=%.4f "
      "slowdown=%.1f%% target=5%% %s\n",
      base, cost, (ratio - 1) * 100, ratio <= 1.05 ? "PASS" : "MISS");
  return 0;
}
