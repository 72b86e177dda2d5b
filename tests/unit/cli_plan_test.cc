// `shardline plan` without a process (cli/plan.h): which options it needs, the train set-up YAML
// (placement/plan_request.h) and its errors with file, line and column, the output in both forms,
// the cluster taken from a live coordinator's status reply, and the exit codes.
#include <capnp/message.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/plan.h"
#include "nlohmann/json.hpp"
#include "placement/checkpoint_state.h"
#include "placement/plan_request.h"

namespace shardline::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModel[] =
    "layers: 4\n"
    "heads: 4\n"
    "d_model: 32\n"
    "max_seq_len: 16\n";

constexpr char kCluster[] =
    "name: two-cpu-nodes\n"
    "nodes:\n"
    "  - name: cpu\n"
    "    count: 2\n"
    "    devices: 2\n"
    "    device_kind: cpu\n"
    "    device_memory: 1GiB\n";

constexpr char kTrain[] =
    "global_batch: 8\n"
    "seq_len: 16\n"
    "micro_batch: {min: 1, max: 4}\n"
    "dtype: fp32\n"
    "zero: [0, 1]\n"
    "recompute: false\n";

class PlanCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardline-plan-test-" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    options_.model_path = Write("model.yaml", kModel);
    options_.cluster_path = Write("cluster.yaml", kCluster);
    options_.train_path = Write("train.yaml", kTrain);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // The error of a run that must fail.
  std::string ErrorOf(const PlanOptions& options) {
    auto output = PlanOutput(options, NoLiveCluster);
    EXPECT_FALSE(output.ok()) << *output;
    return output.ok() ? "" : std::string(output.status().message());
  }

  static absl::StatusOr<placement::ClusterSpec> NoLiveCluster() {
    ADD_FAILURE() << "the live cluster was asked for";
    return absl::InternalError("no live cluster in this test");
  }

  fs::path dir_;
  PlanOptions options_;
};

TEST_F(PlanCommandTest, PrintsAPlan) {
  auto text = PlanOutput(options_, NoLiveCluster);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("tp"));
  EXPECT_THAT(*text, HasSubstr("zero"));

  PlanOptions explain = options_;
  explain.explain = true;
  auto explained = PlanOutput(explain, NoLiveCluster);
  ASSERT_TRUE(explained.ok()) << explained.status();
  EXPECT_GT(explained->size(), text->size());  // the alternatives and rejections too

  PlanOptions json = options_;
  json.json = true;
  auto out = PlanOutput(json, NoLiveCluster);
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json parsed = nlohmann::json::parse(*out, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << *out;
  EXPECT_TRUE(parsed.is_object());
}

TEST_F(PlanCommandTest, MemoryStepsSayTheHostMemoryTheyTakePerRankOfThePlan) {
  PlanOptions options = options_;
  options.train_path =
      Write("memory.yaml",
            std::string(kTrain) + "checkpoint: {memory_interval: 1, memory_replicas: 1}\n");
  auto text = PlanOutput(options, NoLiveCluster);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("memory steps every 1 step: "));
  EXPECT_THAT(*text, HasSubstr(" of host memory per rank (3 steps of what it holds, and as much "
                               "for its buddy's copy)"));
  options.json = true;
  auto out = PlanOutput(options, NoLiveCluster);
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json parsed = nlohmann::json::parse(*out);
  // The model's parameters, 4 bytes each for the parameter and both moments, over the plan's
  // layout, 3 steps and a buddy's copy.
  placement::ParallelSpec parallel;
  parallel.tp = parsed["best"]["tp"];
  parallel.pp = parsed["best"]["pp"];
  parallel.dp = parsed["best"]["dp"];
  parallel.zero = parsed["best"]["zero"];
  const int64_t params = parsed["model"]["params"];
  EXPECT_EQ(parsed["memory_step_bytes_per_rank"].get<int64_t>(),
            placement::MemoryStepBytesPerRank(params, parallel, false, 1));
  EXPECT_GT(parsed["memory_step_bytes_per_rank"].get<int64_t>(), 0);
}

TEST_F(PlanCommandTest, WithoutATrainFileTheDefaultsApply) {
  PlanOptions options = options_;
  options.train_path.clear();
  auto text = PlanOutput(options, NoLiveCluster);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->empty());
}

TEST_F(PlanCommandTest, OptionErrors) {
  PlanOptions options = options_;
  options.model_path.clear();
  EXPECT_THAT(ErrorOf(options), HasSubstr("--model FILE is required"));

  options = options_;
  options.cluster_path.clear();
  EXPECT_THAT(ErrorOf(options),
              HasSubstr("--cluster FILE (a cluster spec), or --coordinator ADDR (or "
                        "$SHARDLINE_COORDINATOR) for the live cluster"));

  options = options_;
  options.devices = "tpu";
  EXPECT_THAT(ErrorOf(options), HasSubstr("--devices must be cpu, cuda or auto, got 'tpu'"));

  // The codes a script sees: 2 for bad input.
  options = options_;
  options.model_path.clear();
  EXPECT_EQ(Plan(ClientOptions{}, options), 2);
}

TEST_F(PlanCommandTest, MissingFilesAreNamed) {
  PlanOptions options = options_;
  options.model_path = (dir_ / "nope.yaml").string();
  EXPECT_THAT(ErrorOf(options), HasSubstr("nope.yaml"));
  options = options_;
  options.cluster_path = (dir_ / "no-cluster.yaml").string();
  EXPECT_THAT(ErrorOf(options), HasSubstr("no-cluster.yaml"));
  options = options_;
  options.train_path = (dir_ / "no-train.yaml").string();
  EXPECT_THAT(ErrorOf(options), HasSubstr("no-train.yaml"));
}

TEST_F(PlanCommandTest, BadYamlIsPlacedAtFileLineColumn) {
  PlanOptions options = options_;
  options.model_path = Write("bad-model.yaml", "layers: 4\nheads: four\nd_model: 32\n");
  EXPECT_THAT(ErrorOf(options), HasSubstr("bad-model.yaml:2:8: heads: expected an integer"));

  options = options_;
  options.cluster_path = Write("bad-cluster.yaml",
                               "name: x\nnodes:\n  - name: cpu\n    devices: 0\n"
                               "    device_kind: cpu\n");
  EXPECT_THAT(ErrorOf(options), HasSubstr("bad-cluster.yaml:4:14: nodes[0].devices"));

  options = options_;
  options.train_path = Write("bad-train.yaml", "global_bach: 8\n");
  const std::string typo = ErrorOf(options);
  EXPECT_THAT(typo, HasSubstr("bad-train.yaml:1:1: global_bach: unknown key 'global_bach'"));
  EXPECT_THAT(typo, HasSubstr("global_batch"));
}

TEST_F(PlanCommandTest, SetUpBeyondTheModelIsRefused) {
  PlanOptions options = options_;
  options.train_path = Write("long.yaml", "global_batch: 8\nseq_len: 64\n");
  EXPECT_THAT(ErrorOf(options), HasSubstr("seq_len 64 is more than the model's max_seq_len 16"));
}

TEST_F(PlanCommandTest, LiveClusterWhenNoFileIsGiven) {
  PlanOptions options = options_;
  options.cluster_path.clear();
  options.coordinator_given = true;
  int asked = 0;
  auto text = PlanOutput(options, [&]() -> absl::StatusOr<placement::ClusterSpec> {
    ++asked;
    return placement::ParseClusterSpec(kCluster, "live");
  });
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(asked, 1);
  auto unreachable = PlanOutput(options, []() -> absl::StatusOr<placement::ClusterSpec> {
    return absl::DeadlineExceededError("the coordinator at tcp://x:1 did not answer");
  });
  ASSERT_FALSE(unreachable.ok());
  EXPECT_THAT(std::string(unreachable.status().message()), HasSubstr("did not answer"));
}

TEST_F(PlanCommandTest, NothingFitsSaysByHowMuch) {
  PlanOptions options = options_;
  options.cluster_path = Write("small.yaml",
                               "name: small\nnodes:\n  - name: cpu\n    devices: 1\n"
                               "    device_kind: cpu\n    device_memory: 1KiB\n");
  auto output = PlanOutput(options, NoLiveCluster);
  ASSERT_FALSE(output.ok());
  EXPECT_EQ(output.status().code(), absl::StatusCode::kResourceExhausted) << output.status();
  EXPECT_THAT(std::string(output.status().message()), HasSubstr("short"));
  EXPECT_EQ(Plan(ClientOptions{}, options), 1);
}

// ---- the train set-up file ----

std::string SetUpError(const std::string& yaml) {
  auto spec = placement::ParsePlanTrainSpec(yaml, "t.yaml");
  EXPECT_FALSE(spec.ok()) << yaml;
  return spec.ok() ? "" : std::string(spec.status().message());
}

TEST(PlanTrainSpecTest, ParsesEveryKey) {
  auto spec = placement::ParsePlanTrainSpec(kTrain, "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->global_batch, 8);
  EXPECT_EQ(spec->seq_len, 16);
  EXPECT_EQ(spec->min_micro_batch, 1);
  EXPECT_EQ(spec->max_micro_batch, 4);
  EXPECT_EQ(spec->precision, placement::Precision::kFp32);
  EXPECT_EQ(spec->zero_stages, (std::vector<int>{0, 1}));
  EXPECT_THAT(spec->recompute_modes, ElementsAre(placement::RecomputeMode::kNone));
  EXPECT_EQ(spec->virtual_stages, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(spec->devices, 0);

  spec = placement::ParsePlanTrainSpec("global_batch: 16\nmicro_batch: 2\nzero: 3\ndevices: 4\n",
                                       "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->min_micro_batch, 2);
  EXPECT_EQ(spec->max_micro_batch, 2);
  EXPECT_EQ(spec->zero_stages, (std::vector<int>{3}));
  EXPECT_EQ(spec->devices, 4);
  EXPECT_FALSE(spec->precision.has_value());
  EXPECT_EQ(spec->recompute_modes.size(), 3u);  // true by default: every mode

  // The schedules and recomputation modes the planner may choose.
  spec = placement::ParsePlanTrainSpec(
      "global_batch: 16\nrecompute: [none, selective]\nschedule: interleaved\n"
      "virtual_stages: [2, 3]\n",
      "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->recompute_modes,
              ElementsAre(placement::RecomputeMode::kNone, placement::RecomputeMode::kSelective));
  EXPECT_EQ(spec->virtual_stages, (std::vector<int>{2, 3}));
  spec = placement::ParsePlanTrainSpec("global_batch: 16\nrecompute: full\nschedule: 1f1b\n",
                                       "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->recompute_modes, ElementsAre(placement::RecomputeMode::kFull));
  EXPECT_EQ(spec->virtual_stages, (std::vector<int>{1}));

  // The examples/ file parses too.
  const char* source = std::getenv("SHARDLINE_SOURCE_DIR");
  const std::string root = source && *source ? source : SHARDLINE_SOURCE_PATH;
  auto example = placement::LoadPlanTrainSpecFile(root + "/examples/plan-train.yaml");
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_EQ(example->global_batch, 512);
}

TEST(PlanTrainSpecTest, ErrorsPointAtTheValue) {
  EXPECT_THAT(SetUpError("seq_len: 8\n"), HasSubstr("global_batch"));
  EXPECT_THAT(SetUpError("global_batch: 0\n"),
              HasSubstr("t.yaml:1:15: global_batch: must be between 1 and"));
  EXPECT_THAT(SetUpError("global_batch: 8\nmicro_batch: {min: 4, max: 2}\n"),
              HasSubstr("t.yaml:2:28: micro_batch.max: must be ≥ min (4), got 2"));
  EXPECT_THAT(SetUpError("global_batch: 8\nmicro_batch: {mn: 4}\n"),
              HasSubstr("t.yaml:2:15: micro_batch.mn: unknown key 'mn'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nmicro_batch: 16\n"),
              HasSubstr("t.yaml:2:14: micro_batch: the smallest micro-batch, 16, is more than "
                        "global_batch 8"));
  EXPECT_THAT(SetUpError("global_batch: 8\ndtype: fp16\n"),
              HasSubstr("t.yaml:2:8: dtype: expected one of 'fp32', 'bf16', got 'fp16'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nzero: [0, 5]\n"),
              HasSubstr("t.yaml:2:11: zero[1]: expected a ZeRO stage 0, 1, 2 or 3, got '5'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nzero: [1, 1]\n"),
              HasSubstr("t.yaml:2:11: zero[1]: stage 1 is listed twice"));
  EXPECT_THAT(SetUpError("global_batch: 8\nzero: []\n"), HasSubstr("zero: lists no ZeRO stage"));
  EXPECT_THAT(SetUpError("global_batch: 8\nrecompute: yes\n"),
              HasSubstr("t.yaml:2:12: recompute: expected true, false, a recompute mode (none, "
                        "selective, full) or a list of them, got 'yes'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nrecompute: [none, most]\n"),
              HasSubstr("t.yaml:2:19: recompute[1]: expected one of 'none', 'selective', 'full', "
                        "got 'most'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nschedule: zb\n"),
              HasSubstr("t.yaml:2:11: schedule: expected one of '1f1b', 'interleaved', got 'zb'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nvirtual_stages: [2, 1]\n"),
              HasSubstr("t.yaml:2:21: virtual_stages[1]: expected chunks per stage from 2 to "
                        "1024, got '1'"));
  EXPECT_THAT(SetUpError("global_batch: 8\nschedule: 1f1b\nvirtual_stages: 2\n"),
              HasSubstr("t.yaml:3:17: virtual_stages: needs the interleaved schedule among "
                        "`schedule`"));
  EXPECT_THAT(SetUpError("global_batch: 8\ndevices: 0\n"),
              HasSubstr("t.yaml:2:10: devices: must be between 1 and"));
  EXPECT_THAT(SetUpError("global_batch: [8\n"), HasSubstr("t.yaml:"));
}

// ---- the live cluster from a status reply ----

TEST(ClusterSpecFromStatusTest, AliveNodesWithTheirMeasurements) {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<wire::ClusterStatus>();
  status.setClusterId("live");
  auto nodes = status.initNodes(3);
  const char* ids[] = {"a", "b", "gone"};
  for (unsigned n = 0; n < 3; ++n) {
    nodes[n].setNodeId(ids[n]);
    nodes[n].setState(n == 2 ? "dead" : "alive");
    auto devices = nodes[n].initDevices(2);
    for (unsigned d = 0; d < 2; ++d) {
      devices[d].setKind(wire::DeviceKind::CPU);
      devices[d].setIndex(d);
      devices[d].setMemoryBytes(uint64_t{2} << 30);
      devices[d].setName("cpu");
    }
  }
  auto calibration = nodes[0].initCalibration();
  calibration.setComputeFlops(4e10);
  calibration.setComputeHalfDim(60);
  calibration.setIntraBusBytesPerSecond(3e9);
  calibration.setIntraLatencySeconds(5e-5);
  calibration.setMeasuredUnixMs(1);
  auto rates = calibration.initDevices(1);
  rates[0].initDevice().setIndex(0);
  rates[0].setComputeFlops(4e10);
  rates[0].setComputeHalfDim(60);

  auto spec = ClusterSpecFromStatus(status.asReader(), "auto");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "live");
  ASSERT_EQ(spec->nodes.size(), 2u);  // the dead node is not planned on
  EXPECT_EQ(spec->devices(), 4);
  EXPECT_EQ(spec->nodes[0].measured_flops_fp32, 4e10);
  EXPECT_EQ(spec->nodes[0].measured_half_dim, 60);
  EXPECT_EQ(spec->nodes[0].intra_node.measured_bandwidth, 3e9);
  EXPECT_EQ(spec->nodes[0].intra_node.latency_s, 5e-5);
  EXPECT_EQ(spec->nodes[0].device_memory, int64_t{2} << 30);
  EXPECT_EQ(spec->nodes[1].measured_flops_fp32, 0);

  auto cuda = ClusterSpecFromStatus(status.asReader(), "cuda");
  ASSERT_FALSE(cuda.ok());
  EXPECT_THAT(std::string(cuda.status().message()),
              HasSubstr("cluster 'live' has no alive node with cuda devices"));
}

}  // namespace
}  // namespace shardline::cli
