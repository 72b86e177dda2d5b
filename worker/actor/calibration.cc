#include "worker/actor/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cpu/matmul.h"

namespace shardline::actor {
namespace {

using SteadyClock = std::chrono::steady_clock;

// One GEMM repetition should take about this long: long enough that the timer and the BLAS's
// thread start-up are noise, short enough that calibration stays well under 0.2 s.
constexpr double kGemmRepSeconds = 0.025;
constexpr int kGemmReps = 3;
constexpr int kGemmMinN = 128;
constexpr int kGemmMaxN = 2048;  // 3 matrices of 16 MiB: nothing an actor cannot spare
// Stop repeating once this much time went into the timed runs (a crowded machine).
constexpr double kGemmBudgetSeconds = 0.15;

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// Seconds of one n×n×n GEMM.
double TimeGemm(int n, std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  const size_t elements = static_cast<size_t>(n) * static_cast<size_t>(n);
  a.resize(elements, 0.5f);
  b.resize(elements, 0.25f);
  c.resize(elements);
  const auto start = SteadyClock::now();
  kernels::cpu::MatmulForward(c.data(), a.data(), b.data(), nullptr, n, n, n);
  return SecondsSince(start);
}

double GemmFlop(int n) { return 2.0 * n * n * static_cast<double>(n); }

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

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

absl::StatusOr<double> MeasureGemmFlops() {
  std::vector<float> a, b, c;
  // The first call also loads the BLAS and starts its threads: warm up, and size from it.
  TimeGemm(kGemmMinN, a, b, c);
  const double probe = std::max(TimeGemm(kGemmMinN, a, b, c), 1e-6);
  const double rate = GemmFlop(kGemmMinN) / probe;
  int n = static_cast<int>(std::cbrt(kGemmRepSeconds * rate / 2.0));
  n = std::clamp(n / 64 * 64, kGemmMinN, kGemmMaxN);
  double best = 0;
  const auto start = SteadyClock::now();
  for (int rep = 0; rep < kGemmReps; ++rep) {
    const double seconds = TimeGemm(n, a, b, c);
    if (seconds > 0) best = std::max(best, GemmFlop(n) / seconds);
    if (SecondsSince(start) > kGemmBudgetSeconds) break;
  }
  if (!(best > 0) || !std::isfinite(best)) {
    return absl::InternalError("GEMM calibration measured no time");
  }
  return best;
}

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
  result.latency_seconds = agreed[0];
  const double n = comm.size();
  const double bus_bytes = 2.0 * (n - 1) / n * static_cast<double>(options.large_bytes);
  // Latency is paid once per operation whatever its size; what is left is the bandwidth's.
  const double transfer = std::max(agreed[1] - agreed[0], agreed[1] * 0.05);
  result.bus_bytes_per_second = transfer > 0 ? bus_bytes / transfer : 0;
  return result;
}

absl::StatusOr<CalibrationResult> Calibrate(const std::vector<CalibrationGroup>& groups,
                                            const CalibrationOptions& options) {
  CalibrationResult result;
  if (options.measure_gemm) {
    ASSIGN_OR_RETURN(result.gemm_flops, MeasureGemmFlops());
  }
  for (const CalibrationGroup& group : groups) {
    if (group.communicator == nullptr || group.communicator->size() < 2) continue;
    auto measured = MeasureAllReduce(*group.communicator, options);
    if (!measured.ok()) return Annotate(measured.status(), "calibrating group " + group.id);
    measured->id = group.id;
    measured->kind = group.kind;
    result.groups.push_back(std::move(*measured));
  }
  return result;
}

}  // namespace shardline::actor
