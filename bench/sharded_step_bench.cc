// One fixed GPT, trained under every (tp, pp, dp) that fits this machine's cores (world ≤ 4): step
// time, tokens/s, and the share of the step in compute, communication and the pipeline bubble;
// then the measured bubble of pipelines of 2 and 4 stages against the 1F1B schedule's
// (p−1)/(m+p−1) for m micro-batches; then the schedules and recomputation modes side by side:
// 1F1B against interleaved 1F1B (2 chunks per stage) at pp 2 and 4, and recompute none /
// selective / full, each with its measured bubble and the activation memory its ranks hold
// (--schedules runs only that table). Every rank is a forked process with the communicators CPU
// actors get (shared memory on one host; --backend gloo: Gloo over loopback, what `backend: gloo`
// forces), tests/support/forked_world.h. Not part of ctest.
//
//   build/bench/sharded_step_bench [--steps N] [--threads T] [--layout TPxPPxDP] [--backend B]
//                                  [--schedules]
//
// Threads per rank default to max(1, cores / world), so every layout uses the same cores; with
// fewer cores than ranks the processes share them, and the table says so. --layout runs that one
// layout (micro-batch 4) and no bubble table (bench/dp_compare.py runs 1x1x2).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/sharded_gpt.h"

namespace shardline {
namespace {

// GPT of ~6.6M parameters: big enough that GEMMs dominate one step, small enough for 2 cores.
model::ModelConfig BenchConfig() {
  model::ModelConfig c;
  c.layers = 8;
  c.heads = 8;
  c.d_model = 256;
  c.vocab = 257;
  c.max_seq_len = 128;
  return c;
}
constexpr int kSeqLen = 128;
constexpr int kGlobalBatch = 16;

struct Layout {
  int tp, pp, dp;
  int64_t micro_batch;
  int virtual_stages = 1;  // > 1: the interleaved schedule
  placement::RecomputeMode recompute = placement::RecomputeMode::kNone;
};

struct Measured {
  double seconds = 0, compute = 0, comm = 0, bubble = 0;  // per step, averaged over timed steps
  double activation_bytes = 0;                            // ShardedMemory::activation_bytes
  double simulated_bubble = 0;                            // the schedule's, unit-time passes
};

// In a rank: one warm-up step, then `steps` timed ones; writes its averages.
int RunRank(const std::string& dir, const Layout& layout, int steps, int threads, int rank,
            const placement::RankCoords& coords, const model::ShardedGroups& groups) {
  omp_set_num_threads(threads);
  setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);  // read when BLAS loads
  model::ShardedOptions options;
  options.config = BenchConfig();
  options.parallel.tp = layout.tp;
  options.parallel.pp = layout.pp;
  options.parallel.dp = layout.dp;
  options.parallel.micro_batch = layout.micro_batch;
  if (layout.virtual_stages > 1) {
    options.parallel.schedule = placement::PipelineScheduleKind::kInterleaved;
    options.parallel.virtual_stages = layout.virtual_stages;
  }
  options.parallel.recompute = layout.recompute;
  options.coords = coords;
  options.global_batch = kGlobalBatch;
  options.seq_len = kSeqLen;
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  auto gpt = model::ShardedGpt::Create(options, groups, backend);
  if (!gpt.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(gpt.status().message()).c_str());
    return 2;
  }
  if (!(*gpt)->InitGpt2(1).ok()) return 2;
  const data::TextDataset dataset = data::SyntheticCorpus(1, 1 << 20).ToDataset();
  auto sampler = data::Sampler::Create(dataset, kSeqLen, kGlobalBatch, 1);
  if (!sampler.ok()) return 3;
  Measured sum;
  for (int step = 0; step <= steps; ++step) {
    auto source = [&](int64_t first, int64_t count, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) -> absl::Status {
      auto batch = sampler->MicroBatch(step, first, count);
      if (!batch.ok()) return batch.status();
      inputs.assign(batch->inputs.begin(), batch->inputs.end());
      targets.assign(batch->targets.begin(), batch->targets.end());
      return absl::OkStatus();
    };
    auto stats = (*gpt)->TrainStep(source, step + 1, 1e-4f);
    if (!stats.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(stats.status().message()).c_str());
      return 4;
    }
    if (step == 0) continue;  // warm-up: first-touch page faults, BLAS loading
    sum.seconds += stats->seconds;
    sum.compute += stats->compute_seconds;
    sum.comm += stats->comm_seconds;
    sum.bubble += stats->bubble_seconds;
  }
  std::ofstream(dir + "/rank-" + std::to_string(rank) + ".txt")
      << sum.seconds / steps << " " << sum.compute / steps << " " << sum.comm / steps << " "
      << sum.bubble / steps << " " << (*gpt)->memory().activation_bytes << " "
      << (*gpt)->schedule().SimulatedBubble() << "\n";
  return 0;
}

// Runs one layout; per-rank averages, or empty on failure.
std::vector<Measured> Run(const Layout& layout, int steps, int threads,
                          testing::ForkedBackend backend) {
  auto grid = placement::RankGrid::Create(layout.tp, layout.pp, layout.dp);
  if (!grid.ok()) return {};
  const std::string dir = testing::MakeTempDir("shardline_bench");
  const std::string store = dir + "/store";
  std::filesystem::create_directories(store);
  const auto result = testing::RunForkedWorld(
      *grid, store,
      [&](int rank, const placement::RankCoords& coords, const model::ShardedGroups& groups) {
        return RunRank(dir, layout, steps, threads, rank, coords, groups);
      },
      std::chrono::seconds(1800), backend);
  std::vector<Measured> out;
  if (result.ok()) {
    for (int rank = 0; rank < grid->world(); ++rank) {
      Measured m;
      std::ifstream(dir + "/rank-" + std::to_string(rank) + ".txt") >> m.seconds >> m.compute >>
          m.comm >> m.bubble >> m.activation_bytes >> m.simulated_bubble;
      out.push_back(m);
    }
  } else {
    std::fprintf(stderr, "tp=%d pp=%d dp=%d: %s\n", layout.tp, layout.pp, layout.dp,
                 result.Describe().c_str());
  }
  std::filesystem::remove_all(dir);
  return out;
}

[[noreturn]] void Usage(const char* program, const std::string& why) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--steps N] [--threads T] [--layout TPxPPxDP] "
               "[--backend cpu|gloo] [--schedules]\n",
               program, why.c_str(), program);
  std::exit(2);
}

int PositiveInt(const char* program, const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 1 || v > 4096) {
    Usage(program, flag + ": not an integer in 1..4096: " + value);
  }
  return static_cast<int>(v);
}

// 1F1B against interleaved at pp 2 and 4, and the recomputation modes: step time, bubble
// (measured, mean over stages; and the schedule's own for unit-time passes) and the activation
// memory of the rank that holds the most.
void ScheduleTable(int steps, int threads, int cores, testing::ForkedBackend backend) {
  std::printf(
      "\nSchedules and recomputation (tp=dp=1): bubble measured as above, and the\n"
      "schedule's simulated bubble (forward 1, backward 2 units per stage's layers)\n");
  std::printf(
      " p  m  schedule     recompute | step ms | bubble measured  simulated | "
      "activations MiB (largest rank)\n");
  struct Row {
    int p, m, v;
    placement::RecomputeMode recompute;
  };
  std::vector<Row> rows;
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      for (int v : {1, 2}) rows.push_back({p, m, v, placement::RecomputeMode::kNone});
    }
  }
  for (const placement::RecomputeMode mode :
       {placement::RecomputeMode::kNone, placement::RecomputeMode::kSelective,
        placement::RecomputeMode::kFull}) {
    rows.push_back({2, 4, 1, mode});
  }
  for (const Row& row : rows) {
    Layout layout{1, row.p, 1, kGlobalBatch / row.m, row.v, row.recompute};
    const int per_rank = threads > 0 ? threads : std::max(1, cores / row.p);
    const std::vector<Measured> ranks = Run(layout, steps, per_rank, backend);
    if (ranks.empty()) continue;
    double bubble = 0, simulated = 0, activations = 0, seconds = 0;
    for (const Measured& r : ranks) {
      bubble += r.bubble / r.seconds;
      simulated += r.simulated_bubble;
      activations = std::max(activations, r.activation_bytes);
      seconds = std::max(seconds, r.seconds);
    }
    bubble /= static_cast<double>(ranks.size());
    simulated /= static_cast<double>(ranks.size());
    std::printf("%2d %2d  %-12s %-9s | %7.1f | %14.1f%% %9.1f%% | %8.1f\n", row.p, row.m,
                row.v > 1 ? ("interleaved" + std::to_string(row.v)).c_str() : "1f1b",
                std::string(placement::RecomputeModeName(row.recompute)).c_str(), seconds * 1e3,
                100 * bubble, 100 * simulated, activations / (1 << 20));
  }
}

}  // namespace
}  // namespace shardline

int main(int argc, char** argv) {
  using namespace shardline;
  int steps = 5;
  int threads = 0;
  bool schedules_only = false;
  std::vector<Layout> only;
  testing::ForkedBackend backend = testing::ForkedBackend::kCpu;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage(argv[0], "help");
    if (flag == "--schedules") {
      schedules_only = true;
      continue;
    }
    if (flag != "--steps" && flag != "--threads" && flag != "--layout" && flag != "--backend") {
      Usage(argv[0], "unknown argument " + flag);
    }
    if (i + 1 >= argc) Usage(argv[0], flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--steps") steps = PositiveInt(argv[0], flag, value);
    if (flag == "--threads") threads = PositiveInt(argv[0], flag, value);
    if (flag == "--backend") {
      if (value != "cpu" && value != "gloo") Usage(argv[0], "--backend: cpu or gloo, not " + value);
      backend = value == "gloo" ? testing::ForkedBackend::kGloo : testing::ForkedBackend::kCpu;
    }
    if (flag == "--layout") {
      int tp = 0, pp = 0, dp = 0;
      char rest = 0;
      if (std::sscanf(value.c_str(), "%dx%dx%d%c", &tp, &pp, &dp, &rest) != 3 || tp < 1 ||
          pp < 1 || dp < 1 || tp * pp * dp > 64) {
        Usage(argv[0], "--layout: TPxPPxDP (for example 1x1x2), not " + value);
      }
      only.push_back(Layout{tp, pp, dp, 4});
    }
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const model::ModelConfig config = BenchConfig();
  std::printf(
      "GPT layers=%ld d_model=%ld heads=%ld vocab=%ld seq=%d, global batch %d, %d timed steps "
      "after 1 warm-up, %d cores, %s\n\n",
      config.layers, config.d_model, config.heads, config.vocab, kSeqLen, kGlobalBatch, steps,
      cores,
      backend == testing::ForkedBackend::kGloo ? "Gloo over loopback"
                                               : "the CPU backend (shared memory)");
  if (schedules_only) {
    ScheduleTable(steps, threads, cores, backend);
    return 0;
  }
  std::printf("tp pp dp | world thr/rank | step ms | tokens/s | compute  comm  bubble (share of "
              "the slowest rank's step)\n");
  std::vector<Layout> layouts = {{1, 1, 1, 4}, {2, 1, 1, 4}, {1, 2, 1, 4}, {1, 1, 2, 4},
                                 {2, 2, 1, 4}, {2, 1, 2, 4}, {1, 2, 2, 4}, {4, 1, 1, 4},
                                 {1, 4, 1, 4}, {1, 1, 4, 4}};
  if (!only.empty()) layouts = only;
  for (const Layout& layout : layouts) {
    const int world = layout.tp * layout.pp * layout.dp;
    const int per_rank = threads > 0 ? threads : std::max(1, cores / world);
    const std::vector<Measured> ranks = Run(layout, steps, per_rank, backend);
    if (ranks.empty()) continue;
    const Measured slowest =
        *std::max_element(ranks.begin(), ranks.end(),
                          [](const Measured& a, const Measured& b) { return a.seconds < b.seconds; });
    std::printf("%2d %2d %2d | %5d %8d | %7.1f | %8.0f | %6.1f%% %5.1f%% %6.1f%%%s\n", layout.tp,
                layout.pp, layout.dp, world, per_rank, slowest.seconds * 1e3,
                kGlobalBatch * kSeqLen / slowest.seconds, 100 * slowest.compute / slowest.seconds,
                100 * slowest.comm / slowest.seconds, 100 * slowest.bubble / slowest.seconds,
                world * per_rank > cores ? "  (ranks share cores)" : "");
  }

  if (!only.empty()) return 0;
  std::printf("\nPipeline bubble (tp=dp=1): measured = mean over stages of the time blocked on the\n"
              "neighbouring stage / step time; 1F1B's ideal (p-1)/(m+p-1)\n");
  std::printf(" p  m | measured | ideal\n");
  for (int p : {2, 4}) {
    for (int m : {1, 2, 4, 8}) {
      const Layout layout{1, p, 1, kGlobalBatch / m};
      const int per_rank = threads > 0 ? threads : std::max(1, cores / p);
      const std::vector<Measured> ranks = Run(layout, steps, per_rank, backend);
      if (ranks.empty()) continue;
      double fraction = 0;
      for (const Measured& r : ranks) fraction += r.bubble / r.seconds;
      fraction /= static_cast<double>(ranks.size());
      std::printf("%2d %2d | %7.1f%% | %5.1f%%\n", p, m, 100 * fraction,
                  100.0 * (p - 1) / (m + p - 1));
    }
  }
  ScheduleTable(steps, threads, cores, backend);
  return 0;
}
