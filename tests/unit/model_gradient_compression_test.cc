// model::GradientCompressor (worker/model/gradient_compression.h) in forked processes over real
// communicators: ranks are given distinct host identities so that the group is 2 or 3 "hosts" of
// 1 rank (Gloo) or 2 hosts of 2 ranks (shared memory inside, Gloo between), or one host (shared
// memory). Each rank writes what it computed to files; the parent holds them against references
// written here (PowerSGD in double precision, the int8 scheme as specified) and, where Debian's
// /usr/bin/python3 has torch, against PyTorch's own powerSGD_hook
// (tests/unit/model_gradient_compression_reference.py).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/counter_hash.h"
#include "worker/comm/cpu_communicator.h"
#include "worker/comm/file_store.h"
#include "worker/model/counter_rng.h"
#include "worker/model/gradient_compression.h"

namespace shardline::model {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kPython[] = "/usr/bin/python3";

// ---- The bucket every case reduces: a slice of a larger gradient buffer. ----

constexpr int64_t kTotal = 440;
constexpr int64_t kBegin = 7;
// Compressible at rank 2 (the hook's rule, rate 2): 16x12 and 20x10; too small: 4x3; a vector of
// 5 between them; distinct shapes in offset order, so the hook's grouping by shape keeps this
// order.
const std::vector<BucketMatrix> kMatrices = {{0, 16, 12}, {197, 20, 10}, {397, 4, 3}};
constexpr int64_t kVectorBegin = 192, kVectorSize = 5;
constexpr int64_t kBucket = 409;

std::vector<int64_t> ShapeOfTensors() {  // the bucket's tensors in order: rows, cols (0 = vector)
  return {16, 12, kVectorSize, 0, 20, 10, 4, 3};
}

// Rank r's gradient at step t: uniform in [-1, 1), a pure function of (seed, rank, step, index).
float Gradient(uint64_t seed, int rank, int step, int64_t i) {
  const uint64_t bits = Hash3(seed, static_cast<uint64_t>(rank) * 1000 + step, i);
  return static_cast<float>(UniformOpen(bits) * 2.0 - 1.0);
}

std::vector<float> RankGradient(uint64_t seed, int rank, int step, int64_t n = kBucket) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = Gradient(seed, rank, step, i);
  return g;
}

// ---- Files between the ranks and the parent. ----

void WriteFloats(const std::string& path, std::span<const float> values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size_bytes()));
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

std::string FileOf(const std::string& dir, const std::string& what, int rank, int step) {
  return dir + "/" + what + "_" + std::to_string(rank) + "_" + std::to_string(step) + ".bin";
}

std::vector<float> FactorsOf(const GradientCompressor& c) {
  std::vector<float> all;
  for (const WarmStartFactor& f : c.warm_start()) all.insert(all.end(), f.q.begin(), f.q.end());
  return all;
}

// ---- A world of forked ranks on distinct "hosts". ----

struct World {
  int hosts = 1;
  int per_host = 1;
  int size() const { return hosts * per_host; }
  // Rank r is on host r % hosts (each host's ranks are not contiguous), local rank r / hosts.
  int host_of(int rank) const { return rank % hosts; }
  std::string Name() const {
    return std::to_string(hosts) + " hosts x " + std::to_string(per_host) + " rank" +
           (per_host > 1 ? "s" : "");
  }
};

using RankBody = std::function<int(int rank, comm::Communicator& group, const std::string& dir)>;

std::string MakeTempDir() {
  std::string pattern = "/tmp/shardline_compress_XXXXXX";
  return mkdtemp(pattern.data()) == nullptr ? std::string() : pattern;
}

int RunRank(const World& world, int rank, const std::string& dir, const RankBody& body) {
  auto files = comm::FileStore::Open(dir + "/store");
  if (!files.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, files.status().ToString().c_str());
    return 90;
  }
  comm::CpuCommOptions options;
  options.gloo.hostname = "127.0.0.1";
  options.gloo.timeout = std::chrono::seconds(30);
  options.shm.timeout = std::chrono::seconds(30);
  options.host_id = "host-" + std::to_string(world.host_of(rank));
  comm::PrefixStore store("dp", **files);
  auto group = comm::CreateCpuCommunicator(store, rank, world.size(), options);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
    return 91;
  }
  return body(rank, **group, dir);
}

// Forks the world's ranks (this process has no communicator threads to lose), waits for them with
// a deadline, and fails the test naming each rank that did not exit 0.
void RunWorld(const World& world, const std::string& dir, const RankBody& body) {
  std::filesystem::create_directories(dir + "/store");
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < world.size(); ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int code = RunRank(world, rank, dir, body);
      std::fflush(nullptr);
      _exit(code);  // never back into gtest
    }
    children.push_back(pid);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  for (int rank = 0; rank < world.size(); ++rank) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(children[rank], &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done == 0) {
      for (pid_t pid : children) kill(pid, SIGKILL);
      waitpid(children[rank], &status, 0);
      ADD_FAILURE() << world.Name() << ": rank " << rank << " did not finish within 120 s";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << world.Name() << ": rank " << rank << " exited with "
        << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
}

// The body every reference case runs: `steps` sums of the ranks' gradients, each rank writing its
// output, and each leader its carried error, server error and factors, after every step.
RankBody CompressSteps(const CompressionOptions& options, uint64_t seed, int steps) {
  return [=](int rank, comm::Communicator& group, const std::string& dir) {
    auto compressor = GradientCompressor::Create(options, group.host_split(), kTotal);
    if (!compressor.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, compressor.status().ToString().c_str());
      return 1;
    }
    GradientCompressor& c = **compressor;
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g = RankGradient(seed, rank, step);
      const absl::Status status = c.AllReduceSum(kBegin, g.data(), kBucket, kMatrices);
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d step %d: %s\n", rank, step, status.ToString().c_str());
        return 2;
      }
      WriteFloats(FileOf(dir, "out", rank, step), g);
      if (c.holds_state()) {
        WriteFloats(FileOf(dir, "error", rank, step), c.carried_error());
        WriteFloats(FileOf(dir, "server", rank, step), c.server_error());
        WriteFloats(FileOf(dir, "q", rank, step), FactorsOf(c));
        WriteFloats(FileOf(dir, "site", rank, step),
                    std::vector<float>{static_cast<float>(c.site())});
      }
    }
    return 0;
  };
}

// What each site reduces: the exact sum of its host's ranks' gradients (two ranks: a + b, the
// same in any order, as the shared-memory sum computes it).
std::vector<std::vector<float>> SiteInputs(const World& world, uint64_t seed, int step) {
  std::vector<std::vector<float>> sites(world.hosts, std::vector<float>(kBucket, 0.0f));
  for (int rank = 0; rank < world.size(); ++rank) {
    const std::vector<float> g = RankGradient(seed, rank, step);
    auto& site = sites[world.host_of(rank)];
    for (int64_t i = 0; i < kBucket; ++i) site[i] += g[i];
  }
  return sites;
}

double MaxAbs(std::span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// Fails with the first element that is off by more than `tolerance` · (1 + max |expected|).
template <typename A, typename B>
void ExpectClose(const A& actual, const B& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 1.0;
  for (auto x : expected) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (!(std::fabs(a - e) <= tolerance * scale)) {
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << e
                    << " (tolerance " << tolerance * scale << ")";
      return;
    }
  }
}

// ---- How each CPU transport splits a group into hosts. ----

TEST(HostSplitTest, EachTransportSaysWhereItsRanksAre) {
  for (const World world : {World{.hosts = 2, .per_host = 1}, World{.hosts = 2, .per_host = 2},
                            World{.hosts = 1, .per_host = 3}}) {
    const std::string dir = MakeTempDir();
    RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string&) {
      const comm::HostSplit split = group.host_split();
      const int host = world.hosts == 1 ? 0 : world.host_of(rank);
      const int local_rank = world.per_host == 1 ? 0 : rank / world.hosts;
      int code = 0;
      auto expect = [&](bool ok, const char* what) {
        if (!ok) std::fprintf(stderr, "rank %d of %s: %s\n", rank, world.Name().c_str(), what);
        if (!ok && code == 0) code = 10;
      };
      expect(split.host == host && split.hosts == world.hosts, "host index or count");
      expect(split.local_rank == local_rank && split.local_size == world.per_host,
             "local rank or size");
      expect((split.local == nullptr) == (world.per_host == 1), "local group present iff shared");
      expect(split.local == nullptr ||
                 (split.local->rank() == local_rank && split.local->size() == world.per_host),
             "local group's rank and size");
      expect((split.cross == nullptr) == (world.hosts == 1), "cross group present iff hosts > 1");
      expect(split.cross == nullptr ||
                 (split.cross->rank() == host && split.cross->size() == world.hosts),
             "cross group's rank and size");
      // One rank per host is plain Gloo: the group itself is the cross-host group.
      expect(world.per_host > 1 || split.cross == &group, "Gloo's own group as the cross group");
      return code;
    });
    std::filesystem::remove_all(dir);
  }
}

// ---- PowerSGD, as Vogels et al. and the hook define it, in double precision. ----

using Matrix = std::vector<double>;  // row-major

void GramSchmidt(Matrix& a, int64_t rows, int64_t r, double epsilon) {
  for (int64_t i = 0; i < r; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < rows; ++k) norm += a[k * r + i] * a[k * r + i];
    norm = std::sqrt(norm);
    for (int64_t k = 0; k < rows; ++k)
      a[k * r + i] = norm > 0 ? a[k * r + i] / (norm + epsilon) : 0;
    for (int64_t j = i + 1; j < r; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k) dot += a[k * r + i] * a[k * r + j];
      for (int64_t k = 0; k < rows; ++k) a[k * r + j] -= dot * a[k * r + i];
    }
  }
}

class ReferencePowerSgd {
 public:
  ReferencePowerSgd(const CompressionOptions& options, int sites)
      : options_(options), errors_(sites, std::vector<double>(kBucket, 0.0)) {}

  // One step over the sites' inputs: the sum (every site gets the same).
  std::vector<double> Step(const std::vector<std::vector<float>>& inputs) {
    const int sites = static_cast<int>(inputs.size());
    std::vector<std::vector<double>> m(sites);
    for (int s = 0; s < sites; ++s) {
      m[s].resize(kBucket);
      for (int64_t i = 0; i < kBucket; ++i) m[s][i] = inputs[s][i] + errors_[s][i];
    }
    std::vector<double> out(kBucket, 0.0);
    for (int s = 0; s < sites; ++s) {
      for (int64_t i = 0; i < kBucket; ++i) out[i] += m[s][i];
      std::fill(errors_[s].begin(), errors_[s].end(), 0.0);
    }
    for (const BucketMatrix& bm : kMatrices) {
      const int64_t rows = bm.rows, cols = bm.cols;
      const int64_t r = std::min<int64_t>({options_.rank, rows, cols});
      if ((rows + cols) * r * options_.min_compression_rate >= static_cast<double>(rows * cols)) {
        continue;  // summed exactly, above
      }
      Matrix& q = q_[bm.offset];
      if (q.empty()) {
        q.resize(cols * r);
        for (int64_t i = 0; i < cols * r; ++i) {
          // The documented generator, rounded to float as the compressor stores it.
          q[i] =
              static_cast<float>(NormalAt(options_.seed, kInitialQStream + kBegin + bm.offset, i));
        }
      }
      GramSchmidt(q, cols, r, options_.orthogonalization_epsilon);
      Matrix p(rows * r, 0.0);
      for (int s = 0; s < sites; ++s) {
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j)
            for (int64_t k = 0; k < r; ++k)
              p[i * r + k] += m[s][bm.offset + i * cols + j] * q[j * r + k];
      }
      GramSchmidt(p, rows, r, options_.orthogonalization_epsilon);
      std::fill(q.begin(), q.end(), 0.0);
      for (int s = 0; s < sites; ++s) {
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j)
            for (int64_t k = 0; k < r; ++k)
              q[j * r + k] += m[s][bm.offset + i * cols + j] * p[i * r + k] / sites;
      }
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          double approx = 0;
          for (int64_t k = 0; k < r; ++k) approx += p[i * r + k] * q[j * r + k];
          const int64_t at = bm.offset + i * cols + j;
          out[at] = approx * sites;
          for (int s = 0; s < sites; ++s) errors_[s][at] = m[s][at] - approx;
        }
      }
    }
    return out;
  }

  const std::vector<double>& error(int site) const { return errors_[site]; }
  std::vector<double> factors() const {
    std::vector<double> all;
    for (const auto& [offset, q] : q_) all.insert(all.end(), q.begin(), q.end());
    return all;
  }

 private:
  CompressionOptions options_;
  std::vector<std::vector<double>> errors_;
  std::map<int64_t, Matrix> q_;
};

CompressionOptions PowerSgd(int rank) {
  CompressionOptions options;
  options.kind = CompressionKind::kPowerSgd;
  options.rank = rank;
  options.seed = 17;
  return options;
}

// Every rank's output, and each leader's error and factors, against the reference after every
// step.
void CheckPowerSgdAgainstReference(const World& world, const CompressionOptions& options, int steps,
                                   double tolerance) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  constexpr uint64_t kSeed = 5;
  RunWorld(world, dir, CompressSteps(options, kSeed, steps));
  ReferencePowerSgd reference(options, world.hosts);
  for (int step = 0; step < steps; ++step) {
    const std::vector<double> expected = reference.Step(SiteInputs(world, kSeed, step));
    const std::string at = world.Name() + ", step " + std::to_string(step);
    for (int rank = 0; rank < world.size(); ++rank) {
      ExpectClose(ReadFloats(FileOf(dir, "out", rank, step)), expected, tolerance,
                  at + ", rank " + std::to_string(rank) + "'s sum");
      const bool leader = rank < world.hosts;
      ASSERT_EQ(std::filesystem::exists(FileOf(dir, "error", rank, step)), leader)
          << at << ": only a host's leader holds state (rank " << rank << ")";
      if (!leader) continue;
      const int site = world.host_of(rank);
      EXPECT_EQ(ReadFloats(FileOf(dir, "site", rank, step)).at(0), site);
      const std::vector<float> error = ReadFloats(FileOf(dir, "error", rank, step));
      ASSERT_EQ(error.size(), static_cast<size_t>(kTotal));
      ExpectClose(std::vector<float>(error.begin() + kBegin, error.begin() + kBegin + kBucket),
                  reference.error(site), tolerance,
                  at + ", site " + std::to_string(site) + "'s error");
      EXPECT_EQ(MaxAbs(std::span<const float>(error).first(kBegin)), 0.0) << at;
      ExpectClose(ReadFloats(FileOf(dir, "q", rank, step)), reference.factors(), tolerance,
                  at + ", site " + std::to_string(site) + "'s Q");
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(PowerSgdTest, MatchesTheReferenceAcrossTwoHostsOfOneRank) {
  CheckPowerSgdAgainstReference({.hosts = 2, .per_host = 1}, PowerSgd(2), 3, 2e-5);
}

TEST(PowerSgdTest, MatchesTheReferenceAcrossTwoHostsOfTwoRanks) {
  CheckPowerSgdAgainstReference({.hosts = 2, .per_host = 2}, PowerSgd(2), 3, 2e-5);
}

TEST(PowerSgdTest, MatchesTheReferenceAcrossThreeHostsAtRankThree) {
  CompressionOptions options = PowerSgd(3);
  options.orthogonalization_epsilon = 1e-8f;
  CheckPowerSgdAgainstReference({.hosts = 3, .per_host = 1}, options, 3, 2e-5);
}

// At full rank (every matrix compressed, rank = min(rows, cols)), P spans the sum's columns and
// P P^T M is the sum itself.
TEST(PowerSgdTest, FullRankIsTheExactSum) {
  CompressionOptions options = PowerSgd(16);
  options.min_compression_rate = 1e-3;
  const World world{.hosts = 2, .per_host = 2};
  const std::string dir = MakeTempDir();
  constexpr uint64_t kSeed = 9;
  RunWorld(world, dir, CompressSteps(options, kSeed, 2));
  for (int step = 0; step < 2; ++step) {
    std::vector<float> exact(kBucket, 0.0f);
    for (const auto& site : SiteInputs(world, kSeed, step)) {
      for (int64_t i = 0; i < kBucket; ++i) exact[i] += site[i];
    }
    for (int rank = 0; rank < world.size(); ++rank) {
      ExpectClose(ReadFloats(FileOf(dir, "out", rank, step)), exact, 1e-5,
                  "full rank, step " + std::to_string(step) + ", rank " + std::to_string(rank));
    }
  }
  std::filesystem::remove_all(dir);
}

// Error feedback: what a step drops is exactly what the sites carry to the next one (output +
// sum of new errors = sum of inputs + sum of old errors), and so, with the same gradient every
// step, the mean output closes in on the exact sum (as 1 / steps: the carried error stays
// bounded) although each step sends rank 1 of 12.
TEST(PowerSgdTest, ErrorFeedbackCarriesWhatWasDropped) {
  const World world{.hosts = 2, .per_host = 1};
  const std::string dir = MakeTempDir();
  constexpr int kSteps = 200;
  constexpr uint64_t kSeed = 3;
  const CompressionOptions options = PowerSgd(1);
  RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string& dir) {
    auto c = GradientCompressor::Create(options, group.host_split(), kTotal);
    if (!c.ok()) return 1;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> g = RankGradient(kSeed, rank, 0);  // the same every step
      if (!(*c)->AllReduceSum(kBegin, g.data(), kBucket, kMatrices).ok()) return 2;
      WriteFloats(FileOf(dir, "out", rank, step), g);
      WriteFloats(FileOf(dir, "error", rank, step), (*c)->carried_error());
    }
    return 0;
  });
  const auto inputs = SiteInputs(world, kSeed, 0);
  std::vector<double> exact(kBucket, 0.0), old_error(kBucket, 0.0), mean(kBucket, 0.0);
  for (const auto& site : inputs)
    for (int64_t i = 0; i < kBucket; ++i) exact[i] += site[i];
  double first_gap = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> out = ReadFloats(FileOf(dir, "out", 0, step));
    ASSERT_EQ(out.size(), static_cast<size_t>(kBucket));
    std::vector<double> new_error(kBucket, 0.0), kept(kBucket);
    for (int rank = 0; rank < 2; ++rank) {
      const std::vector<float> e = ReadFloats(FileOf(dir, "error", rank, step));
      ASSERT_EQ(e.size(), static_cast<size_t>(kTotal));
      for (int64_t i = 0; i < kBucket; ++i) new_error[i] += e[kBegin + i];
    }
    for (int64_t i = 0; i < kBucket; ++i) kept[i] = out[i] + new_error[i];
    std::vector<double> given(kBucket);
    for (int64_t i = 0; i < kBucket; ++i) given[i] = exact[i] + old_error[i];
    ExpectClose(kept, given, 1e-5, "step " + std::to_string(step) + ": output + carried");
    old_error = new_error;
    double gap = 0;
    for (int64_t i = 0; i < kBucket; ++i) {
      mean[i] += (out[i] - mean[i]) / (step + 1);
      gap = std::max(gap, std::fabs(mean[i] - exact[i]));
    }
    if (step == 0) {
      first_gap = gap;
      EXPECT_GT(first_gap, 0.1) << "rank 1 should drop much of one step";
    }
    if (step == kSteps - 1) {
      EXPECT_LT(gap, first_gap / 8) << "the mean of " << kSteps << " outputs is still " << gap
                                    << " from the exact sum (first step: " << first_gap << ")";
    }
  }
  std::filesystem::remove_all(dir);
}

// A step whose gradient is zero leaves Q = M^T P = 0; the next step must not keep that Q (every
// later P and Q would be zero and nothing compressed would ever be sent): it restarts from the
// seed, so it equals a fresh compressor's first step.
TEST(PowerSgdTest, AZeroGradientDoesNotLeaveQDegenerate) {
  const World world{.hosts = 2, .per_host = 1};
  const std::string dir = MakeTempDir();
  RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string&) {
    auto after_zero = GradientCompressor::Create(PowerSgd(2), group.host_split(), kTotal);
    auto fresh = GradientCompressor::Create(PowerSgd(2), group.host_split(), kTotal);
    if (!after_zero.ok() || !fresh.ok()) return 1;
    std::vector<float> zero(kBucket, 0.0f);
    if (!(*after_zero)->AllReduceSum(kBegin, zero.data(), kBucket, kMatrices).ok()) return 2;
    std::vector<float> a = RankGradient(8, rank, 0), b = a;
    if (!(*after_zero)->AllReduceSum(kBegin, a.data(), kBucket, kMatrices).ok()) return 3;
    if (!(*fresh)->AllReduceSum(kBegin, b.data(), kBucket, kMatrices).ok()) return 4;
    if (MaxAbs(zero) != 0.0) return 5;
    if (a != b) {
      std::fprintf(stderr, "rank %d: the step after a zero gradient differs from a fresh one\n",
                   rank);
      return 6;
    }
    return 0;
  });
  std::filesystem::remove_all(dir);
}

// ---- int8: the scheme as specified, in the same float arithmetic. ----

struct Quantised {
  std::vector<int8_t> codes;
  std::vector<float> scales;
};

Quantised Quantise(const std::vector<float>& x, int64_t chunk) {
  Quantised q;
  const int64_t n = static_cast<int64_t>(x.size());
  q.codes.resize(n);
  for (int64_t from = 0; from < n; from += chunk) {
    const int64_t to = std::min(n, from + chunk);
    float max_abs = 0;
    for (int64_t i = from; i < to; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    q.scales.push_back(static_cast<float>(max_abs / 127.0));
    for (int64_t i = from; i < to; ++i) {
      q.codes[i] = max_abs == 0 ? 0 : static_cast<int8_t>(std::nearbyint(x[i] * (127.0 / max_abs)));
    }
  }
  return q;
}

float Decoded(const Quantised& q, int64_t i, int64_t chunk) {
  return static_cast<float>(q.codes[i]) * q.scales[i / chunk];
}

class ReferenceInt8 {
 public:
  ReferenceInt8(int sites, int64_t n, int64_t chunk)
      : chunk_(chunk),
        worker_(sites, std::vector<float>(n, 0.0f)),
        server_(sites, std::vector<float>(n, 0.0f)) {}

  std::vector<float> Step(const std::vector<std::vector<float>>& inputs) {
    const int sites = static_cast<int>(inputs.size());
    const int64_t n = static_cast<int64_t>(inputs[0].size());
    std::vector<Quantised> sent(sites);
    for (int s = 0; s < sites; ++s) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = inputs[s][i] + worker_[s][i];
      sent[s] = Quantise(x, chunk_);
      for (int64_t i = 0; i < n; ++i) worker_[s][i] = x[i] - Decoded(sent[s], i, chunk_);
    }
    // Site j owns chunks [K·j/sites, K·(j+1)/sites) and sums from itself, then j-1, j-2, ...
    const int64_t chunks = (n + chunk_ - 1) / chunk_;
    std::vector<float> out(n);
    for (int j = 0; j < sites; ++j) {
      const int64_t begin = std::min(n, chunks * j / sites * chunk_);
      const int64_t end = std::min(n, chunks * (j + 1) / sites * chunk_);
      std::vector<float> y(end - begin, 0.0f);
      for (int s = 0; s < sites; ++s) {
        const int from = (j - s + sites) % sites;
        for (int64_t i = begin; i < end; ++i) y[i - begin] += Decoded(sent[from], i, chunk_);
      }
      for (int64_t i = begin; i < end; ++i) y[i - begin] += server_[j][i];
      // The owner's part quantised on its own: its chunk grid is the bucket's.
      const Quantised back = Quantise(y, chunk_);
      for (int64_t i = begin; i < end; ++i) {
        out[i] = Decoded(back, i - begin, chunk_);
        server_[j][i] = y[i - begin] - out[i];
      }
    }
    return out;
  }

  const std::vector<float>& worker(int s) const { return worker_[s]; }
  const std::vector<float>& server(int s) const { return server_[s]; }

 private:
  int64_t chunk_;
  std::vector<std::vector<float>> worker_, server_;
};

CompressionOptions Int8(int64_t chunk) {
  CompressionOptions options;
  options.kind = CompressionKind::kInt8;
  options.int8_chunk = chunk;
  return options;
}

std::vector<float> BucketOf(const std::vector<float>& whole) {
  return std::vector<float>(whole.begin() + kBegin, whole.begin() + kBegin + kBucket);
}

void CheckInt8AgainstReference(const World& world, int64_t chunk, int steps) {
  const std::string dir = MakeTempDir();
  constexpr uint64_t kSeed = 11;
  RunWorld(world, dir, CompressSteps(Int8(chunk), kSeed, steps));
  ReferenceInt8 reference(world.hosts, kBucket, chunk);
  std::vector<double> old_carried(kBucket, 0.0);
  for (int step = 0; step < steps; ++step) {
    const auto inputs = SiteInputs(world, kSeed, step);
    const std::vector<float> expected = reference.Step(inputs);
    // Error feedback, whatever the reference says: the output and everything the sites now
    // carry make up the inputs and everything they carried.
    std::vector<double> kept(kBucket), given(kBucket), carried(kBucket, 0.0);
    for (int site = 0; site < world.hosts; ++site) {
      const auto worker = BucketOf(ReadFloats(FileOf(dir, "error", site, step)));
      const auto server = BucketOf(ReadFloats(FileOf(dir, "server", site, step)));
      for (int64_t i = 0; i < kBucket; ++i) carried[i] += worker[i] + server[i];
    }
    const std::vector<float> out0 = ReadFloats(FileOf(dir, "out", 0, step));
    ASSERT_EQ(out0.size(), static_cast<size_t>(kBucket));
    for (int64_t i = 0; i < kBucket; ++i) {
      kept[i] = out0[i] + carried[i];
      given[i] = old_carried[i];
      for (const auto& site : inputs) given[i] += site[i];
    }
    ExpectClose(kept, given, 1e-5,
                world.Name() + ", step " + std::to_string(step) + ": output + carried");
    old_carried = carried;
    const std::string at =
        world.Name() + ", chunk " + std::to_string(chunk) + ", step " + std::to_string(step);
    for (int rank = 0; rank < world.size(); ++rank) {
      EXPECT_EQ(ReadFloats(FileOf(dir, "out", rank, step)), expected)
          << at << ", rank " << rank << "'s sum";
      if (rank >= world.hosts) continue;
      const int site = world.host_of(rank);
      EXPECT_EQ(BucketOf(ReadFloats(FileOf(dir, "error", rank, step))), reference.worker(site))
          << at << ", site " << site << "'s worker error";
      EXPECT_EQ(BucketOf(ReadFloats(FileOf(dir, "server", rank, step))), reference.server(site))
          << at << ", site " << site << "'s server error";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Int8Test, MatchesTheReferenceAcrossTwoHostsOfOneRank) {
  CheckInt8AgainstReference({.hosts = 2, .per_host = 1}, 64, 3);
}

TEST(Int8Test, MatchesTheReferenceAcrossTwoHostsOfTwoRanks) {
  CheckInt8AgainstReference({.hosts = 2, .per_host = 2}, 64, 3);
}

// 409 elements in chunks of 100: 5 chunks over 3 sites (1, 2, 2), the last one short.
TEST(Int8Test, MatchesTheReferenceAcrossThreeHostsWithUnevenParts) {
  CheckInt8AgainstReference({.hosts = 3, .per_host = 1}, 100, 3);
}

// One element 1000 times the rest spoils only its own chunk: the other chunks come out within a
// quantisation step of their own scale, where one scale for the whole bucket rounds them all to
// zero. The outlier's chunk loses its small values at first; error feedback carries them until
// they cross a quantisation step, so the mean output over many steps holds them too.
TEST(Int8Test, AnOutlierSpoilsOnlyItsChunkAndErrorFeedbackRecoversIt) {
  const World world{.hosts = 2, .per_host = 1};
  constexpr int64_t kChunk = 256, kN = 4 * kChunk;
  constexpr int kSteps = 100;
  constexpr float kSmall = 1e-3f, kOutlier = 1.0f;
  const std::string dir = MakeTempDir();
  auto gradient = [](int rank) {
    std::vector<float> g = RankGradient(21, rank, 0, kN);
    for (float& v : g) v *= kSmall;
    if (rank == 0) g[3] = kOutlier;
    return g;
  };
  RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string& dir) {
    for (int64_t chunk : {kChunk, kN}) {
      auto c = GradientCompressor::Create(Int8(chunk), group.host_split(), kN);
      if (!c.ok()) return 1;
      for (int step = 0; step < kSteps; ++step) {
        std::vector<float> g = gradient(rank);
        if (!(*c)->AllReduceSum(0, g.data(), kN, {}).ok()) return 2;
        if (chunk == kChunk) WriteFloats(FileOf(dir, "out", rank, step), g);
        if (chunk == kN && step == 0) WriteFloats(FileOf(dir, "whole", rank, step), g);
      }
    }
    return 0;
  });
  std::vector<float> exact(kN);
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<float> g = gradient(rank);
    for (int64_t i = 0; i < kN; ++i) exact[i] += g[i];
  }
  const std::vector<float> first = ReadFloats(FileOf(dir, "out", 1, 0));
  const std::vector<float> whole = ReadFloats(FileOf(dir, "whole", 1, 0));
  ASSERT_EQ(first.size(), static_cast<size_t>(kN));
  ASSERT_EQ(whole.size(), static_cast<size_t>(kN));
  // Outside the outlier's chunk: each site's codes lose at most half a step of 1e-3 / 127, the
  // owner's re-quantisation half a step of the sum's scale: under 2e-5 together.
  int whole_zeroed = 0;
  for (int64_t i = kChunk; i < kN; ++i) {
    ASSERT_NEAR(first[i], exact[i], 2e-5) << "element " << i << " outside the outlier's chunk";
    whole_zeroed += whole[i] == 0.0f;
  }
  EXPECT_EQ(whole_zeroed, kN - kChunk) << "one scale per bucket should lose every small value";
  int zeroed = 0;
  for (int64_t i = 0; i < kChunk; ++i) zeroed += i != 3 && first[i] == 0.0f;
  EXPECT_GT(zeroed, kChunk / 2) << "the outlier's chunk should lose most small values at first";
  // Each carried error stays within half a quantisation step (two sites' worker errors of
  // 1 / 254 and the server's of 1 / 254 here), so the mean of the outputs is that much over
  // kSteps from the exact sum, where the first step missed whole values.
  std::vector<double> mean(kN, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> out = ReadFloats(FileOf(dir, "out", 1, step));
    for (int64_t i = 0; i < kN; ++i) mean[i] += static_cast<double>(out[i]) / kSteps;
  }
  double first_gap = 0;
  for (int64_t i = 0; i < kChunk; ++i) {
    if (i == 3) continue;
    first_gap = std::max(first_gap, std::fabs(static_cast<double>(first[i]) - exact[i]));
    ASSERT_NEAR(mean[i], exact[i], 3 * kOutlier / 254 / kSteps) << "element " << i;
  }
  EXPECT_GT(first_gap, 1.5 * kSmall);
  std::filesystem::remove_all(dir);
}

// ---- One host: exact. ----

TEST(GradientCompressorTest, OneHostIsTheExactSum) {
  const World world{.hosts = 1, .per_host = 2};
  for (CompressionKind kind : {CompressionKind::kPowerSgd, CompressionKind::kInt8}) {
    const std::string dir = MakeTempDir();
    CompressionOptions options = kind == CompressionKind::kInt8 ? Int8(64) : PowerSgd(1);
    RunWorld(world, dir, CompressSteps(options, 2, 2));
    for (int step = 0; step < 2; ++step) {
      const auto sum = SiteInputs(world, 2, step)[0];
      for (int rank = 0; rank < 2; ++rank) {
        EXPECT_EQ(ReadFloats(FileOf(dir, "out", rank, step)), sum)
            << CompressionKindName(kind) << ", step " << step << ", rank " << rank;
      }
      EXPECT_EQ(MaxAbs(ReadFloats(FileOf(dir, "error", 0, step))), 0.0);
    }
    std::filesystem::remove_all(dir);
  }
}

// ---- Saving and restoring the state. ----

// k steps in one go equal j steps, the state copied out and loaded into fresh compressors, then
// k - j steps: bit for bit, on every rank.
int ResumeBody(const CompressionOptions& options, int rank, comm::Communicator& group) {
  constexpr int kSteps = 5, kSaveAfter = 2;
  constexpr uint64_t kSeed = 31;
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "rank %d (%s): %s\n", rank,
                 std::string(CompressionKindName(options.kind)).c_str(), why.c_str());
    return 1;
  };
  auto run = [&](GradientCompressor& c, int from, int to, std::vector<std::vector<float>>& outs) {
    for (int step = from; step < to; ++step) {
      std::vector<float> g = RankGradient(kSeed, rank, step);
      const absl::Status status = c.AllReduceSum(kBegin, g.data(), kBucket, kMatrices);
      if (!status.ok()) return status;
      outs.push_back(std::move(g));
    }
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> straight, resumed;
  auto a = GradientCompressor::Create(options, group.host_split(), kTotal);
  if (!a.ok() || !run(**a, 0, kSteps, straight).ok()) return fail("uninterrupted run");
  auto b = GradientCompressor::Create(options, group.host_split(), kTotal);
  if (!b.ok() || !run(**b, 0, kSaveAfter, resumed).ok()) return fail("first half");
  const std::vector<float> carried((*b)->carried_error().begin(), (*b)->carried_error().end());
  const std::vector<float> server((*b)->server_error().begin(), (*b)->server_error().end());
  const std::vector<WarmStartFactor> factors = (*b)->warm_start();
  b->reset();
  auto c = GradientCompressor::Create(options, group.host_split(), kTotal);
  if (!c.ok()) return fail("fresh compressor");
  if ((*c)->holds_state()) {
    if (!(*c)->LoadState(carried, server).ok()) return fail("LoadState");
    if (options.kind == CompressionKind::kPowerSgd && !(*c)->LoadWarmStart(factors).ok()) {
      return fail("LoadWarmStart");
    }
  }
  if (!run(**c, kSaveAfter, kSteps, resumed).ok()) return fail("second half");
  for (int step = 0; step < kSteps; ++step) {
    if (std::memcmp(straight[step].data(), resumed[step].data(), kBucket * sizeof(float)) != 0) {
      return fail("step " + std::to_string(step) + " differs after the resume");
    }
  }
  // Without the state, the resumed run would differ: the check can fail.
  auto d = GradientCompressor::Create(options, group.host_split(), kTotal);
  std::vector<std::vector<float>> forgetful;
  if (!d.ok() || !run(**d, kSaveAfter, kSteps, forgetful).ok()) return fail("forgetful run");
  if (std::memcmp(straight[kSaveAfter].data(), forgetful[0].data(), kBucket * sizeof(float)) == 0) {
    return fail("a run without the loaded state gave the same step: the check proves nothing");
  }
  return 0;
}

TEST(GradientCompressorTest, ResumeContinuesBitIdentically) {
  const World world{.hosts = 2, .per_host = 2};
  for (const CompressionOptions& options : {PowerSgd(2), Int8(64)}) {
    const std::string dir = MakeTempDir();
    RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string&) {
      return ResumeBody(options, rank, group);
    });
    std::filesystem::remove_all(dir);
  }
}

// Another plan: 2 hosts of 2 ranks save after two steps; 3 hosts of 1 rank, or 1 host of 2, load
// SpreadCarriedError of the old sites' state. Nothing is lost on the way: the new plan's output
// plus what its sites carry is its inputs plus everything the old sites carried.
TEST(GradientCompressorTest, ResumeOnAnotherPlanKeepsTheCarriedTotal) {
  const World old_world{.hosts = 2, .per_host = 2};
  constexpr uint64_t kSeed = 41;
  for (const CompressionOptions& options : {PowerSgd(1), Int8(64)}) {
    const std::string old_dir = MakeTempDir();
    RunWorld(old_world, old_dir, CompressSteps(options, kSeed, 2));
    std::vector<std::vector<float>> old_state;
    std::vector<double> old_total(kBucket, 0.0);
    for (int site = 0; site < old_world.hosts; ++site) {
      for (const char* what : {"error", "server"}) {
        old_state.push_back(ReadFloats(FileOf(old_dir, what, site, 1)));
        if (old_state.back().empty()) continue;
        ASSERT_EQ(old_state.back().size(), static_cast<size_t>(kTotal));
        for (int64_t i = 0; i < kBucket; ++i) old_total[i] += old_state.back()[kBegin + i];
      }
    }
    ASSERT_GT(MaxAbs(std::vector<float>(old_total.begin(), old_total.end())), 1e-3)
        << "two compressed steps should leave something to carry";
    for (const World world : {World{.hosts = 3, .per_host = 1}, World{.hosts = 1, .per_host = 2}}) {
      const std::string at =
          std::string(CompressionKindName(options.kind)) + ", to " + world.Name();
      const std::string dir = MakeTempDir();
      RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string& dir) {
        auto c = GradientCompressor::Create(options, group.host_split(), kTotal);
        if (!c.ok()) return 1;
        if ((*c)->holds_state()) {
          std::vector<std::span<const float>> spans(old_state.begin(), old_state.end());
          auto spread = SpreadCarriedError(spans, world.hosts);
          if (!spread.ok() || !(*c)->LoadState(*spread, {}).ok()) return 2;
        }
        std::vector<float> g = RankGradient(kSeed, rank, 7);
        if (!(*c)->AllReduceSum(kBegin, g.data(), kBucket, kMatrices).ok()) return 3;
        WriteFloats(FileOf(dir, "out", rank, 0), g);
        if ((*c)->holds_state()) {
          WriteFloats(FileOf(dir, "error", rank, 0), (*c)->carried_error());
          WriteFloats(FileOf(dir, "server", rank, 0), (*c)->server_error());
        }
        return 0;
      });
      std::vector<double> kept(kBucket), given(old_total);
      const std::vector<float> out = ReadFloats(FileOf(dir, "out", 0, 0));
      ASSERT_EQ(out.size(), static_cast<size_t>(kBucket)) << at;
      for (int64_t i = 0; i < kBucket; ++i) kept[i] = out[i];
      for (int rank = 0; rank < world.size(); ++rank) {
        const std::vector<float> g = RankGradient(kSeed, rank, 7);
        for (int64_t i = 0; i < kBucket; ++i) given[i] += g[i];
      }
      for (int site = 0; site < world.hosts; ++site) {
        for (const char* what : {"error", "server"}) {
          const std::vector<float> e = ReadFloats(FileOf(dir, what, site, 0));
          if (e.empty()) continue;
          for (int64_t i = 0; i < kBucket; ++i) kept[i] += e[kBegin + i];
        }
      }
      ExpectClose(kept, given, 1e-5, at + ": output + carried");
      std::filesystem::remove_all(dir);
    }
    std::filesystem::remove_all(old_dir);
  }
}

// ---- PyTorch's powerSGD_hook (torch 1.13), two gloo processes fed the same inputs and Q. ----

bool TorchAvailable(std::string* why) {
  if (access(kPython, X_OK) != 0) {
    *why = std::string(kPython) + " is not installed";
    return false;
  }
  const std::string cmd = std::string(kPython) + " -c 'import torch.distributed' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    *why = std::string(kPython) + " cannot import torch.distributed (Debian: python3-torch)";
    return false;
  }
  return true;
}

TEST(PowerSgdTest, MatchesPyTorchsPowerSgdHook) {
  std::string why;
  if (!TorchAvailable(&why)) GTEST_SKIP() << why;
  const World world{.hosts = 2, .per_host = 1};
  constexpr int kSteps = 3;
  constexpr uint64_t kSeed = 13;
  const CompressionOptions options = PowerSgd(2);
  const std::string dir = MakeTempDir();
  RunWorld(world, dir, CompressSteps(options, kSeed, kSteps));
  // The hook's inputs: each rank's gradient per step, and its Q memory before the first step
  // (the compressed matrices' initial Q, in bucket order, before orthogonalisation).
  for (int rank = 0; rank < 2; ++rank) {
    for (int step = 0; step < kSteps; ++step) {
      WriteFloats(FileOf(dir, "torch_in", rank, step), RankGradient(kSeed, rank, step));
    }
  }
  std::vector<float> initial_q;
  for (const BucketMatrix& m : kMatrices) {
    const int64_t r = std::min<int64_t>({options.rank, m.rows, m.cols});
    if ((m.rows + m.cols) * r * options.min_compression_rate >= m.rows * m.cols) continue;
    std::vector<float> q(m.cols * r);
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = static_cast<float>(NormalAt(options.seed, kInitialQStream + kBegin + m.offset, i));
    }
    initial_q.insert(initial_q.end(), q.begin(), q.end());
  }
  WriteFloats(dir + "/torch_initial_q.bin", initial_q);
  std::string shapes;
  for (int64_t v : ShapeOfTensors()) shapes += " " + std::to_string(v);
  const std::string cmd = std::string("timeout 120 ") + kPython + " " + SHARDLINE_SOURCE_PATH +
                          "/tests/unit/model_gradient_compression_reference.py " + dir + " " +
                          std::to_string(options.rank) + " " + std::to_string(kSteps) + shapes +
                          " >" + dir + "/torch.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir + "/torch.log");
    FAIL() << "`" << cmd << "` failed:\n" << std::string(std::istreambuf_iterator<char>(log), {});
  }
  for (int step = 0; step < kSteps; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string at = "step " + std::to_string(step) + ", rank " + std::to_string(rank);
      // The hook averages; the compressor sums.
      std::vector<float> torch_sum = ReadFloats(FileOf(dir, "torch_out", rank, step));
      for (float& v : torch_sum) v *= 2;
      ExpectClose(ReadFloats(FileOf(dir, "out", rank, step)), torch_sum, 2e-5, at + ": sum");
      ExpectClose(ReadFloats(FileOf(dir, "q", rank, step)),
                  ReadFloats(FileOf(dir, "torch_q", rank, step)), 2e-5, at + ": Q");
      // The hook's error also holds input - average on the exact parts (it sums to zero over
      // sites); the compressor keeps zero there. Compare the compressed matrices'.
      const std::vector<float> ours = BucketOf(ReadFloats(FileOf(dir, "error", rank, step)));
      const std::vector<float> theirs = ReadFloats(FileOf(dir, "torch_error", rank, step));
      ASSERT_EQ(theirs.size(), ours.size()) << at;
      for (const BucketMatrix& m : {kMatrices[0], kMatrices[1]}) {
        const auto from = m.offset, to = m.offset + m.rows * m.cols;
        ExpectClose(std::vector<float>(ours.begin() + from, ours.begin() + to),
                    std::vector<float>(theirs.begin() + from, theirs.begin() + to), 2e-5,
                    at + ": error of the " + std::to_string(m.rows) + "x" + std::to_string(m.cols) +
                        " matrix");
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// A communicator that says it carries device buffers, as NCCL's does; nothing else is called.
class DeviceGroup final : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string_view backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  absl::Status AllReduce(void*, size_t, DType, comm::ReduceOp) override { return Refuse(); }
  absl::Status AllGather(const void*, void*, size_t, DType) override { return Refuse(); }
  absl::Status ReduceScatter(const void*, void*, size_t, DType, comm::ReduceOp) override {
    return Refuse();
  }
  absl::Status Broadcast(void*, size_t, DType, int) override { return Refuse(); }
  absl::Status Send(const void*, size_t, DType, int) override { return Refuse(); }
  absl::Status Recv(void*, size_t, DType, int) override { return Refuse(); }
  absl::Status SendRecv(const void*, size_t, int, void*, size_t, int, DType) override {
    return Refuse();
  }
  absl::Status Barrier() override { return Refuse(); }
  void Abort() override {}

 private:
  static absl::Status Refuse() { return absl::InternalError("the test's device group was used"); }
};

TEST(GradientCompressorTest, DeviceBuffersAreUnimplemented) {
  DeviceGroup group;
  auto created = GradientCompressor::Create(Int8(64), group.host_split(), 10);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kUnimplemented) << created.status();
  EXPECT_NE(created.status().message().find("nccl communicator carries device buffers"),
            absl::string_view::npos)
      << created.status();
}

// The bytes a site sends to other hosts, counted from the scheme's definition: int8's messages
// are each part's scales (4 bytes per chunk) and codes (1 byte per element) in whole 32-bit
// words; PowerSGD sends its exact floats, P and Q through ring all-reduces, 2 (H - 1) / H of each.
TEST(GradientCompressorTest, CountsTheBytesItSendsBetweenHosts) {
  const World world{.hosts = 2, .per_host = 2};
  constexpr int64_t kChunk = 64;
  const std::string dir = MakeTempDir();
  RunWorld(world, dir, [&](int rank, comm::Communicator& group, const std::string& dir) {
    std::vector<float> bytes;
    for (const CompressionOptions& options : {Int8(kChunk), PowerSgd(2)}) {
      auto c = GradientCompressor::Create(options, group.host_split(), kTotal);
      if (!c.ok()) return 1;
      std::vector<float> g = RankGradient(1, rank, 0);
      if (!(*c)->AllReduceSum(kBegin, g.data(), kBucket, kMatrices).ok()) return 2;
      bytes.push_back(static_cast<float>((*c)->last_cross_bytes()));
    }
    WriteFloats(FileOf(dir, "bytes", rank, 0), bytes);
    return 0;
  });
  // int8: 409 elements are 7 chunks; site 0 owns 3 (192 elements), site 1 owns 4 (217).
  auto message = [](int64_t chunks, int64_t elements) {
    return (4 * chunks + elements + 3) / 4 * 4;
  };
  const int64_t int8_bytes[2] = {message(4, 217) + message(3, 192),
                                 message(3, 192) + message(4, 217)};
  // PowerSGD at rank 2: P of 16 + 20 rows and Q of 12 + 10 columns, and 5 + 12 exact floats.
  const int64_t powersgd_bytes = 2 * 1 * 4 * ((16 + 20) * 2 + (12 + 10) * 2 + 5 + 12) / 2;
  for (int rank = 0; rank < world.size(); ++rank) {
    const std::vector<float> bytes = ReadFloats(FileOf(dir, "bytes", rank, 0));
    ASSERT_EQ(bytes.size(), 2u);
    const bool leader = rank < world.hosts;
    EXPECT_EQ(bytes[0], leader ? int8_bytes[rank] : 0) << "int8, rank " << rank;
    EXPECT_EQ(bytes[1], leader ? powersgd_bytes : 0) << "powersgd, rank " << rank;
  }
  EXPECT_LT(int8_bytes[0], kBucket * 4 / 3) << "int8 should send about a quarter of the floats";
  std::filesystem::remove_all(dir);
}

// ---- Bad input. ----

TEST(GradientCompressorTest, BadInputIsNamed) {
  comm::HostSplit alone;  // one rank on one host: no communicator is touched before the checks
  CompressionOptions bad_rank = PowerSgd(0);
  auto created = GradientCompressor::Create(bad_rank, alone, 10);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("rank 0 must be >= 1"), absl::string_view::npos)
      << created.status();
  created = GradientCompressor::Create(Int8(4), alone, 10);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("int8_chunk 4"), absl::string_view::npos)
      << created.status();
  comm::HostSplit no_cross{.hosts = 2};
  created = GradientCompressor::Create(Int8(64), no_cross, 10);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("no cross-host group"), absl::string_view::npos);

  auto c = GradientCompressor::Create(PowerSgd(1), alone, 100);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> data(100);
  absl::Status status = (*c)->AllReduceSum(60, data.data(), 50, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bucket [60, 110)"), absl::string_view::npos) << status;
  const std::vector<BucketMatrix> overlapping = {{0, 4, 4}, {10, 2, 3}};
  status = (*c)->AllReduceSum(0, data.data(), 50, overlapping);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("matrix at bucket offset 10 (2 x 3) overlaps"),
            absl::string_view::npos)
      << status;
  const std::vector<BucketMatrix> too_big = {{40, 4, 4}};
  status = (*c)->AllReduceSum(0, data.data(), 50, too_big);
  EXPECT_NE(status.message().find("does not fit in the bucket's 50 floats"),
            absl::string_view::npos)
      << status;
  status = (*c)->LoadState(std::vector<float>(99), {});
  EXPECT_NE(status.message().find("carried error has 99 floats"), absl::string_view::npos)
      << status;
  status =
      (*c)->LoadWarmStart({WarmStartFactor{.offset = 0, .rows = 4, .cols = 4, .rank = 2, .q = {}}});
  EXPECT_NE(status.message().find("rank should be min(rank 1"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace shardline::model
