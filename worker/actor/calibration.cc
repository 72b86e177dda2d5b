#include "worker/actor/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "common/process.h"
#include "common/status_macros.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/optimizer.h"
#include "model/tensor_table.h"
#include "placement/cluster_spec.h"
#include "worker/comm/shm_communicator.h"
#include "worker/model/carver.h"
#include "worker/model/gpt_block.h"
#include "worker/model/shard_layout.h"

namespace shardline::actor {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Two block shapes: (batch, seq, d_model, heads). The small one is as thin as the smallest models
// people train on CPU actors (d_model 64), the large one as wide as a CPU actor can train in
// reasonable time; their rates fix the fit below. ~2.6 GFLOP for the large stack's forward and
// backward, ~65 ms at 40 GFLOP/s: with the links' measurements the calibration takes ~0.6 s on
// one core per actor.
constexpr BlockShape kSmallBlock = {2, 64, 64, 4};
constexpr BlockShape kLargeBlock = {2, 128, 256, 8};
constexpr int kSmallReps = 9;
constexpr int kLargeReps = 5;
// Blocks run as a stack, forward through all then backward in reverse, each with its own weights
// and activations, as in training: one small block alone stays in the caches a real model's
// layers evict one another from, and measured 1.5× faster than a 4-layer d_model-128 model
// trains. A large block (3 MiB of weights) leaves the caches by itself.
constexpr int kSmallStack = 4;
constexpr int kLargeStack = 2;

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Uniform values in [-bound, bound] from a fixed seed (a 64-bit LCG: only the spread matters).
void FillUniform(std::vector<float>& values, float bound, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float unit = static_cast<float>(state >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    v = (2 * unit - 1) * bound;
  }
}

// FLOPs of one block's forward and backward as the planner's cost model counts them (the same
// function, so that the measured rate and the model's FLOPs agree by construction).
double BlockFlops(const BlockShape& shape) {
  const model::ModelConfig block{
      .layers = 1, .heads = shape.NH, .d_model = shape.C, .max_seq_len = shape.T};
  // A tensor-parallel shard does 1/tp of every GEMM and of attention.
  return 3.0 * model::BlockForwardFlopsPerToken(block, shape.T) * static_cast<double>(shape.B) *
         shape.T / shape.tp;
}

}  // namespace

absl::StatusOr<double> MeasureBlockRate(const BlockShape& shape, int blocks, int reps) {
  model::BlockDims dims;
  dims.B = shape.B;
  dims.T = shape.T;
  dims.C = shape.C;
  dims.NH = shape.NH / shape.tp;
  dims.HS = shape.C / shape.NH;
  dims.F = 4 * shape.C / shape.tp;
  const int64_t N = dims.N(), C = dims.C;
  // The blocks' tensors as the sharded model lays them out: a middle pipeline stage of `blocks`
  // layers, tensor-parallel rank 0 of shape.tp.
  model::ModelConfig config;
  config.layers = blocks;
  config.heads = shape.NH;
  config.d_model = shape.C;
  config.vocab = 257;  // the byte vocabulary; a middle stage holds no embedding
  config.max_seq_len = shape.T;
  model::ShardPlace place;
  place.tp_size = shape.tp;
  place.chunks = {{0, blocks}};
  place.first_stage = place.last_stage = false;
  ASSIGN_OR_RETURN(const model::ShardLayout layout, model::ShardLayout::Create(config, place));
  // Parameters and their gradients. The values are what training sees (GPT-2's init scale, unit
  // activations): GELU's tanh costs more or less by its argument's size, and near-zero
  // activations measured up to 1.4× faster than training.
  std::vector<float> params(static_cast<size_t>(layout.total()));
  FillUniform(params, 0.035f, 1);  // std 0.02
  std::vector<float> grads(params.size(), 0.0f);
  model::Carver count_acts(nullptr);
  model::BlockActivations counted;
  model::CarveBlockActivations(count_acts, dims, counted);
  std::vector<float> act_buffer(static_cast<size_t>(blocks * count_acts.used()));
  model::Carver carve_acts(act_buffer.data());
  std::vector<model::BlockParams> p(blocks), g(blocks);
  std::vector<model::BlockActivations> acts(blocks);
  for (int b = 0; b < blocks; ++b) {
    const int64_t begin = layout.units()[layout.layer_unit(b)].begin;
    p[b] = layout.Block(params.data() + begin);
    g[b] = layout.Block(grads.data() + begin);
    // GPT-2's layer norms start at the identity: with the GEMMs' scale they would shrink every
    // activation towards 0, where GELU's tanh is cheaper than in training.
    using enum model::TensorRole;
    std::fill(p[b][kNorm1], p[b][kNorm1] + C, 1.0f);
    std::fill(p[b][kNorm2], p[b][kNorm2] + C, 1.0f);
    std::fill(p[b][kNorm1Bias], p[b][kNorm1Bias] + C, 0.0f);
    std::fill(p[b][kNorm2Bias], p[b][kNorm2Bias] + C, 0.0f);
    model::CarveBlockActivations(carve_acts, dims, acts[b]);
  }
  model::BlockGradScratch scratch;
  model::Carver count_scratch(nullptr);
  model::CarveBlockGradScratch(count_scratch, dims, scratch);
  std::vector<float> scratch_buffer(static_cast<size_t>(count_scratch.used()));
  model::Carver carve_scratch(scratch_buffer.data());
  model::CarveBlockGradScratch(carve_scratch, dims, scratch);
  // The residual stream between blocks, and its gradient going back.
  std::vector<std::vector<float>> x(blocks + 1, std::vector<float>(N * C));
  std::vector<std::vector<float>> dx(blocks + 1, std::vector<float>(N * C));
  FillUniform(x[0], 1.7f, 2);      // std ~1
  FillUniform(dx[blocks], 1e-3f, 3);
  const double flops = blocks * BlockFlops(shape);
  std::vector<double> rates;
  kernels::cpu::CpuBackend backend;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto start = SteadyClock::now();
    for (int b = 0; b < blocks; ++b) {
      RETURN_IF_ERROR(
          model::BlockForward(backend, dims, p[b], x[b].data(), x[b + 1].data(), acts[b]));
    }
    for (int b = blocks - 1; b >= 0; --b) {
      std::fill(dx[b].begin(), dx[b].end(), 0.0f);
      RETURN_IF_ERROR(model::BlockBackward(backend, dims, p[b], g[b], x[b].data(), dx[b + 1].data(),
                                           dx[b].data(), acts[b], scratch));
    }
    const double seconds = SecondsSince(start);
    if (rep > 0 && seconds > 0) rates.push_back(flops / seconds);
  }
  if (rates.empty()) return absl::InternalError("the block calibration measured no time");
  return Median(rates);
}

double ThinDim(const BlockShape& shape) {
  return std::min<double>(static_cast<double>(shape.B) * shape.T, shape.C);
}

namespace {

// The slowest rank's value of each entry, on every rank.
absl::Status MaxOverRanks(comm::Communicator& comm, std::vector<double>& values) {
  return comm.AllReduce(values.data(), values.size(), DType::kFloat64, comm::ReduceOp::kMax);
}

// Times `reps` all-reduces of `bytes` (after one untimed warm-up) and returns each one's time.
absl::StatusOr<std::vector<double>> TimeAllReduces(comm::Communicator& comm, int64_t bytes,
                                                   int reps) {
  // f32 elements, at least one: an 8-byte all-reduce is 2 floats.
  const size_t count = static_cast<size_t>(std::max<int64_t>(1, bytes / 4));
  std::vector<float> buffer(count, 1.0f);
  RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count, DType::kFloat32, comm::ReduceOp::kSum));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    std::fill(buffer.begin(), buffer.end(), 1.0f);
    const auto start = SteadyClock::now();
    RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count, DType::kFloat32, comm::ReduceOp::kSum));
    times.push_back(SecondsSince(start));
  }
  return times;
}

}  // namespace

absl::StatusOr<LayerRate> MeasureLayerRate() {
  // The large shape first: its ~0.2 s also bring the core to its sustained clock and fault in
  // the process's memory, which a freshly started process measured the small shape without
  // (25% slower than a minute later).
  ASSIGN_OR_RETURN(const double large, MeasureBlockRate(kLargeBlock, kLargeStack, kLargeReps));
  ASSIGN_OR_RETURN(const double small, MeasureBlockRate(kSmallBlock, kSmallStack, kSmallReps));
  return FitLayerRate(ThinDim(kSmallBlock), small, ThinDim(kLargeBlock), large);
}

absl::StatusOr<double> MeasureOptimizerRate() {
  constexpr int64_t kParams = int64_t{2} << 20;
  constexpr int kReps = 3;
  std::vector<float> params(kParams), grads(kParams), m(kParams, 0.0f), v(kParams, 0.0f);
  FillUniform(params, 0.035f, 6);
  FillUniform(grads, 1e-3f, 7);
  kernels::cpu::AdamWConfig config;
  config.learning_rate = 1e-4f;
  std::vector<double> rates;
  for (int rep = 0; rep <= kReps; ++rep) {
    const auto start = SteadyClock::now();
    const std::span<const float> grad_span(grads);
    const double sum = kernels::cpu::GradSumOfSquares(std::span(&grad_span, 1));
    RETURN_IF_ERROR(kernels::cpu::AdamWUpdate(params.data(), grads.data(), m.data(), v.data(),
                                              kParams, config, rep + 1));
    const double seconds = SecondsSince(start);
    if (rep > 0 && seconds > 0 && std::isfinite(sum)) {
      rates.push_back(placement::kOptimizerBytesPerParam * kParams / seconds);
    }
  }
  if (rates.empty()) return absl::InternalError("the optimizer calibration measured no time");
  return Median(rates);
}

absl::StatusOr<LayerRate> FitLayerRate(double x1, double small, double x2, double large) {
  // r(x) = R·x / (x + h) is 1/r = 1/R + (h/R)·(1/x): a line through the two measurements.
  const double slope = (1 / small - 1 / large) / (1 / x1 - 1 / x2);
  LayerRate rate;
  if (slope > 0) {
    const double intercept = 1 / large - slope / x2;
    if (intercept > 0) {
      rate.flops = 1 / intercept;
      rate.half_dim = slope / intercept;
    }
  }
  if (!(rate.flops > 0)) {
    // The small block ran as fast as the large one (or noise says faster): no fall-off to fit.
    rate.flops = std::max(small, large);
    rate.half_dim = 0;
  }
  if (!std::isfinite(rate.flops) || !std::isfinite(rate.half_dim)) {
    return absl::InternalError("the block calibration measured no usable rate");
  }
  return rate;
}

namespace {

// What one all-reduce of `bytes` adds to a stretch of kernels, as training runs them: the median
// time of `reps` rounds of (a fixed amount of GEMM work, then the all-reduce) less the median
// time of the same work alone. It includes waiting for a rank the scheduler held back, waking up,
// and the slower kernels right after (the collective's buffers evicted their data from the
// caches), none of which a back-to-back all-reduce pays. The work is sized to ~busy_seconds.
absl::StatusOr<double> TimeLoadedAllReduce(comm::Communicator& comm, int64_t bytes, int reps,
                                           double busy_seconds) {
  const size_t count = static_cast<size_t>(std::max<int64_t>(1, bytes / 4));
  std::vector<float> buffer(count, 1.0f);
  // A kernel's footprint: three 256 KiB matrices (L2-sized, like a layer's tiles).
  constexpr int kBusyN = 256;
  std::vector<float> a(kBusyN * kBusyN), b(a.size()), c(a.size());
  FillUniform(a, 1.0f, 4);
  FillUniform(b, 1.0f, 5);
  auto gemm = [&] {
    kernels::cpu::MatmulForward(c.data(), a.data(), b.data(), nullptr, kBusyN, kBusyN, kBusyN);
  };
  gemm();
  const auto probe = SteadyClock::now();
  gemm();
  const int gemms = std::clamp(static_cast<int>(busy_seconds / std::max(SecondsSince(probe), 1e-6)),
                               1, 1000);
  // The same number of GEMMs on every rank, so that their work is equal as in training.
  std::vector<double> agreed_gemms = {static_cast<double>(gemms)};
  RETURN_IF_ERROR(MaxOverRanks(comm, agreed_gemms));
  const int work = static_cast<int>(agreed_gemms[0]);
  // Each round's difference, so that a slow stretch of the machine (another process, a clock
  // change) falls on both halves of one round rather than on one side of two medians.
  std::vector<double> added;
  for (int i = 0; i <= reps; ++i) {
    auto start = SteadyClock::now();
    for (int g = 0; g < work; ++g) gemm();
    const double alone = SecondsSince(start);
    std::fill(buffer.begin(), buffer.end(), 1.0f);
    start = SteadyClock::now();
    for (int g = 0; g < work; ++g) gemm();
    RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count, DType::kFloat32, comm::ReduceOp::kSum));
    if (i > 0) added.push_back(SecondsSince(start) - alone);  // the first round warms up
  }
  return std::max(0.0, Median(added));
}

}  // namespace

absl::StatusOr<GroupBandwidth> MeasureAllReduce(comm::Communicator& comm,
                                                const CalibrationOptions& options) {
  GroupBandwidth result;
  result.ranks = comm.size();
  ASSIGN_OR_RETURN(std::vector<double> small,
                   TimeAllReduces(comm, options.small_bytes, std::max(1, options.small_reps)));
  ASSIGN_OR_RETURN(std::vector<double> large,
                   TimeAllReduces(comm, options.large_bytes, std::max(1, options.large_reps)));
  // A rank that entered an all-reduce early waited for the others: the slowest rank's time is
  // the operation's.
  std::vector<double> agreed = {Median(small), *std::min_element(large.begin(), large.end())};
  RETURN_IF_ERROR(MaxOverRanks(comm, agreed));
  result.idle_latency_seconds = agreed[0];
  const double n = comm.size();
  auto bus_bytes = [n](int64_t bytes) { return 2.0 * (n - 1) / n * static_cast<double>(bytes); };
  // Latency is paid once per operation whatever its size; what is left is the bandwidth's.
  const double transfer = std::max(agreed[1] - agreed[0], agreed[1] * 0.05);
  result.bus_bytes_per_second = transfer > 0 ? bus_bytes(options.large_bytes) / transfer : 0;
  // Between kernels a collective costs more than back to back (TimeLoadedAllReduce). The step
  // pays what the collective adds to the rank that reaches it last (the others' wait for it is
  // time they would have idled anyway), and that rank adds the least: the minimum over ranks.
  // (The mean, which this was, counts the early ranks' waits for a peer whose identical GEMMs
  // ran slower: 0.1-0.4 ms on some runs where training pays ~20 us, and a prediction 57% off.)
  ASSIGN_OR_RETURN(const double loaded,
                   TimeLoadedAllReduce(comm, options.loaded_bytes,
                                       std::max(1, options.loaded_reps), options.busy_seconds));
  std::vector<double> last_arrival = {loaded};
  RETURN_IF_ERROR(
      comm.AllReduce(last_arrival.data(), 1, DType::kFloat64, comm::ReduceOp::kMin));
  const double loaded_transfer =
      result.bus_bytes_per_second > 0 ? bus_bytes(options.loaded_bytes) / result.bus_bytes_per_second
                                      : 0;
  result.latency_seconds = std::max(agreed[0], last_arrival[0] - loaded_transfer);
  return result;
}

double HostShare::cpu_share() const {
  return std::min(1.0, static_cast<double>(cpus) / (static_cast<double>(ranks) * threads));
}

int HostShare::concurrent_ranks() const { return std::max(1, cpus / std::max(1, threads)); }

namespace {

HostShare OwnHostShare(const CalibrationOptions& options) {
  HostShare host;
  host.threads = std::max(1, options.threads > 0 ? options.threads : kernels::cpu::CpuThreads());
  host.cpus = options.cpus > 0 ? options.cpus : UsableCpus();
  return host;
}

// Turns in which the ranks of every host compute: as many as the most crowded host needs.
int TurnsOf(const HostShare& host) {
  const int concurrent = host.concurrent_ranks();
  return (host.ranks + concurrent - 1) / concurrent;
}

}  // namespace

absl::StatusOr<HostShare> MeasureHostShare(comm::Communicator& world,
                                           const CalibrationOptions& options) {
  HostShare own = OwnHostShare(options);
  const std::string host_id = options.host_id.empty() ? comm::LocalHostIdentity() : options.host_id;
  // Hashed to fit a fixed-size all-gather; two hosts colliding in 64 bits is not a concern.
  const int64_t mine[3] = {static_cast<int64_t>(std::hash<std::string>{}(host_id)), own.threads,
                           own.cpus};
  const int n = world.size();
  std::vector<int64_t> all(3 * static_cast<size_t>(n));
  RETURN_IF_ERROR(world.AllGather(mine, all.data(), 3, DType::kInt64));
  own.ranks = 0;
  own.index = 0;
  for (int r = 0; r < n; ++r) {
    if (all[3 * r] != mine[0]) continue;
    if (r < world.rank()) ++own.index;
    ++own.ranks;
  }
  return own;
}

namespace {

// Training's collectives run over the tp, pp and dp groups; the world carries none of them (a
// data-parallel job's world has its dp group's ranks, and that group is measured). Measured, a
// time-shared host's world would also report every rank of it contending at once, which no
// step does, and the coordinator keeps a node's slowest link.
bool CarriesTraining(const CalibrationGroup& group) { return group.kind != "world"; }

// Measures `group` (this rank is in it) and adds it to `result` under its id and kind.
absl::Status MeasureGroup(const CalibrationGroup& group, const CalibrationOptions& options,
                          CalibrationResult& result) {
  absl::StatusOr<GroupBandwidth> measured = MeasureAllReduce(*group.communicator, options);
  if (!measured.ok()) return Annotate(measured.status(), "calibrating group " + group.id);
  measured->id = group.id;
  measured->kind = group.kind;
  result.groups.push_back(std::move(*measured));
  return absl::OkStatus();
}

// Calibrate() on a time-shared host (calibration.h): the compute in `turns` rounds of the ranks
// the CPUs run at once, then each group alone, the others' ranks waiting on `world` (the shared
// memory barrier sleeps on a futex once ranks outnumber CPUs, so a waiting rank takes no core).
absl::StatusOr<CalibrationResult> CalibrateInTurns(const std::vector<CalibrationGroup>& groups,
                                                   const CalibrationOptions& options,
                                                   comm::Communicator& world, int turns,
                                                   CalibrationResult result) {
  for (int turn = 0; turn < turns; ++turn) {
    if (options.measure_compute && result.host.index % turns == turn) {
      ASSIGN_OR_RETURN(result.compute, MeasureLayerRate());
      ASSIGN_OR_RETURN(result.optimizer_bytes_per_second, MeasureOptimizerRate());
    }
    RETURN_IF_ERROR(world.Barrier());
  }
  // Every rank walks the same list and takes the same turns, member of a group or not.
  for (const CalibrationGroup& group : groups) {
    if (group.ranks.empty()) {
      return absl::InvalidArgumentError("group " + group.id +
                                        ": calibrating in turns needs every group's ranks");
    }
    if (group.ranks.size() < 2 || !CarriesTraining(group)) continue;
    if (group.communicator != nullptr) RETURN_IF_ERROR(MeasureGroup(group, options, result));
    RETURN_IF_ERROR(world.Barrier());
  }
  return result;
}

}  // namespace

absl::StatusOr<CalibrationResult> Calibrate(const std::vector<CalibrationGroup>& groups,
                                            const CalibrationOptions& options) {
  CalibrationResult result;
  comm::Communicator* world = nullptr;
  for (const CalibrationGroup& group : groups) {
    if (group.kind == "world" && group.communicator != nullptr) world = group.communicator;
  }
  result.host = OwnHostShare(options);
  int turns = 1;
  if (world != nullptr && world->size() > 1) {
    ASSIGN_OR_RETURN(result.host, MeasureHostShare(*world, options));
    // Every rank must take the same number of turns: the most crowded host's.
    std::vector<double> most = {static_cast<double>(TurnsOf(result.host))};
    RETURN_IF_ERROR(MaxOverRanks(*world, most));
    turns = static_cast<int>(most[0]);
  }
  if (turns > 1) return CalibrateInTurns(groups, options, *world, turns, std::move(result));
  if (options.measure_compute) {
    ASSIGN_OR_RETURN(result.compute, MeasureLayerRate());
    ASSIGN_OR_RETURN(result.optimizer_bytes_per_second, MeasureOptimizerRate());
  }
  for (const CalibrationGroup& group : groups) {
    if (group.communicator == nullptr || group.communicator->size() < 2 ||
        !CarriesTraining(group)) {
      continue;
    }
    RETURN_IF_ERROR(MeasureGroup(group, options, result));
  }
  return result;
}

}  // namespace shardline::actor
