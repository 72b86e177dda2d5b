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
  EXPECT_NE(train.output.find("step     60/120"), std::string::npos);
  EXPECT_NE(train.output.find("saving"), std::string::npos) << train.output;
  EXPECT_NE(train.output.find("committed step 60: " +
                              (dir / "ckpt" / "step-00000060" / "manifest.json").string()),
            std::string::npos)
      << train.output;
  for (const char* step : {"step-00000060", "step-00000120"}) {
    EXPECT_TRUE(fs::exists(dir / "ckpt" / step / "manifest.json")) << step;
    EXPECT_TRUE(fs::exists(dir / "ckpt" / step / "rank-00000.safetensors")) << step;
  }

  // A repeated sentence is learned: greedy generation continues it, with and without the cache.
  auto cached = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                              "the quick brown ", "--max-new-tokens", "20"});
  ASSERT_EQ(cached.exit_code, 0) << cached.output;
  EXPECT_NE(cached.output.find("the quick brown fox jumps"), std::string::npos) << cached.output;
  auto uncached = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                                "the quick brown ", "--max-new-tokens", "20", "--no-kv-cache"});
  EXPECT_EQ(uncached.output, cached.output);

  // On a GPU, the same greedy text (fp32 there too); without one, an error that says why.
  auto bad_device = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                                  "the quick brown ", "--device", "gpu"});
  EXPECT_EQ(bad_device.exit_code, 2);
  EXPECT_NE(bad_device.output.find("--device: 'gpu' is not a device: cpu, cuda or cuda:N"),
            std::string::npos)
      << bad_device.output;
  auto on_cuda = RunShardline({"generate", "--checkpoint", (dir / "ckpt").string(), "--prompt",
                               "the quick brown ", "--max-new-tokens", "20", "--device", "cuda"});
  if (on_cuda.exit_code == 0) {
    EXPECT_EQ(on_cuda.output, cached.output);
  } else {
    EXPECT_EQ(on_cuda.exit_code, 1) << on_cuda.output;
    const bool says_why = on_cuda.output.find("error: --device cuda: ") != std::string::npos &&
                          (on_cuda.output.find("cudaGetDeviceCount") != std::string::npos ||
                           on_cuda.output.find("built without CUDA") != std::string::npos);
    EXPECT_TRUE(says_why) << on_cuda.output;
  }

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

// Run again, `shardline train` continues from its newest committed step; a damaged step is
// skipped with its reason; --resume none and --init-from start afresh, each where it may.
TEST(TrainCliTest, ResumesWhereItStoppedAndSaysWhichStepItSkippedAndWhy) {
  const fs::path dir =
      fs::temp_directory_path() / ("shardline-train-resume-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "spec.yaml")
      << "name: resume\nmodel:\n  layers: 1\n  heads: 2\n  d_model: 32\n  max_seq_len: 32\n"
         "data:\n  synthetic:\n    bytes: 64KiB\nsteps: 4\nbatch: 2\ncheckpoint:\n  dir: "
      << (dir / "ckpt").string() << "\n  interval: 2\nlog_interval: 1\n";
  const std::string spec = (dir / "spec.yaml").string();
  auto first = RunShardline({"train", spec}, 120s);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(first.output.find("Resuming"), std::string::npos) << first.output;

  auto again = RunShardline({"train", spec, "--steps", "6"}, 120s);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("Resuming after step 4 from " +
                              (dir / "ckpt" / "step-00000004" / "manifest.json").string()),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("step      4/6"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("step      5/6"), std::string::npos) << again.output;
  auto done = RunShardline({"train", spec, "--steps", "6"}, 120s);
  ASSERT_EQ(done.exit_code, 0) << done.output;
  EXPECT_NE(done.output.find("Nothing to train: the run is already at step 6 of 6"),
            std::string::npos)
      << done.output;

  // Step 6's file damaged: the run falls back to step 4, says so, and sets step 6 aside.
  const fs::path file = dir / "ckpt" / "step-00000006" / "rank-00000.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1);
  auto fallback = RunShardline({"train", spec, "--steps", "6"}, 120s);
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("Skipped checkpoint step 6: checkpoint step 6: rank 0's file " +
                                 file.string()),
            std::string::npos)
      << fallback.output;
  EXPECT_NE(fallback.output.find("(truncated)"), std::string::npos) << fallback.output;
  EXPECT_NE(fallback.output.find("Resuming after step 4"), std::string::npos) << fallback.output;
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "step-00000006.corrupt"));

  auto none = RunShardline({"train", spec, "--resume", "none"}, 120s);
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.output.find("already holds committed steps (the newest is 6)"),
            std::string::npos)
      << none.output;
  // A new run from the parameters of the old one, into a dir of its own.
  auto fine_tune = RunShardline({"train", spec, "--init-from", (dir / "ckpt").string(),
                                 "--checkpoint-dir", (dir / "tuned").string()},
                                120s);
  ASSERT_EQ(fine_tune.exit_code, 0) << fine_tune.output;
  EXPECT_NE(fine_tune.output.find("Starting from the parameters of " + (dir / "ckpt").string()),
            std::string::npos)
      << fine_tune.output;
  EXPECT_NE(fine_tune.output.find("step      1/4"), std::string::npos) << fine_tune.output;
  auto not_a_checkpoint = RunShardline(
      {"train", spec, "--init-from", spec, "--checkpoint-dir", (dir / "other").string()}, 120s);
  EXPECT_EQ(not_a_checkpoint.exit_code, 1);
  EXPECT_NE(not_a_checkpoint.output.find("init_from " + spec), std::string::npos)
      << not_a_checkpoint.output;
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
