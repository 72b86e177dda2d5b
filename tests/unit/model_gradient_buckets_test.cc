// Gradient buckets overlap the backward pass: with dp 2 over real processes (Gloo over TCP, and
// shared memory), a bucket's all-reduce starts on the communication thread before the backward of
// the first layer has ended. Order of recorded events, no timing (DataParallelTrace).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::model {
namespace {

class EventLog final : public DataParallelTrace {
 public:
  void Record(std::string event) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> events_;
};

// One training step of an 8-layer GPT at dp 2 with `bucket_bytes`; each rank writes its events,
// one per line, to DIR/events-RANK.
int RunRank(const std::string& dir, int64_t bucket_bytes, int rank,
            const placement::RankCoords& coords, const ShardedGroups& groups) {
  ShardedOptions options;
  options.config =
      ModelConfig{.layers = 8, .heads = 4, .d_model = 64, .vocab = 257, .max_seq_len = 16};
  options.parallel.dp = 2;
  options.coords = coords;
  options.global_batch = 8;
  options.seq_len = 16;
  options.data_parallel.bucket_bytes = bucket_bytes;
  EventLog log;
  options.trace = &log;
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  auto model = ShardedGpt::Create(options, groups, backend);
  if (!model.ok() || !(*model)->InitGpt2(5).ok()) return 2;
  const data::TextDataset dataset = data::SyntheticCorpus(3, 1 << 14).ToDataset();
  auto sampler = data::Sampler::Create(dataset, 16, 8, 1);
  if (!sampler.ok()) return 4;
  auto source = [&](int64_t first, int64_t count, std::vector<int32_t>& inputs,
                    std::vector<int32_t>& targets) -> absl::Status {
    auto batch = sampler->MicroBatch(0, first, count);
    if (!batch.ok()) return batch.status();
    inputs.assign(batch->inputs.begin(), batch->inputs.end());
    targets.assign(batch->targets.begin(), batch->targets.end());
    return absl::OkStatus();
  };
  if (!(*model)->TrainStep(source, 1, 1e-3f).ok()) return 5;
  std::ofstream out(dir + "/events-" + std::to_string(rank));
  for (const std::string& event : log.events()) out << event << "\n";
  return 0;
}

std::vector<std::string> Events(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> events;
  for (std::string line; std::getline(in, line);) events.push_back(line);
  return events;
}

std::vector<std::string> RunStep(int64_t bucket_bytes, testing::ForkedBackend backend) {
  const std::string dir = testing::MakeTempDir("shardline_buckets");
  const std::string store = dir + "/store";
  std::filesystem::create_directories(store);
  auto grid = placement::RankGrid::Create(1, 1, 2);
  EXPECT_TRUE(grid.ok());
  const testing::ForkedWorldResult result = testing::RunForkedWorld(
      *grid, store,
      [&](int rank, const placement::RankCoords& coords, const ShardedGroups& groups) {
        return RunRank(dir, bucket_bytes, rank, coords, groups);
      },
      std::chrono::seconds(120), backend);
  EXPECT_TRUE(result.ok()) << result.Describe();
  std::vector<std::string> events = Events(dir + "/events-0");
  std::filesystem::remove_all(dir);
  return events;
}

size_t IndexOf(const std::vector<std::string>& events, const std::string& event) {
  return static_cast<size_t>(std::find(events.begin(), events.end(), event) - events.begin());
}

size_t FirstReduce(const std::vector<std::string>& events) {
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].starts_with("reduce ")) return i;
  }
  return events.size();
}

class GradientBucketsTest : public ::testing::TestWithParam<testing::ForkedBackend> {};

// A layer of this model is 49,984 floats (195 KiB): 256 KiB buckets hold one layer each. Eight
// layers leave the backward of seven after the first bucket is ready: time for the communication
// thread to start it even on a loaded machine.
TEST_P(GradientBucketsTest, ABucketIsReducedBeforeTheBackwardOfTheFirstLayerEnds) {
  const std::vector<std::string> events = RunStep(256 << 10, GetParam());
  std::string all;
  for (const std::string& e : events) all += e + "; ";
  const size_t first_layer_done = IndexOf(events, "ready h.0");
  ASSERT_LT(first_layer_done, events.size()) << all;
  EXPECT_LT(FirstReduce(events), first_layer_done) << all;
  // Every unit is reduced in some bucket, each bucket once.
  const auto reduces = std::count_if(events.begin(), events.end(),
                                     [](const std::string& e) { return e.starts_with("reduce "); });
  EXPECT_GE(reduces, 8) << all;
}

// One bucket larger than the model: nothing can be reduced before the last unit is ready, so the
// check above is not one that any order passes.
TEST_P(GradientBucketsTest, OneBucketForTheWholeModelWaitsForTheLastUnit) {
  const std::vector<std::string> events = RunStep(int64_t{25} << 20, GetParam());
  std::string all;
  for (const std::string& e : events) all += e + "; ";
  const size_t first_layer_done = IndexOf(events, "ready h.0");
  ASSERT_LT(first_layer_done, events.size()) << all;
  EXPECT_GT(FirstReduce(events), first_layer_done) << all;
  EXPECT_EQ(std::count_if(events.begin(), events.end(),
                          [](const std::string& e) { return e.starts_with("reduce "); }),
            1)
      << all;
}

INSTANTIATE_TEST_SUITE_P(Backends, GradientBucketsTest,
                         ::testing::Values(testing::ForkedBackend::kGloo,
                                           testing::ForkedBackend::kCpu),
                         [](const ::testing::TestParamInfo<testing::ForkedBackend>& info) {
                           return info.param == testing::ForkedBackend::kGloo ? "gloo" : "shm";
                         });

}  // namespace
}  // namespace shardline::model
