// `shardline train` then `shardline generate`, as a user runs them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(TrainCliTest, TrainsSavesAndGenerates) {
  const fs::path dir = fs::temp_directory_path() / ("shardline-train-cli-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "corpus.txt") << [] {
    std::string text;
    for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    return text;
  }();
  std::ofstream(dir / "spec.yaml")
      << "name: cli\nmodel:\n  layers: 1\n  heads: 2\n  d_model: 32\n  max_seq_len: 48\n"
         "data:\n  path: corpus.txt\noptimizer:\n  lr: 1.0e-2\nsteps: 120\nbatch: 4\n"
         "seq_len: 32\ncheckpoint:\n  dir: "
      << (dir / "ckpt").string() << "\n  interval: 60\nlog_interval: 30\n";
  auto train = RunShardline({"train", (dir / "spec.yaml").string()}, 300s);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("step     30/120"), std::string::npos) << train.output;
  EXPECT_NE(train.output.find("tok/s"), std::string::npos);
  EXPECT_NE(train.output.find("ETA"), std::string::npos);
  EXPECT_NE(train.output.find("saved"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "step-00000060" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "step-00000120" / "model.safetensors"));

  // A repeated sentence is learned: greedy generation continues it, with and without the cache.
  auto cached = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                              "the quick brown ", "--max-new-tokens", "20"});
  ASSERT_EQ(cached.exit_code, 0) << cached.output;
  EXPECT_NE(cached.output.find("the quick brown fox jumps"), std::string::npos) << cached.output;
  auto uncached = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                                "the quick brown ", "--max-new-tokens", "20", "--no-kv-cache"});
  EXPECT_EQ(uncached.output, cached.output);

  auto too_long = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                                "the quick brown ", "--max-new-tokens", "100"});
  EXPECT_NE(too_long.exit_code, 0);
  EXPECT_NE(too_long.output.find("past max_seq_len 48"), std::string::npos) << too_long.output;

  std::ofstream(dir / "bad.yaml") << "name: bad\nmodel:\n  layers: 1\n  heads: 3\n  d_model: 32\n"
                                     "  max_seq_len: 8\nsteps: 1\nbatch: 1\n";
  auto bad = RunShardline({"train", (dir / "bad.yaml").string()});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("bad.yaml:5:12: model.d_model: d_model 32 is not divisible by heads 3"),
            std::string::npos)
      << bad.output;
  auto missing = RunShardline({"generate", "--checkpoint", (dir / "nope").string(), "--prompt", "x"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("no checkpoint at"), std::string::npos) << missing.output;
  fs::remove_all(dir);
}

// The device flags, and what `--device cuda` says where it cannot run (here: no GPU, or a build
// without CUDA); where a GPU is visible the same command must train.
TEST(TrainCliTest, DeviceFlagsAreCheckedAndCudaSaysWhyItCannotRun) {
  const fs::path dir = fs::temp_directory_path() / ("shardline-train-dev-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "spec.yaml")
      << "name: dev\nmodel:\n  layers: 1\n  heads: 2\n  d_model: 32\n  max_seq_len: 32\n"
         "data:\n  synthetic:\n    bytes: 64KiB\nsteps: 3\nbatch: 2\n";
  const std::string spec = (dir / "spec.yaml").string();

  auto bad_device = RunShardline({"train", spec, "--device", "gpu"});
  EXPECT_EQ(bad_device.exit_code, 2);
  EXPECT_NE(bad_device.output.find("--device: 'gpu' is not a device: cpu, cuda or cuda:N"),
            std::string::npos)
      << bad_device.output;
  auto bf16_on_cpu = RunShardline({"train", spec, "--precision", "bf16"});
  EXPECT_EQ(bf16_on_cpu.exit_code, 2);
  EXPECT_NE(bf16_on_cpu.output.find("--precision: bf16 needs device cuda"), std::string::npos)
      << bf16_on_cpu.output;

  auto cuda = RunShardline({"train", spec, "--device", "cuda"}, 120s);
  EXPECT_NE(cuda.output.find("(cuda:0, bf16)"), std::string::npos) << cuda.output;
  if (cuda.exit_code == 0) {
    EXPECT_NE(cuda.output.find("Final loss"), std::string::npos) << cuda.output;
  } else {
    EXPECT_EQ(cuda.exit_code, 1) << cuda.output;
    const bool says_why = cuda.output.find("error: device cuda:0: ") != std::string::npos &&
                          (cuda.output.find("cudaGetDeviceCount") != std::string::npos ||
                           cuda.output.find("built without CUDA") != std::string::npos);
    EXPECT_TRUE(says_why) << cuda.output;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::testing
