// `shardline checkpoint inspect` and `shardline checkpoint export`, as a user runs them, on the
// checkpoint folder of a real `shardline train` run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors_reader.h"
#include "nlohmann/json.hpp"
#include "tests/integration/local_cluster.h"
#include "tests/support/file_damage.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A fresh folder for one test, removed afterwards.
class CliCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("shardline-cli-checkpoint-" + std::to_string(getpid()) + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "corpus.txt") << [] {
      std::string text;
      for (int i = 0; i < 300; ++i) text += "the quick brown fox jumps over the lazy dog. ";
      return text;
    }();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains 60 steps with a checkpoint every 30: committed steps 30 and 60, `latest` at 60. (60
  // steps are enough for greedy generation to continue the sentence, which makes comparing
  // generated texts worth something.)
  std::string Train(const std::string& name, const std::string& model_extra = "") {
    const fs::path ckpt = dir_ / (name + "-ckpt");
    std::ofstream(dir_ / (name + ".yaml"))
        << "name: " << name << "\nmodel:\n  layers: 2\n  heads: 4\n  d_model: 32\n"
        << "  max_seq_len: 32\n"
        << model_extra << "data:\n  path: " << (dir_ / "corpus.txt").string()
        << "\noptimizer:\n  lr: 1.0e-2\n  warmup_steps: 2\nsteps: 60\nbatch: 4\nseq_len: 32\n"
           "seed: 3\nlog_interval: 30\ncheckpoint:\n  dir: "
        << ckpt.string() << "\n  interval: 30\n";
    const CommandResult train = RunShardline({"train", (dir_ / (name + ".yaml")).string()}, 300s);
    EXPECT_EQ(train.exit_code, 0) << train.output;
    return ckpt.string();
  }

  fs::path dir_;
};

nlohmann::json ParseJson(const CommandResult& result) {
  // stdout and stderr come together; the JSON document is the stdout part.
  const size_t begin = result.output.find('{');
  EXPECT_NE(begin, std::string::npos) << result.output;
  return nlohmann::json::parse(result.output.substr(begin == std::string::npos ? 0 : begin));
}

TEST_F(CliCheckpointTest, InspectListsStepsPlansOptimizerStateAndLatest) {
  const std::string ckpt = Train("list");
  ASSERT_TRUE(fs::exists(fs::path(ckpt) / "step-00000060" / "manifest.json"));
  // An interrupted save (no manifest) and a step set aside after failing verification.
  fs::create_directories(fs::path(ckpt) / "step-00000090");
  std::ofstream(fs::path(ckpt) / "step-00000090" / "rank-00000.safetensors") << "partial";
  fs::copy(fs::path(ckpt) / "step-00000030", fs::path(ckpt) / "step-00000005.corrupt");

  const CommandResult inspect = RunShardline({"checkpoint", "inspect", ckpt});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  const std::string& out = inspect.output;
  EXPECT_THAT(out, HasSubstr("2 committed steps, latest step 60")) << out;
  const std::string plan = "tp 1 · pp 1 · dp 1 · ZeRO 0 (cpu, fp32), world size 1, 1 file";
  const size_t first = out.find("step 30: " + plan);
  const size_t last = out.find("step 60: " + plan);
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(last, std::string::npos) << out;
  EXPECT_LT(first, last);  // oldest first
  EXPECT_THAT(out.substr(last, out.find('\n', last) - last),
              AllOf(HasSubstr("with optimizer state"), HasSubstr("[latest]")));
  EXPECT_THAT(out.substr(first, out.find('\n', first) - first), Not(HasSubstr("[latest]")));
  EXPECT_THAT(out, HasSubstr("step 90: uncommitted (no manifest.json"));
  EXPECT_THAT(out, HasSubstr("step-00000005.corrupt: set aside"));

  const CommandResult json_run = RunShardline({"checkpoint", "inspect", ckpt, "--json"});
  ASSERT_EQ(json_run.exit_code, 0) << json_run.output;
  const nlohmann::json json = ParseJson(json_run);
  EXPECT_EQ(json.at("latest"), 60);
  ASSERT_EQ(json.at("steps").size(), 2u) << json.dump(2);
  EXPECT_EQ(json["steps"][0].at("step"), 30);
  EXPECT_EQ(json["steps"][1].at("step"), 60);
  EXPECT_EQ(json["steps"][1].at("latest"), true);
  EXPECT_EQ(json["steps"][1].at("optimizer_state"), true);
  EXPECT_EQ(json["steps"][1].at("world_size"), 1);
  EXPECT_EQ(json["steps"][1].at("plan").at("tp"), 1);
  EXPECT_EQ(json["steps"][1].at("files"), 1);
  EXPECT_EQ(json["steps"][1].at("bytes"),
            fs::file_size(fs::path(ckpt) / "step-00000060" / "rank-00000.safetensors"));
  ASSERT_EQ(json.at("uncommitted").size(), 1u);
  EXPECT_EQ(json["uncommitted"][0].at("step"), 90);
  ASSERT_EQ(json.at("set_aside").size(), 1u);
  EXPECT_EQ(json["set_aside"][0].at("name"), "step-00000005.corrupt");
}

TEST_F(CliCheckpointTest, InspectStepShowsItsTensorsAndTrainSection) {
  const std::string ckpt = Train("step");
  const CommandResult inspect = RunShardline({"checkpoint", "inspect", ckpt, "--step", "60"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  const std::string& out = inspect.output;
  EXPECT_THAT(out, HasSubstr("train: seed 3, batch 4, seq_len 32, data file")) << out;
  EXPECT_THAT(out, HasSubstr("steps 60"));
  EXPECT_THAT(out, HasSubstr("tensors (84)"));  // 28 parameters and their two moments
  for (const char* line : {"wte ", "h.1.qkv.w ", "optim.exp_avg.wte ", "optim.exp_avg_sq.lnf.b "}) {
    EXPECT_THAT(out, HasSubstr(std::string("    ") + line)) << line;
  }
  EXPECT_THAT(out, HasSubstr("[3, 32, 32]"));  // qkv in the (3, C, C) view that shards use

  // A step folder stands for its step.
  const CommandResult folder =
      RunShardline({"checkpoint", "inspect", ckpt + "/step-00000030", "--json"});
  ASSERT_EQ(folder.exit_code, 0) << folder.output;
  const nlohmann::json step = ParseJson(folder).at("step");
  EXPECT_EQ(step.at("step"), 30);
  EXPECT_EQ(step.at("train").at("seed"), 3);
  EXPECT_EQ(step.at("train").at("batch"), 4);
  EXPECT_EQ(step.at("train").at("seq_len"), 32);
  EXPECT_EQ(step.at("train").at("data").at("source"), "file");
  bool found = false;
  for (const nlohmann::json& tensor : step.at("tensors")) {
    if (tensor.at("name") != "optim.exp_avg.wte") continue;
    found = true;
    EXPECT_EQ(tensor.at("dtype"), "F32");
    EXPECT_EQ(tensor.at("global_shape"), nlohmann::json::array({257, 32}));
    EXPECT_EQ(tensor.at("shards"), 1);
    EXPECT_EQ(tensor.at("bytes"), 257 * 32 * 4);
  }
  EXPECT_TRUE(found) << step.dump(2);
}

TEST_F(CliCheckpointTest, VerifyNamesTheFileAndTensorOfAChangedByte) {
  const std::string ckpt = Train("verify");
  const CommandResult ok = RunShardline({"checkpoint", "inspect", ckpt, "--verify"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, AllOf(HasSubstr("verify: OK"), HasSubstr("Verification OK")));
  EXPECT_THAT(ok.output, Not(HasSubstr("FAILED")));

  // Flip one byte inside h.1.fc.w's bytes in step 60's only rank file.
  const std::string file = ckpt + "/step-00000060/rank-00000.safetensors";
  uint64_t offset = 0;
  {
    absl::StatusOr<checkpoint::SafetensorsReader> reader =
        checkpoint::SafetensorsReader::Open(file);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const checkpoint::TensorInfo* info = reader->Find("h.1.fc.w");
    ASSERT_NE(info, nullptr);
    std::ifstream in(file, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);  // little-endian, as this machine
    offset = 8 + header + info->begin + 100;
  }
  FlipBits(file, static_cast<int64_t>(offset), 0x10);
  const CommandResult bad = RunShardline({"checkpoint", "inspect", ckpt, "--verify"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_THAT(bad.output, AllOf(HasSubstr("verify: FAILED"), HasSubstr("step-00000060"),
                                HasSubstr("rank-00000.safetensors"), HasSubstr("'h.1.fc.w'"),
                                HasSubstr("Verification FAILED")))
      << bad.output;
  // Step 30 is untouched.
  const CommandResult first =
      RunShardline({"checkpoint", "inspect", ckpt, "--step", "30", "--verify", "--json"});
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(ParseJson(first).at("step").at("verify").at("ok"), true);
  const CommandResult json = RunShardline({"checkpoint", "inspect", ckpt, "--verify", "--json"});
  EXPECT_EQ(json.exit_code, 1) << json.output;
  const nlohmann::json parsed = ParseJson(json);
  EXPECT_EQ(parsed.at("ok"), false);
  EXPECT_THAT(parsed.at("steps").at(1).at("verify").at("error").get<std::string>(),
              HasSubstr("'h.1.fc.w'"));
  // Export refuses the changed step rather than writing its bytes out.
  const CommandResult exported = RunShardline(
      {"checkpoint", "export", ckpt, "--format", "hf", "--out", (dir_ / "hf").string()});
  EXPECT_EQ(exported.exit_code, 1) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("'h.1.fc.w'"));
}

// The exported folder generates what the checkpoint it came from generates, tied or untied.
TEST_F(CliCheckpointTest, ExportHfGeneratesTheSameText) {
  for (const bool tied : {true, false}) {
    const std::string name = tied ? "tied" : "untied";
    const std::string ckpt = Train(name, tied ? "" : "  tied_embeddings: false\n  d_ff: 48\n");
    const std::string out = (dir_ / (name + "-hf")).string();
    const CommandResult exported =
        RunShardline({"checkpoint", "export", ckpt, "--format", "hf", "--out", out});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_THAT(exported.output, HasSubstr(tied ? "tied head" : "untied head"));
    EXPECT_TRUE(fs::exists(fs::path(out) / "model.safetensors"));
    std::ifstream config_file(fs::path(out) / "config.json");
    const nlohmann::json config = nlohmann::json::parse(config_file);
    EXPECT_EQ(config.at("n_head"), 4);
    EXPECT_EQ(config.at("tie_word_embeddings"), tied);

    const std::vector<std::string> generate = {"--prompt", "the quick ", "--max-new-tokens", "8"};
    std::vector<std::string> from_ckpt = {"generate", "--checkpoint", ckpt};
    std::vector<std::string> from_hf = {"generate", "--checkpoint", out};
    from_ckpt.insert(from_ckpt.end(), generate.begin(), generate.end());
    from_hf.insert(from_hf.end(), generate.begin(), generate.end());
    const CommandResult a = RunShardline(from_ckpt);
    const CommandResult b = RunShardline(from_hf);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    // 60 steps learn the sentence: the texts compared are a real continuation, not blanks.
    EXPECT_THAT(a.output, HasSubstr("the quick b"));
    EXPECT_EQ(b.output, a.output) << name;

    // An earlier step on request.
    const CommandResult first = RunShardline(
        {"checkpoint", "export", ckpt, "--step", "30", "--format", "hf", "--out", out + "-30"});
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_THAT(first.output, HasSubstr("step 30"));
  }
}

TEST_F(CliCheckpointTest, BadInputIsExitCodeTwoAndSaysWhat) {
  const std::string ckpt = Train("bad");
  const std::string out = (dir_ / "out").string();
  const CommandResult format =
      RunShardline({"checkpoint", "export", ckpt, "--format", "onnx", "--out", out});
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_THAT(format.output, AllOf(HasSubstr("--format 'onnx' is not supported"), HasSubstr("hf")));
  EXPECT_FALSE(fs::exists(out));

  const std::string missing = (dir_ / "nope").string();
  const CommandResult no_dir = RunShardline({"checkpoint", "inspect", missing});
  EXPECT_EQ(no_dir.exit_code, 2);
  EXPECT_THAT(no_dir.output, HasSubstr("no checkpoint dir at " + missing));
  const CommandResult no_dir_export =
      RunShardline({"checkpoint", "export", missing, "--format", "hf", "--out", out});
  EXPECT_EQ(no_dir_export.exit_code, 2);
  EXPECT_THAT(no_dir_export.output, HasSubstr(missing));

  const CommandResult no_step = RunShardline({"checkpoint", "inspect", ckpt, "--step", "15"});
  EXPECT_EQ(no_step.exit_code, 2);
  EXPECT_THAT(no_step.output, HasSubstr("has no step 15 (committed steps: 30, 60)"));
  const CommandResult no_step_export =
      RunShardline({"checkpoint", "export", ckpt, "--step", "15", "--format", "hf", "--out", out});
  EXPECT_EQ(no_step_export.exit_code, 2);
  EXPECT_THAT(no_step_export.output, HasSubstr("no committed step 15"));

  fs::create_directories(out);
  std::ofstream(fs::path(out) / "keep.txt") << "mine";
  const CommandResult not_empty =
      RunShardline({"checkpoint", "export", ckpt, "--format", "hf", "--out", out});
  EXPECT_EQ(not_empty.exit_code, 2);
  EXPECT_THAT(not_empty.output, HasSubstr("exists and is not an empty folder"));
  EXPECT_FALSE(fs::exists(fs::path(out) / "model.safetensors"));
}

}  // namespace
}  // namespace shardline::testing
