#include "worker/actor/comm_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace shardline::actor {
namespace {

using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

// Small integers: sums over any world size stay exact in f32, and every rank can compute every
// other rank's input.
float Value(int rank, size_t i) { return static_cast<float>((rank * 7 + i * 3) % 17 + 1); }

struct Mismatch {
  bool found = false;
  std::string text;
};

void Check(const std::vector<float>& got, const std::vector<float>& want, bool approximate,
           Mismatch* mismatch) {
  for (size_t i = 0; i < want.size(); ++i) {
    const float tolerance = approximate ? 1e-6f * std::fabs(want[i]) + 1e-6f : 0.0f;
    if (std::fabs(got[i] - want[i]) > tolerance || std::isnan(got[i])) {
      mismatch->found = true;
      mismatch->text = "element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                       ", expected " + std::to_string(want[i]);
      return;
    }
  }
}

double BusFactor(const std::string& op, int n) {
  if (op.rfind("all_reduce", 0) == 0) return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  return 1.0;
}

// One (op, size): `setup` fills the buffers (untimed), `run` is the collective, `verify` checks
// the output of a run after a setup.
struct Case {
  std::function<void()> setup;
  std::function<absl::Status()> run;
  std::function<void(Mismatch*)> verify;
  uint64_t bytes = 0;
};

Case MakeCase(const std::string& op, comm::Communicator& comm, size_t elements, int iteration_root,
              std::vector<float>& a, std::vector<float>& b, std::vector<float>& want) {
  const int n = comm.size();
  const int rank = comm.rank();
  Case c;
  if (op.rfind("all_reduce_", 0) == 0) {
    const std::string kind = op.substr(11);
    const ReduceOp reduce = kind == "sum"   ? ReduceOp::kSum
                            : kind == "avg" ? ReduceOp::kAvg
                            : kind == "max" ? ReduceOp::kMax
                                            : ReduceOp::kMin;
    a.resize(elements);
    want.assign(elements, 0);
    for (size_t i = 0; i < elements; ++i) {
      float acc = Value(0, i);
      for (int r = 1; r < n; ++r) {
        const float v = Value(r, i);
        acc = reduce == ReduceOp::kMax ? std::max(acc, v)
              : reduce == ReduceOp::kMin ? std::min(acc, v)
                                         : acc + v;
      }
      want[i] = reduce == ReduceOp::kAvg ? acc / static_cast<float>(n) : acc;
    }
    c.bytes = elements * sizeof(float);
    c.setup = [&a, rank, elements] {
      for (size_t i = 0; i < elements; ++i) a[i] = Value(rank, i);
    };
    c.run = [&comm, &a, reduce] {
      return comm.AllReduce(a.data(), a.size(), DType::kFloat32, reduce);
    };
    c.verify = [&a, &want, reduce](Mismatch* m) { Check(a, want, reduce == ReduceOp::kAvg, m); };
  } else if (op == "all_gather") {
    const size_t count = std::max<size_t>(1, elements / n);
    a.resize(count);
    b.assign(count * n, 0);
    want.resize(count * n);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) want[r * count + i] = Value(r, i);
    c.bytes = count * n * sizeof(float);
    c.setup = [&a, &b, rank, count] {
      for (size_t i = 0; i < count; ++i) a[i] = Value(rank, i);
      std::fill(b.begin(), b.end(), -1.0f);
    };
    c.run = [&comm, &a, &b, count] {
      return comm.AllGather(a.data(), b.data(), count, DType::kFloat32);
    };
    c.verify = [&b, &want](Mismatch* m) { Check(b, want, false, m); };
  } else if (op == "reduce_scatter") {
    const size_t count = std::max<size_t>(1, elements / n);
    a.resize(count * n);
    b.assign(count, 0);
    want.assign(count, 0);
    for (size_t i = 0; i < count; ++i)
      for (int r = 0; r < n; ++r) want[i] += Value(r, rank * count + i);
    c.bytes = count * n * sizeof(float);
    c.setup = [&a, &b, rank] {
      for (size_t i = 0; i < a.size(); ++i) a[i] = Value(rank, i);
      std::fill(b.begin(), b.end(), -1.0f);
    };
    c.run = [&comm, &a, &b, count] {
      return comm.ReduceScatter(a.data(), b.data(), count, DType::kFloat32, ReduceOp::kSum);
    };
    c.verify = [&b, &want](Mismatch* m) { Check(b, want, false, m); };
  } else if (op == "broadcast") {
    const int root = iteration_root % n;
    a.resize(elements);
    want.resize(elements);
    for (size_t i = 0; i < elements; ++i) want[i] = Value(root, i);
    c.bytes = elements * sizeof(float);
    c.setup = [&a, rank, root] {
      for (size_t i = 0; i < a.size(); ++i) a[i] = rank == root ? Value(root, i) : -1.0f;
    };
    c.run = [&comm, &a, root] {
      return comm.Broadcast(a.data(), a.size(), DType::kFloat32, root);
    };
    c.verify = [&a, &want](Mismatch* m) { Check(a, want, false, m); };
  } else if (op == "send_recv") {
    // A ring: each rank sends to the next and receives from the previous. Even ranks send
    // first and odd ranks receive first, so blocking sends cannot all wait on each other.
    const int next = (rank + 1) % n;
    const int prev = (rank + n - 1) % n;
    a.resize(elements);
    b.assign(elements, 0);
    want.resize(elements);
    for (size_t i = 0; i < elements; ++i) want[i] = Value(prev, i);
    c.bytes = elements * sizeof(float);
    c.setup = [&a, &b, rank] {
      for (size_t i = 0; i < a.size(); ++i) a[i] = Value(rank, i);
      std::fill(b.begin(), b.end(), -1.0f);
    };
    c.run = [&comm, &a, &b, rank, next, prev]() -> absl::Status {
      if (rank % 2 == 0) {
        RETURN_IF_ERROR(comm.Send(a.data(), a.size(), DType::kFloat32, next));
        return comm.Recv(b.data(), b.size(), DType::kFloat32, prev);
      }
      RETURN_IF_ERROR(comm.Recv(b.data(), b.size(), DType::kFloat32, prev));
      return comm.Send(a.data(), a.size(), DType::kFloat32, next);
    };
    c.verify = [&b, &want](Mismatch* m) { Check(b, want, false, m); };
  } else {  // barrier
    c.setup = [] {};
    c.run = [&comm] { return comm.Barrier(); };
    c.verify = [](Mismatch*) {};
  }
  return c;
}

}  // namespace

absl::StatusOr<std::vector<CommCheckResult>> RunCommCheck(
    comm::Communicator& comm, const placement::CommCheckSpec& spec,
    const std::function<void(const std::vector<CommCheckResult>&)>& on_op_done,
    std::string* local_mismatch) {
  std::vector<std::string> ops = spec.ops;
  if (ops.empty()) ops.assign(placement::kCommCheckOps.begin(), placement::kCommCheckOps.end());
  const std::vector<int64_t> sizes = placement::CommCheckSizesBytes(spec);
  const int n = comm.size();
  std::vector<CommCheckResult> all;
  std::vector<float> a, b, want;
  for (const auto& op : ops) {
    std::vector<CommCheckResult> op_results;
    const std::vector<int64_t> op_sizes = op == "barrier" ? std::vector<int64_t>{0} : sizes;
    for (size_t s = 0; s < op_sizes.size(); ++s) {
      const size_t elements = static_cast<size_t>(op_sizes[s]) / sizeof(float);
      Case c = MakeCase(op, comm, elements, static_cast<int>(s), a, b, want);
      const auto failed = [&](const absl::Status& status) {
        return Annotate(status, op + " of " + std::to_string(c.bytes) + " bytes");
      };
      // nccl-tests' habits: untimed warm-ups (the backend's first runs at a size fault its pages
      // in and tune it), then the timed runs back to back from a barrier, so that no rank's
      // time holds another's late start or its own set-up; in-place operations go on reducing
      // their own output meanwhile, which costs the same. Then a run from fresh inputs whose
      // output is checked.
      c.setup();
      const bool auto_warmup = spec.warmup_iterations == placement::CommCheckSpec::kAutoWarmup;
      const int first_warmups =
          auto_warmup ? placement::CommCheckSpec::kMinAutoWarmups : spec.warmup_iterations;
      const auto warm_start = Clock::now();
      for (int it = 0; it < first_warmups; ++it) {
        if (absl::Status status = c.run(); !status.ok()) return failed(status);
      }
      if (auto_warmup) {
        // Every rank must run as many: the count comes from the slowest rank's time.
        double per_run =
            std::chrono::duration<double>(Clock::now() - warm_start).count() / first_warmups;
        RETURN_IF_ERROR(comm.AllReduce(&per_run, 1, DType::kFloat64, ReduceOp::kMax));
        const double fit = placement::CommCheckSpec::kAutoWarmupSeconds / std::max(per_run, 1e-9);
        const int more = static_cast<int>(std::clamp(
            fit - first_warmups, 0.0,
            static_cast<double>(placement::CommCheckSpec::kMaxAutoWarmups - first_warmups)));
        for (int it = 0; it < more; ++it) {
          if (absl::Status status = c.run(); !status.ok()) return failed(status);
        }
      }
      if (absl::Status status = comm.Barrier(); !status.ok()) return failed(status);
      const auto start = Clock::now();
      for (int it = 0; it < spec.iterations; ++it) {
        if (absl::Status status = c.run(); !status.ok()) return failed(status);
      }
      const double total = std::chrono::duration<double>(Clock::now() - start).count();
      c.setup();
      if (absl::Status status = c.run(); !status.ok()) return failed(status);
      Mismatch mismatch;
      c.verify(&mismatch);
      if (mismatch.found) {
        const std::string text = op + " of " + std::to_string(c.bytes) + " bytes on rank " +
                                 std::to_string(comm.rank()) + ": " + mismatch.text;
        spdlog::error("comm-check mismatch: {}", text);
        if (local_mismatch && local_mismatch->empty()) *local_mismatch = text;
      }
      // Agree on the verdict and the time: the slowest rank's time, the first failing rank.
      double agreed[2] = {total / spec.iterations,
                          mismatch.found ? static_cast<double>(comm.rank()) : n};
      RETURN_IF_ERROR(comm.AllReduce(&agreed[0], 1, DType::kFloat64, ReduceOp::kMax));
      RETURN_IF_ERROR(comm.AllReduce(&agreed[1], 1, DType::kFloat64, ReduceOp::kMin));
      CommCheckResult result;
      result.op = op;
      result.bytes = c.bytes;
      result.ranks = n;
      result.seconds = agreed[0];
      result.ok = agreed[1] >= n;
      if (!result.ok) {
        result.detail = "verification failed on rank " +
                        std::to_string(static_cast<int>(agreed[1])) + " (see its log)";
      }
      if (c.bytes > 0 && result.seconds > 0) {
        result.algorithm_gbps = static_cast<double>(c.bytes) / result.seconds / 1e9;
        result.bus_gbps = result.algorithm_gbps * BusFactor(op, n);
      }
      op_results.push_back(result);
    }
    if (on_op_done) on_op_done(op_results);
    all.insert(all.end(), op_results.begin(), op_results.end());
  }
  return all;
}

}  // namespace shardline::actor
