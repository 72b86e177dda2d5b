#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "placement/job_spec.h"
#include "tests/support/source_dir.h"

namespace shardline::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

using test_support::SourceDir;

// A valid spec that each test changes in one place.
constexpr char kMinimal[] =
    "name: check\n"
    "kind: comm-check\n"
    "actors: 2\n";

absl::StatusOr<JobSpec> Parse(const std::string& text) { return ParseJobSpec(text, "job.yaml"); }

// Parses text that must fail and returns the message.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<JobSpec> spec = Parse(text);
  EXPECT_FALSE(spec.ok()) << "parsed unexpectedly:\n" << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return Message(spec.status());
}

TEST(JobSpecTest, ExampleCommCheckParses) {
  const std::string path = SourceDir() + "/examples/comm-check.yaml";
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind, JobKind::kCommCheck);
  EXPECT_EQ(spec->actors, 4);
  EXPECT_EQ(spec->devices, DeviceKind::kCpu);
  EXPECT_EQ(ResolveBackend(*spec), Backend::kShm);
  EXPECT_EQ(spec->comm_check.min_bytes, 4);
  EXPECT_EQ(spec->comm_check.max_bytes, 64 << 20);
  EXPECT_TRUE(spec->comm_check.ops.empty());
}

TEST(JobSpecTest, ExampleCommCheckSmallParses) {
  const std::string path = SourceDir() + "/examples/comm-check-small.yaml";
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "comm-check-small");
  EXPECT_EQ(spec->actors, 2);
  EXPECT_EQ(spec->devices, DeviceKind::kCpu);
  EXPECT_EQ(spec->comm_check.max_bytes, 1 << 20);
  EXPECT_FALSE(spec->comm_check.ops.empty());
}

TEST(JobSpecTest, MinimalSpecGetsDefaults) {
  absl::StatusOr<JobSpec> spec = Parse(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "check");
  EXPECT_EQ(spec->actors, 2);
  EXPECT_EQ(spec->devices, DeviceKind::kCpu);
  EXPECT_EQ(spec->backend, Backend::kAuto);
  EXPECT_EQ(spec->bootstrap_timeout, std::chrono::seconds(30));
  EXPECT_EQ(spec->run_timeout, std::chrono::seconds(600));
  const CommCheckSpec defaults;
  EXPECT_EQ(spec->comm_check.min_bytes, defaults.min_bytes);
  EXPECT_EQ(spec->comm_check.max_bytes, defaults.max_bytes);
  EXPECT_EQ(spec->comm_check.iterations, defaults.iterations);
  EXPECT_TRUE(spec->comm_check.ops.empty());
  EXPECT_TRUE(spec->comm_check.uneven_sizes);
}

TEST(JobSpecTest, FullSpecIsRead) {
  absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimal) +
                                       "devices: cuda\n"
                                       "backend: nccl\n"
                                       "bootstrap_timeout_s: 2.5\n"
                                       "run_timeout_s: 60\n"
                                       "comm_check:\n"
                                       "  min_bytes: 1KiB\n"
                                       "  max_bytes: 1GB\n"
                                       "  iterations: 10\n"
                                       "  warmup_iterations: 0\n"
                                       "  ops: [broadcast, barrier]\n"
                                       "  uneven_sizes: false\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices, DeviceKind::kCuda);
  EXPECT_EQ(spec->backend, Backend::kNccl);
  EXPECT_EQ(spec->bootstrap_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(spec->run_timeout, std::chrono::seconds(60));
  EXPECT_EQ(spec->comm_check.min_bytes, 1024);
  EXPECT_EQ(spec->comm_check.max_bytes, 1'000'000'000);
  EXPECT_EQ(spec->comm_check.iterations, 10);
  EXPECT_EQ(spec->comm_check.warmup_iterations, 0);
  EXPECT_THAT(spec->comm_check.ops, ElementsAre("broadcast", "barrier"));
  EXPECT_FALSE(spec->comm_check.uneven_sizes);
}

TEST(JobSpecTest, UnknownTopLevelKeyNamesKeyLineAndSuggestion) {
  const std::string message = ErrorOf(std::string(kMinimal) + "device: cuda\n");
  EXPECT_THAT(message, HasSubstr("job.yaml:4:1: device: unknown key 'device'"));
  EXPECT_THAT(message, HasSubstr("did you mean 'devices'?"));
  EXPECT_THAT(message, HasSubstr("known keys: name, kind, actors, devices, backend"));
}

TEST(JobSpecTest, UnknownCommCheckKeyHasPath) {
  const std::string message = ErrorOf(std::string(kMinimal) +
                                      "comm_check:\n"
                                      "  max_byte: 1MiB\n");
  EXPECT_THAT(message, HasSubstr("job.yaml:5:3: comm_check.max_byte: unknown key 'max_byte'"));
  EXPECT_THAT(message, HasSubstr("did you mean 'max_bytes'?"));
}

TEST(JobSpecTest, WrongTypes) {
  EXPECT_THAT(ErrorOf("name: check\nkind: comm-check\nactors: four\n"),
              HasSubstr("job.yaml:3:9: actors: expected an integer, got 'four'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "comm_check:\n  max_bytes: lots\n"),
              HasSubstr("job.yaml:5:14: comm_check.max_bytes: expected a byte size"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "comm_check:\n  uneven_sizes: maybe\n"),
              HasSubstr("comm_check.uneven_sizes: expected true or false, got 'maybe'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "comm_check: [1, 2]\n"),
              HasSubstr("comm_check: expected a mapping"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "comm_check:\n  ops: all_gather\n"),
              HasSubstr("comm_check.ops: expected a list"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "run_timeout_s: forever\n"),
              HasSubstr("run_timeout_s: expected a finite number, got 'forever'"));
}

TEST(JobSpecTest, RequiredKeysAndEnums) {
  EXPECT_THAT(ErrorOf("kind: comm-check\nactors: 2\n"),
              HasSubstr("job.yaml:1:1: name: required key 'name' is missing"));
  EXPECT_THAT(ErrorOf("name: check\nactors: 2\n"), HasSubstr("kind: required key 'kind'"));
  EXPECT_THAT(ErrorOf("name: check\nkind: trains\nactors: 2\n"),
              HasSubstr("job.yaml:2:7: kind: expected one of 'comm-check', 'train', 'serve', "
                        "got 'trains'; did you mean 'train'?"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "devices: gpu\n"),
              HasSubstr("devices: expected one of 'cpu', 'cuda', got 'gpu'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "backend: ncl\n"),
              HasSubstr("backend: expected one of 'auto', 'gloo', 'nccl', 'shm', got 'ncl'; did you "
                        "mean 'nccl'?"));
}

TEST(JobSpecTest, BadNames) {
  EXPECT_THAT(ErrorOf("name: My Job\nkind: comm-check\nactors: 2\n"),
              HasSubstr("job.yaml:1:7: name: may contain only a-z, 0-9, '-' and '_'"));
  EXPECT_THAT(ErrorOf("name: ''\nkind: comm-check\nactors: 2\n"),
              HasSubstr("name: must be 1 to 63 characters long, got 0"));
  EXPECT_THAT(ErrorOf("name: " + std::string(64, 'a') + "\nkind: comm-check\nactors: 2\n"),
              HasSubstr("got 64"));
  EXPECT_TRUE(Parse("name: " + std::string(63, 'a') + "\nkind: comm-check\nactors: 2\n").ok());
}

TEST(JobSpecTest, ImpossibleValues) {
  EXPECT_THAT(ErrorOf("name: check\nkind: comm-check\nactors: 0\n"),
              HasSubstr("job.yaml:3:9: actors: must be between 1 and 65536, got 0"));
  EXPECT_THAT(ErrorOf("name: check\nkind: comm-check\nactors: 1\n"),
              HasSubstr("actors: a comm-check needs at least 2 actors"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "backend: nccl\n"),
              HasSubstr("job.yaml:4:10: backend: 'nccl' runs only on cuda devices, but devices is "
                        "'cpu'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "bootstrap_timeout_s: 0\n"),
              HasSubstr("bootstrap_timeout_s: must be > 0, got 0"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "bootstrap_timeout_s: 0.0001\n"),
              HasSubstr("bootstrap_timeout_s: must be at least 0.001 (1 ms)"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "run_timeout_s: -5\n"),
              HasSubstr("run_timeout_s: must be > 0, got -5"));
}

TEST(JobSpecTest, ImpossibleCommCheckValues) {
  const std::string prefix = std::string(kMinimal) + "comm_check:\n";
  EXPECT_THAT(ErrorOf(prefix + "  min_bytes: 1MiB\n  max_bytes: 4KiB\n"),
              HasSubstr("job.yaml:6:14: comm_check.max_bytes: must be ≥ min_bytes (1MiB), got "
                        "4KiB"));
  EXPECT_THAT(ErrorOf(prefix + "  min_bytes: 128MiB\n"),
              HasSubstr("comm_check.min_bytes: must be ≤ max_bytes (64MiB, the default)"));
  EXPECT_THAT(ErrorOf(prefix + "  min_bytes: 6\n"),
              HasSubstr("comm_check.min_bytes: must be a multiple of 4 bytes"));
  EXPECT_THAT(ErrorOf(prefix + "  min_bytes: 0\n"),
              HasSubstr("comm_check.min_bytes: must be between 4B and 1GiB, got 0B"));
  EXPECT_THAT(ErrorOf(prefix + "  max_bytes: 2GiB\n"),
              HasSubstr("comm_check.max_bytes: must be between 4B and 1GiB, got 2GiB"));
  EXPECT_THAT(ErrorOf(prefix + "  iterations: 0\n"),
              HasSubstr("comm_check.iterations: must be between 1 and 1000, got 0"));
  EXPECT_THAT(ErrorOf(prefix + "  warmup_iterations: -1\n"),
              HasSubstr("comm_check.warmup_iterations: must be between 0 and 1000, got -1"));
  EXPECT_TRUE(Parse(prefix + "  max_bytes: 1GiB\n").ok());
}

TEST(JobSpecTest, UnknownOrRepeatedOp) {
  const std::string prefix = std::string(kMinimal) + "comm_check:\n  ops:\n";
  const std::string message = ErrorOf(prefix + "    - broadcast\n    - allreduce_sum\n");
  EXPECT_THAT(message, HasSubstr("job.yaml:7:7: comm_check.ops[1]: expected one of "
                                 "'all_reduce_sum', 'all_reduce_avg'"));
  EXPECT_THAT(message, HasSubstr("'barrier', got 'allreduce_sum'; did you mean 'all_reduce_sum'?"));
  EXPECT_THAT(ErrorOf(prefix + "    - barrier\n    - barrier\n"),
              HasSubstr("comm_check.ops[1]: 'barrier' is listed twice (also at index 0)"));
}

TEST(JobSpecTest, SyntaxErrorGivesLine) {
  absl::StatusOr<JobSpec> spec = Parse("name: check\nkind: comm-check\nactors: [2\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(spec.status()), HasSubstr("job.yaml:"));
  EXPECT_THAT(Message(spec.status()), HasSubstr("invalid YAML"));

  absl::StatusOr<JobSpec> bad_indent = Parse("name: check\n  kind: comm-check\n");
  ASSERT_FALSE(bad_indent.ok());
  EXPECT_THAT(Message(bad_indent.status()), HasSubstr("job.yaml:2:"));
}

TEST(JobSpecTest, MissingFileIsNotFound) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile("/nonexistent/no-such-job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(spec.status()), HasSubstr("/nonexistent/no-such-job.yaml"));
}

TEST(JobSpecTest, ErrorsFromFilesNameTheFile) {
  const std::string path = ::testing::TempDir() + "/bad-job.yaml";
  {
    FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr);
    std::fputs("name: check\nkind: comm-check\nactors: 0\n", file);
    std::fclose(file);
  }
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(Message(spec.status()), HasSubstr(path + ":3:9: actors:"));
  std::remove(path.c_str());
}

TEST(JobSpecTest, BackendResolution) {
  JobSpec spec;
  EXPECT_EQ(ResolveBackend(spec), Backend::kShm);  // auto on cpu
  spec.backend = Backend::kGloo;
  EXPECT_EQ(ResolveBackend(spec), Backend::kGloo);  // forced
  spec.backend = Backend::kAuto;
  spec.devices = DeviceKind::kCuda;
  EXPECT_EQ(ResolveBackend(spec), Backend::kNccl);
  spec.backend = Backend::kGloo;
  EXPECT_EQ(ResolveBackend(spec), Backend::kGloo);
  absl::StatusOr<JobSpec> gloo_on_cuda =
      Parse(std::string(kMinimal) + "devices: cuda\nbackend: gloo\n");
  ASSERT_TRUE(gloo_on_cuda.ok()) << gloo_on_cuda.status();
  absl::StatusOr<JobSpec> shm_on_cuda = Parse(std::string(kMinimal) + "devices: cuda\nbackend: shm\n");
  ASSERT_FALSE(shm_on_cuda.ok());
  EXPECT_THAT(Message(shm_on_cuda.status()), HasSubstr("'shm' runs only on cpu devices"));
  absl::StatusOr<JobSpec> shm = Parse(std::string(kMinimal) + "backend: shm\n");
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ(ResolveBackend(*shm), Backend::kShm);
}

TEST(JobSpecTest, NamesMatchYamlSpellings) {
  EXPECT_EQ(JobKindName(JobKind::kCommCheck), "comm-check");
  EXPECT_EQ(JobKindName(JobKind::kTrain), "train");
  EXPECT_EQ(DeviceKindName(DeviceKind::kCpu), "cpu");
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
  EXPECT_EQ(BackendName(Backend::kAuto), "auto");
  EXPECT_EQ(BackendName(Backend::kGloo), "gloo");
  EXPECT_EQ(BackendName(Backend::kNccl), "nccl");
  EXPECT_EQ(BackendName(Backend::kShm), "shm");
}

// ---- kind: train ----

// A valid train job that each test changes in one place; its lines are numbered for the expected
// error locations (parallel, when appended, starts on line 10).
constexpr char kMinimalTrain[] =
    "name: gpt\n"          // 1
    "kind: train\n"        // 2
    "model:\n"             // 3
    "  layers: 4\n"        // 4
    "  heads: 4\n"         // 5
    "  d_model: 64\n"      // 6
    "  max_seq_len: 64\n"  // 7
    "steps: 10\n"          // 8
    "batch: 8\n";          // 9

// ---- data_parallel ----

TEST(TrainJobSpecTest, DataParallelSaysHowReplicasStayInStep) {
  absl::StatusOr<JobSpec> plain =
      Parse(std::string(kMinimalTrain) + "parallel: {dp: 2}\ndata_parallel: {bucket_mb: 8}\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->data_parallel.bucket_bytes, 8 << 20);
  EXPECT_FALSE(plain->data_parallel.compressed());
  EXPECT_FALSE(plain->data_parallel.diloco());
  absl::StatusOr<JobSpec> powersgd = Parse(std::string(kMinimalTrain) +
                                           "parallel: {dp: 2, zero: 1}\n"
                                           "data_parallel: {compression: powersgd, rank: 4}\n");
  ASSERT_TRUE(powersgd.ok()) << powersgd.status();
  EXPECT_EQ(powersgd->data_parallel.compression, GradientCompression::kPowerSgd);
  EXPECT_EQ(powersgd->data_parallel.rank, 4);
  absl::StatusOr<JobSpec> diloco =
      Parse(std::string(kMinimalTrain) +
            "parallel: {dp: 2}\n"
            "data_parallel: {sync: diloco, every: 50, outer_lr: 0.5, outer_momentum: 0.8, "
            "fragments: 2}\n");
  ASSERT_TRUE(diloco.ok()) << diloco.status();
  EXPECT_TRUE(diloco->data_parallel.diloco());
  EXPECT_EQ(diloco->data_parallel.every, 50);
  EXPECT_DOUBLE_EQ(diloco->data_parallel.outer_lr, 0.5);
  EXPECT_DOUBLE_EQ(diloco->data_parallel.outer_momentum, 0.8);
  EXPECT_EQ(diloco->data_parallel.fragments, 2);
}

// The bad inputs, each refused at submit naming the key and the value.
TEST(TrainJobSpecTest, DataParallelOptionsTheLayoutCannotRunAreRefused) {
  const std::string train = kMinimalTrain;
  EXPECT_THAT(ErrorOf(train + "data_parallel: {compression: powersgd}\n"),
              HasSubstr("data_parallel.compression: powersgd needs data parallelism, but dp is 1"));
  EXPECT_THAT(ErrorOf(train + "data_parallel: {compression: int8}\n"),
              HasSubstr("data_parallel.compression: int8 needs data parallelism, but dp is 1"));
  EXPECT_THAT(ErrorOf(train + "data_parallel: {sync: diloco}\n"),
              HasSubstr("data_parallel.sync: diloco needs data parallelism"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2, zero: 3}\ndata_parallel: {sync: diloco}\n"),
              HasSubstr("data_parallel.sync: diloco needs zero 0, but parallel.zero is 3"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2, zero: 1}\ndata_parallel: {sync: diloco}\n"),
              HasSubstr("parallel.zero is 1"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {sync: diloco, every: 0}\n"),
              HasSubstr("data_parallel.every: 0 must be at least 1"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {sync: diloco, every: -3}\n"),
              HasSubstr("data_parallel.every: -3 must be at least 1"));
  // d_model 64 at tp 2: the smallest per-rank gradient matrix dimension is 32.
  EXPECT_THAT(ErrorOf(train + "parallel: {tp: 2, dp: 2}\n"
                              "data_parallel: {compression: powersgd, rank: 33}\n"),
              HasSubstr("data_parallel.rank: 33 must be 1 to 32, the smallest dimension of a "
                        "rank's gradient matrices at tp 2"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2, zero: 2}\ndata_parallel: {compression: int8}\n"),
              HasSubstr("needs zero 0 or 1, but parallel.zero is 2"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {every: 5}\n"),
              HasSubstr("every is DiLoCo's: it needs sync: diloco"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {rank: 2}\n"),
              HasSubstr("rank is PowerSGD's: it needs compression: powersgd"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {compression: zip}\n"),
              HasSubstr("data_parallel.compression"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {bucket_mb: 0}\n"),
              HasSubstr("data_parallel.bucket_mb"));
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 2}\ndata_parallel: {sync: diloco, fragments: 5}\n"),
              HasSubstr("data_parallel.fragments: 5 must be 1 to the model's 4 layers"));
  EXPECT_THAT(ErrorOf(train + "devices: cuda\nparallel: {dp: 2}\n"
                              "data_parallel: {compression: int8}\n"),
              HasSubstr("data_parallel.compression: int8 compresses host memory"));
  // The error points at the section (line 11: after parallel on line 10).
  EXPECT_THAT(ErrorOf(train + "parallel: {dp: 1}\ndata_parallel: {sync: diloco}\n"),
              HasSubstr("job.yaml:11:"));
}

TEST(TrainJobSpecTest, TheCheckpointSectionSaysWhereToSaveKeepAndResumeFrom) {
  absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimalTrain) +
                                       "checkpoint: {dir: ckpt, interval: 5, keep: 3}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train.checkpoint.dir, "ckpt");
  EXPECT_EQ(spec->train.checkpoint.interval, 5);
  EXPECT_EQ(spec->train.checkpoint.keep, 3);
  EXPECT_EQ(spec->train.checkpoint.resume, checkpoint::ResumeMode::kLatest);  // the default
  EXPECT_TRUE(spec->train.init_from.empty());
  absl::StatusOr<JobSpec> none =
      Parse(std::string(kMinimalTrain) + "checkpoint: {dir: ckpt, resume: none}\n");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->train.checkpoint.resume, checkpoint::ResumeMode::kNone);
  // A path resumes from that step; it and init_from resolve like checkpoint.dir.
  PathBase base;
  base.work_dir = "/home/me";
  absl::StatusOr<JobSpec> path = ParseJobSpec(
      std::string(kMinimalTrain) + "checkpoint: {dir: ckpt, resume: old/step-00000100}\n",
      "job.yaml", base);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(path->train.checkpoint.resume, checkpoint::ResumeMode::kPath);
  EXPECT_EQ(path->train.checkpoint.resume_path, "/home/me/old/step-00000100");
  absl::StatusOr<JobSpec> init = ParseJobSpec(
      std::string(kMinimalTrain) + "init_from: gpt2/model.safetensors\n", "job.yaml", base);
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_EQ(init->train.init_from, "/home/me/gpt2/model.safetensors");
}

TEST(TrainJobSpecTest, ACheckpointSectionThatCannotWorkIsAnErrorAtItsKey) {
  const struct {
    std::string yaml;
    std::string message;
  } cases[] = {
      {"checkpoint: {keep: 2}\n", "job.yaml:10:20: checkpoint.keep: needs checkpoint.dir"},
      {"checkpoint: {interval: 2}\n", "checkpoint.interval: needs checkpoint.dir"},
      {"checkpoint: {dir: c, keep: -1}\n", "checkpoint.keep"},
      {"checkpoint: {dir: c, resume: \"\"}\n",
       "checkpoint.resume: give latest, none or the path of a checkpoint step"},
      {"checkpoint: {dir: c, resume: old}\ninit_from: x\n",
       "init_from: give either init_from (parameters only, a fresh optimizer) or "
       "checkpoint.resume: PATH"},
      {"checkpoint: {dir: c, resum: none}\n", "resum"},
      {"checkpoint: {memory_replicas: 1}\n",
       "checkpoint.memory_replicas: needs checkpoint.memory_interval"},
      {"checkpoint: {memory_interval: 1, memory_replicas: 2}\n", "checkpoint.memory_replicas"},
      {"checkpoint: {memory_interval: -1}\n", "checkpoint.memory_interval"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimalTrain) + c.yaml);
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.message)) << c.yaml;
  }
}

TEST(TrainJobSpecTest, ExampleGptElasticParses) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(SourceDir() + "/examples/gpt-elastic.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->elastic.enabled);
  EXPECT_EQ(spec->elastic.min_actors, 2);
  EXPECT_EQ(spec->elastic.max_actors, 4);
  EXPECT_EQ(spec->train.checkpoint.memory_interval, 1);  // memory steps: a fault loses no step
  EXPECT_EQ(spec->train.checkpoint.memory_replicas, 0);
  // On 3 free devices it runs dp 1 (tp 2); on 4, dp 2.
  EXPECT_EQ(ElasticLayout(*spec, 3)->dp, 1);
  EXPECT_EQ(ElasticLayout(*spec, 4)->dp, 2);
}

TEST(TrainJobSpecTest, ExampleGptShardedParses) {
  const std::string path = SourceDir() + "/examples/gpt-sharded.yaml";
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "gpt-sharded");
  EXPECT_EQ(spec->kind, JobKind::kTrain);
  EXPECT_EQ(spec->actors, 4);
  EXPECT_EQ(spec->devices, DeviceKind::kCpu);
  EXPECT_EQ(ResolveBackend(*spec), Backend::kShm);
  EXPECT_EQ(spec->parallel.tp, 2);
  EXPECT_EQ(spec->parallel.pp, 2);
  EXPECT_EQ(spec->parallel.dp, 1);
  EXPECT_EQ(spec->parallel.zero, 0);
  EXPECT_EQ(spec->parallel.micro_batch, 2);
  EXPECT_EQ(MicroBatchCount(spec->parallel, spec->train.batch), 4);
  EXPECT_EQ(spec->train.name, "gpt-sharded");
  EXPECT_EQ(spec->train.model.layers, 4);
  EXPECT_EQ(spec->train.model.heads, 4);
  EXPECT_EQ(spec->train.model.d_model, 64);
  EXPECT_EQ(spec->train.batch, 8);
  EXPECT_EQ(spec->train.steps, 200);
  EXPECT_TRUE(spec->train.data.path.empty());  // synthetic
  // checkpoint.dir is resolved against the working directory of whoever loads the file.
  EXPECT_EQ(spec->train.checkpoint.dir,
            (std::filesystem::current_path() / "checkpoints/gpt-sharded").string());
  EXPECT_TRUE(
      ValidateParallel(spec->train.model, spec->train.batch, spec->parallel, spec->actors).ok());
}

TEST(TrainJobSpecTest, MinimalTrainJobGetsDefaults) {
  absl::StatusOr<JobSpec> spec = Parse(kMinimalTrain);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind, JobKind::kTrain);
  EXPECT_EQ(spec->actors, 1);  // tp·pp·dp of the default layout
  EXPECT_EQ(spec->parallel.tp, 1);
  EXPECT_EQ(spec->parallel.pp, 1);
  EXPECT_EQ(spec->parallel.dp, 1);
  EXPECT_EQ(spec->parallel.zero, 0);
  EXPECT_EQ(spec->parallel.micro_batch, 0);  // batch / dp, resolved by MicroBatchSize
  EXPECT_EQ(MicroBatchSize(spec->parallel, spec->train.batch), 8);
  EXPECT_TRUE(spec->parallel.stage_layers.empty());
  EXPECT_EQ(spec->train.name, "gpt");
  EXPECT_EQ(spec->train.model.d_ff, 256);
  EXPECT_EQ(spec->train.model.vocab, 257);
  EXPECT_TRUE(spec->train.model.tied_embeddings);
  EXPECT_EQ(spec->train.seq_len, 64);
  EXPECT_EQ(spec->train.seed, 1u);
  EXPECT_EQ(spec->train.log_interval, 10);
  EXPECT_TRUE(spec->train.checkpoint.dir.empty());
  EXPECT_EQ(spec->train.checkpoint.interval, 0);
  EXPECT_TRUE(spec->train.data.path.empty());
  EXPECT_EQ(spec->train.data.synthetic_seed, 1u);
  const OptimizerSpec optimizer;
  EXPECT_EQ(spec->train.optimizer.lr, optimizer.lr);
  EXPECT_EQ(spec->train.optimizer.grad_clip, optimizer.grad_clip);
  EXPECT_EQ(spec->bootstrap_timeout, std::chrono::seconds(30));
}

TEST(TrainJobSpecTest, EveryFieldIsRead) {
  absl::StatusOr<JobSpec> spec = Parse(
      "name: big\n"
      "kind: train\n"
      "actors: 8\n"
      "devices: cuda\n"
      "backend: nccl\n"
      "bootstrap_timeout_s: 12\n"
      "run_timeout_s: 3600\n"
      "model:\n"
      "  layers: 6\n"
      "  heads: 8\n"
      "  d_model: 128\n"
      "  d_ff: 384\n"
      "  vocab: 300\n"
      "  max_seq_len: 128\n"
      "  tied_embeddings: false\n"
      "data:\n"
      "  path: corpus.txt\n"
      "optimizer:\n"
      "  lr: 1.0e-4\n"
      "  beta1: 0.8\n"
      "  beta2: 0.99\n"
      "  eps: 1.0e-6\n"
      "  weight_decay: 0.1\n"
      "  grad_clip: 0.5\n"
      "  warmup_steps: 7\n"
      "steps: 1000\n"
      "batch: 16\n"
      "micro_batch: 2\n"
      "seq_len: 96\n"
      "seed: 42\n"
      "checkpoint:\n"
      "  dir: ckpt/big\n"
      "  interval: 50\n"
      "log_interval: 5\n"
      "parallel:\n"
      "  tp: 2\n"
      "  pp: 2\n"
      "  dp: 2\n"
      "  zero: 1\n"
      "  stages: [4, 2]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "big");
  EXPECT_EQ(spec->actors, 8);
  EXPECT_EQ(spec->devices, DeviceKind::kCuda);
  EXPECT_EQ(spec->backend, Backend::kNccl);
  EXPECT_EQ(spec->bootstrap_timeout, std::chrono::seconds(12));
  EXPECT_EQ(spec->run_timeout, std::chrono::seconds(3600));
  const TrainSpec& t = spec->train;
  EXPECT_EQ(t.name, "big");
  EXPECT_EQ(t.model.layers, 6);
  EXPECT_EQ(t.model.heads, 8);
  EXPECT_EQ(t.model.d_model, 128);
  EXPECT_EQ(t.model.d_ff, 384);
  EXPECT_EQ(t.model.vocab, 300);
  EXPECT_EQ(t.model.max_seq_len, 128);
  EXPECT_FALSE(t.model.tied_embeddings);
  EXPECT_EQ(t.data.path, "corpus.txt");  // no PathBase: as written
  EXPECT_EQ(t.optimizer.lr, 1.0e-4);
  EXPECT_EQ(t.optimizer.beta1, 0.8);
  EXPECT_EQ(t.optimizer.beta2, 0.99);
  EXPECT_EQ(t.optimizer.eps, 1.0e-6);
  EXPECT_EQ(t.optimizer.weight_decay, 0.1);
  EXPECT_EQ(t.optimizer.grad_clip, 0.5);
  EXPECT_EQ(t.optimizer.warmup_steps, 7);
  EXPECT_EQ(t.steps, 1000);
  EXPECT_EQ(t.batch, 16);
  EXPECT_EQ(t.seq_len, 96);
  EXPECT_EQ(t.seed, 42u);
  EXPECT_EQ(t.checkpoint.dir, "ckpt/big");
  EXPECT_EQ(t.checkpoint.interval, 50);
  EXPECT_EQ(t.log_interval, 5);
  const ParallelSpec& p = spec->parallel;
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.pp, 2);
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.zero, 1);
  EXPECT_EQ(p.micro_batch, 2);
  EXPECT_THAT(p.stage_layers, ElementsAre(4, 2));
  EXPECT_EQ(p.world(), 8);
}

TEST(TrainJobSpecTest, SyntheticDataAndActorsEqualToTheLayout) {
  absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimalTrain) +
                                       "actors: 4\n"
                                       "data:\n"
                                       "  synthetic: {seed: 9, bytes: 64KiB}\n"
                                       "parallel: {tp: 2, dp: 2}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->actors, 4);
  EXPECT_EQ(spec->train.data.synthetic_seed, 9u);
  EXPECT_EQ(spec->train.data.synthetic_bytes, 64 << 10);
  EXPECT_EQ(MicroBatchSize(spec->parallel, spec->train.batch), 4);
}

TEST(TrainJobSpecTest, LayoutErrorsPointAtParallel) {
  // Block mapping: at its first key (line 11), as yaml_reader places a mapping's errors.
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel:\n  tp: 3\n"),
              HasSubstr("job.yaml:11:3: parallel: heads 4 is not divisible by tp 3: remainder 1"));
  // Flow mapping: at its '{'.
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: {tp: 8}\n"),
              HasSubstr("job.yaml:10:11: parallel: tp 8 is more than heads 4: 4 tensor-parallel "
                        "ranks would have no attention head"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: {pp: 5}\n"),
              HasSubstr("job.yaml:10:11: parallel: pp 5 is more than the model's 4 layers: 1 "
                        "pipeline stages would have no layer"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "actors: 4\nparallel: {tp: 2, pp: 2, dp: 2}\n"),
              HasSubstr("job.yaml:11:11: parallel: tp·pp·dp = 2·2·2 = 8 but the job has 4 "
                        "actors: 4 too many"));
  // Without a parallel key the layout is one rank; the error still names parallel.
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "actors: 4\n"),
              HasSubstr("job.yaml:1:1: parallel: tp·pp·dp = 1·1·1 = 1 but the job has 4 actors: "
                        "3 too few"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "micro_batch: 3\nparallel: {dp: 2}\n"),
              HasSubstr("job.yaml:11:11: parallel: batch 8 is not divisible by micro_batch·dp = "
                        "3·2 = 6: remainder 2"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "micro_batch: 8\nparallel: {dp: 2}\n"),
              HasSubstr("job.yaml:11:11: parallel: micro_batch 8 is more than batch/dp = 8/2 = 4"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: {dp: 3}\n"),
              HasSubstr("job.yaml:10:11: parallel: batch 8 is not divisible by dp 3: remainder 2"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: {dp: 16}\n"),
              HasSubstr("job.yaml:10:11: parallel: batch 8 is smaller than dp 16: 8 data-parallel "
                        "ranks would have no sequence"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: {tp: 50000, pp: 4, dp: 4}\n"),
              HasSubstr("job.yaml:10:11: parallel: tp·pp·dp = 50000·4·4 = 800000 is more than the "
                        "65536 actors a job may have"));
}

TEST(TrainJobSpecTest, ExampleGptAutoParses) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(SourceDir() + "/examples/gpt-auto.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind, JobKind::kTrain);
  EXPECT_TRUE(spec->parallel_auto);
  EXPECT_EQ(spec->actors, 0);
}

TEST(TrainJobSpecTest, ParallelAutoDefersTheLayout) {
  absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimalTrain) + "parallel: auto\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->parallel_auto);
  EXPECT_EQ(spec->actors, 0);  // every free device
  EXPECT_EQ(spec->parallel.world(), 1);
  EXPECT_EQ(spec->parallel.micro_batch, 0);

  // `actors` caps the devices; a layout needing more than the job's actors is not checked yet.
  spec = Parse(std::string(kMinimalTrain) + "actors: 3\nmicro_batch: 2\nparallel: auto\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->actors, 3);
  EXPECT_EQ(spec->parallel.micro_batch, 2);

  // What can be checked without a layout still is.
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "micro_batch: 16\nparallel: auto\n"),
              HasSubstr("job.yaml:10:14: micro_batch: micro_batch 16 is more than the batch of 8 "
                        "sequences"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "micro_batch: 3\nparallel: auto\n"),
              HasSubstr("job.yaml:10:14: micro_batch: batch 8 is not divisible by micro_batch 3: "
                        "remainder 2"));
  // Only the exact word: anything else is still "expected a mapping".
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: Auto\n"),
              HasSubstr("job.yaml:10:11: parallel: expected a mapping"));
}

TEST(TrainJobSpecTest, ApplyPlannedLayout) {
  absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimalTrain) + "actors: 4\nparallel: auto\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ParallelSpec plan;
  plan.tp = 2;
  plan.dp = 2;
  plan.zero = 1;
  plan.micro_batch = 2;
  plan.stage_layers = {4};
  JobSpec applied = *spec;
  ASSERT_TRUE(ApplyPlannedLayout(applied, plan).ok());
  EXPECT_EQ(applied.actors, 4);
  EXPECT_EQ(applied.parallel.world(), 4);
  EXPECT_EQ(applied.parallel.zero, 1);
  EXPECT_TRUE(applied.parallel_auto);

  // More ranks than the job's actors allow.
  ParallelSpec wide = plan;
  wide.pp = 2;
  wide.stage_layers = {2, 2};
  JobSpec refused = *spec;
  EXPECT_THAT(Message(ApplyPlannedLayout(refused, wide)),
              HasSubstr("the plan's tp·pp·dp = 8 ranks exceed the job's actors: 4"));
  EXPECT_EQ(refused.actors, 4);  // unchanged on error
  // A layout the model cannot take: ValidateParallel's message.
  ParallelSpec bad = plan;
  bad.tp = 3;
  bad.dp = 1;
  EXPECT_THAT(Message(ApplyPlannedLayout(refused, bad)), HasSubstr("heads"));

  // A fixed micro_batch must be kept.
  absl::StatusOr<JobSpec> fixed_micro =
      Parse(std::string(kMinimalTrain) + "micro_batch: 4\nparallel: auto\n");
  ASSERT_TRUE(fixed_micro.ok()) << fixed_micro.status();
  EXPECT_THAT(Message(ApplyPlannedLayout(*fixed_micro, plan)),
              HasSubstr("the plan's micro-batch 2 is not the job's micro_batch 4"));

  // A fixed layout takes only itself (what the coordinator sends its actors).
  absl::StatusOr<JobSpec> fixed =
      Parse(std::string(kMinimalTrain) + "micro_batch: 2\nparallel: {tp: 2, dp: 2, zero: 1}\n");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE(ApplyPlannedLayout(*fixed, fixed->parallel).ok());
  ParallelSpec other = fixed->parallel;
  other.zero = 2;
  EXPECT_THAT(Message(ApplyPlannedLayout(*fixed, other)),
              HasSubstr("only `parallel: auto` takes a planned one"));
}

TEST(TrainJobSpecTest, ParallelKeyErrors) {
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel: 4\n"),
              HasSubstr("job.yaml:10:11: parallel: expected a mapping with keys: tp, pp, dp, "
                        "zero, stages, schedule, virtual_stages, recompute; got '4'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel:\n"),
              HasSubstr("job.yaml:10:1: parallel: has no value"));
  const std::string unknown = ErrorOf(std::string(kMinimalTrain) + "parallel:\n  tensor: 2\n");
  EXPECT_THAT(unknown, HasSubstr("job.yaml:11:3: parallel.tensor: unknown key 'tensor' in "
                                 "parallel"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel:\n  tp: 0\n"),
              HasSubstr("job.yaml:11:7: parallel.tp: must be between 1 and 65536, got 0"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel:\n  zero: 4\n"),
              HasSubstr("job.yaml:11:9: parallel.zero: must be between 0 and 3, got 4"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "parallel:\n  dp: two\n"),
              HasSubstr("job.yaml:11:7: parallel.dp: expected an integer, got 'two'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "micro_batch: 0\n"),
              HasSubstr("job.yaml:10:14: micro_batch: must be between 1 and 1048576, got 0"));
}

TEST(TrainJobSpecTest, ScheduleAndRecomputationAreRead) {
  absl::StatusOr<JobSpec> plain = Parse(std::string(kMinimalTrain) + "parallel: {pp: 2}\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->parallel.schedule, PipelineScheduleKind::k1F1B);
  EXPECT_EQ(plain->parallel.virtual_stages, 1);
  EXPECT_EQ(plain->parallel.recompute, RecomputeMode::kNone);

  absl::StatusOr<JobSpec> spec = Parse(std::string(kMinimalTrain) +
                                       "micro_batch: 2\n"
                                       "parallel:\n"
                                       "  pp: 2\n"
                                       "  schedule: interleaved\n"
                                       "  virtual_stages: 2\n"
                                       "  recompute: selective\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.schedule, PipelineScheduleKind::kInterleaved);
  EXPECT_EQ(spec->parallel.virtual_stages, 2);
  EXPECT_EQ(spec->parallel.recompute, RecomputeMode::kSelective);
  EXPECT_EQ(spec->actors, 2);

  // Interleaved alone is two chunks per stage; recompute goes with any schedule.
  spec = Parse(std::string(kMinimalTrain) +
               "micro_batch: 1\nparallel: {pp: 2, schedule: interleaved, recompute: full}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.virtual_stages, 2);
  EXPECT_EQ(spec->parallel.recompute, RecomputeMode::kFull);
  spec = Parse(std::string(kMinimalTrain) + "parallel: {recompute: full}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.schedule, PipelineScheduleKind::k1F1B);
  EXPECT_EQ(spec->parallel.recompute, RecomputeMode::kFull);

  // The actors take the coordinator's layout only with the same schedule and recomputation.
  ParallelSpec other = plain->parallel;
  other.recompute = RecomputeMode::kFull;
  JobSpec fixed = *plain;
  EXPECT_TRUE(ApplyPlannedLayout(fixed, plain->parallel).ok());
  EXPECT_THAT(Message(ApplyPlannedLayout(fixed, other)),
              HasSubstr("only `parallel: auto` takes a planned one"));
  other = spec->parallel;
  other.virtual_stages = 4;
  fixed = *spec;
  EXPECT_FALSE(ApplyPlannedLayout(fixed, other).ok());
}

// Bad input: a schedule or recomputation the engine cannot run with the rest of the spec is
// refused at submit, naming the keys and the values.
TEST(TrainJobSpecTest, ScheduleErrorsNameTheKeysAndValues) {
  const std::string train = kMinimalTrain;
  EXPECT_THAT(ErrorOf(train + "parallel: {pp: 2, schedule: zb}\n"),
              HasSubstr("job.yaml:10:29: parallel.schedule: expected one of '1f1b', "
                        "'interleaved', got 'zb'"));
  EXPECT_THAT(ErrorOf(train + "parallel: {recompute: some}\n"),
              HasSubstr("job.yaml:10:23: parallel.recompute: expected one of 'none', "
                        "'selective', 'full', got 'some'"));
  EXPECT_THAT(ErrorOf(train + "parallel: {pp: 2, schedule: interleaved, virtual_stages: 0}\n"),
              HasSubstr("parallel.virtual_stages: must be between 1 and 1024, got 0"));
  // 4 layers do not cut into pp·virtual_stages = 2·4 = 8 chunks.
  EXPECT_THAT(ErrorOf(train + "parallel: {pp: 2, schedule: interleaved, virtual_stages: 4}\n"),
              HasSubstr("job.yaml:10:11: parallel: schedule: interleaved cuts the 4 layers into "
                        "pp·virtual_stages = 2·4 = 8 equal chunks, but 4 is not divisible by 8: "
                        "remainder 4"));
  // Micro-batches per step must come in groups of pp.
  EXPECT_THAT(
      ErrorOf(std::string(kMinimalTrain)
                  .replace(std::string(kMinimalTrain).find("batch: 8"), 8, "batch: 6") +
              "micro_batch: 2\nparallel: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"),
      HasSubstr("job.yaml:11:11: parallel: schedule: interleaved runs micro-batches in groups of "
                "pp 2, but a step has 3 micro-batches (batch 6 / dp 1 / micro_batch 2)"));
  EXPECT_THAT(
      ErrorOf(std::string(kMinimalTrain)
                  .replace(std::string(kMinimalTrain).find("batch: 8"), 8, "batch: 3") +
              "parallel: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"),
      HasSubstr("parallel: schedule: interleaved runs micro-batches in groups of pp 2, but a "
                "step has 1 micro-batches (batch 3 / dp 1 / micro_batch 3)"));
  EXPECT_THAT(ErrorOf(train + "parallel: {pp: 2, virtual_stages: 2}\n"),
              HasSubstr("job.yaml:10:11: parallel: virtual_stages 2 needs schedule: interleaved"));
  EXPECT_THAT(ErrorOf(train + "parallel: {schedule: interleaved}\n"),
              HasSubstr("parallel: schedule: interleaved needs pp >= 2, got pp 1"));
  EXPECT_THAT(ErrorOf(train + "parallel: {pp: 2, schedule: interleaved, virtual_stages: 1}\n"),
              HasSubstr("parallel: schedule: interleaved needs virtual_stages >= 2, got 1"));
  EXPECT_THAT(ErrorOf(train + "parallel: {pp: 2, schedule: interleaved, stages: [3, 1]}\n"),
              HasSubstr("parallel: stages cannot be given with schedule: interleaved"));
}

TEST(TrainJobSpecTest, StageListErrorsPointIntoTheList) {
  const std::string prefix = std::string(kMinimalTrain) + "parallel:\n  pp: 2\n";
  absl::StatusOr<JobSpec> good = Parse(prefix + "  stages: [3, 1]\n");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_THAT(good->parallel.stage_layers, ElementsAre(3, 1));
  EXPECT_THAT(ErrorOf(prefix + "  stages: [3, x]\n"),
              HasSubstr("job.yaml:12:15: parallel.stages[1]: expected an integer (the stage's "
                        "layers), got 'x'"));
  EXPECT_THAT(ErrorOf(prefix + "  stages: [4, 0]\n"),
              HasSubstr("job.yaml:12:15: parallel.stages[1]: must be at least 1 (every pipeline "
                        "stage needs a layer), got 0"));
  EXPECT_THAT(ErrorOf(prefix + "  stages:\n    - 2\n    - -1\n"),
              HasSubstr("job.yaml:14:7: parallel.stages[1]: must be at least 1"));
  EXPECT_THAT(ErrorOf(prefix + "  stages: [2, 3]\n"),
              HasSubstr("job.yaml:12:11: parallel.stages: stages add up to 5 layers but the model "
                        "has 4: 1 too many"));
  EXPECT_THAT(ErrorOf(prefix + "  stages: [1, 1, 2]\n"),
              HasSubstr("job.yaml:12:11: parallel.stages: stages lists 3 stages but pp is 2: 1 "
                        "too many"));
  EXPECT_THAT(ErrorOf(prefix + "  stages: []\n"),
              HasSubstr("job.yaml:12:11: parallel.stages: lists no stage but pp is 2; leave "
                        "stages out to split the 4 layers evenly"));
  EXPECT_THAT(ErrorOf(prefix + "  stages: 2\n"), HasSubstr("parallel.stages: expected a list"));
}

TEST(TrainJobSpecTest, SectionErrorsComeFromTheTrainSpecParsers) {
  EXPECT_THAT(ErrorOf("name: gpt\nkind: train\nsteps: 10\nbatch: 8\n"),
              HasSubstr("job.yaml:1:1: model: required key 'model' is missing"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "seq_len: 65\n"),
              HasSubstr("job.yaml:10:10: seq_len: seq_len 65 is past the position table "
                        "(model.max_seq_len 64)"));
  EXPECT_THAT(ErrorOf("name: gpt\nkind: train\nmodel:\n  layers: 2\n  heads: 3\n  d_model: 64\n"
                      "  max_seq_len: 8\nsteps: 1\nbatch: 1\n"),
              HasSubstr("job.yaml:6:12: model.d_model: d_model 64 is not divisible by heads 3"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "optimizer:\n  learning_rate: 1\n"),
              HasSubstr("job.yaml:11:3: optimizer.learning_rate: unknown key"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "data:\n  path: a.txt\n  synthetic: {}\n"),
              HasSubstr("data.synthetic: give either path or synthetic, not both"));
  EXPECT_THAT(ErrorOf("name: gpt\nkind: train\nmodel:\n  layers: 2\n  heads: 2\n  d_model: 64\n"
                      "  max_seq_len: 8\nbatch: 1\n"),
              HasSubstr("steps: required key 'steps' is missing"));
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "actors: 0\n"),
              HasSubstr("job.yaml:10:9: actors: must be between 1 and 65536, got 0"));
}

TEST(TrainJobSpecTest, KeysOfTheOtherKindAreRefused) {
  EXPECT_THAT(ErrorOf(std::string(kMinimalTrain) + "comm_check:\n  iterations: 2\n"),
              HasSubstr("job.yaml:11:3: comm_check: only allowed with kind: comm-check, not "
                        "'train'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "steps: 10\n"),
              HasSubstr("job.yaml:4:8: steps: only allowed with kind: train, not 'comm-check'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "parallel: {tp: 2}\n"),
              HasSubstr("job.yaml:4:11: parallel: only allowed with kind: train, not "
                        "'comm-check'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "micro_batch: 2\n"),
              HasSubstr("micro_batch: only allowed with kind: train"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "model:\n  layers: 2\n"),
              HasSubstr("job.yaml:5:3: model: only allowed with kind: train"));
  // comm-check still needs its actors.
  EXPECT_THAT(ErrorOf("name: check\nkind: comm-check\n"),
              HasSubstr("actors: required key 'actors' is missing"));
}

TEST(TrainJobSpecTest, RelativePathsResolveAgainstTheirBases) {
  const std::string text = std::string(kMinimalTrain) +
                           "data:\n  path: text/corpus.txt\n"
                           "checkpoint:\n  dir: ckpt/run\n";
  // Default: as written.
  absl::StatusOr<JobSpec> plain = Parse(text);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->train.data.path, "text/corpus.txt");
  EXPECT_EQ(plain->train.checkpoint.dir, "ckpt/run");

  PathBase base;
  base.spec_dir = "/specs/jobs";
  base.work_dir = "/home/me/work";
  absl::StatusOr<JobSpec> resolved = ParseJobSpec(text, "job.yaml", base);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->train.data.path, "/specs/jobs/text/corpus.txt");
  EXPECT_EQ(resolved->train.checkpoint.dir, "/home/me/work/ckpt/run");

  // Only one base given: the other path stays as written.
  absl::StatusOr<JobSpec> half = ParseJobSpec(text, "job.yaml", PathBase{.spec_dir = "/s"});
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(half->train.data.path, "/s/text/corpus.txt");
  EXPECT_EQ(half->train.checkpoint.dir, "ckpt/run");

  // Absolute paths are kept.
  absl::StatusOr<JobSpec> absolute = ParseJobSpec(
      std::string(kMinimalTrain) + "data:\n  path: /data/c.txt\ncheckpoint:\n  dir: /ckpt\n",
      "job.yaml", base);
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_EQ(absolute->train.data.path, "/data/c.txt");
  EXPECT_EQ(absolute->train.checkpoint.dir, "/ckpt");
}

TEST(TrainJobSpecTest, LoadJobSpecFileResolvesAgainstFileAndWorkingDirectory) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "train-job-spec";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "job.yaml").string();
  {
    FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr);
    std::fputs((std::string(kMinimalTrain) + "data:\n  path: corpus.txt\n"
                                             "checkpoint:\n  dir: ckpt\n")
                   .c_str(),
               file);
    std::fclose(file);
  }
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::filesystem::path absolute_dir = std::filesystem::absolute(dir).lexically_normal();
  EXPECT_EQ(std::filesystem::path(spec->train.data.path), absolute_dir / "corpus.txt");
  EXPECT_EQ(spec->train.checkpoint.dir, (std::filesystem::current_path() / "ckpt").string());
  std::filesystem::remove_all(dir);
}

TEST(CommCheckSizesTest, PowersOfFourPlusMaxAndUnevenCounts) {
  CommCheckSpec spec;
  spec.min_bytes = 4;
  spec.max_bytes = 1 << 20;
  EXPECT_THAT(CommCheckSizesBytes(spec),
              ElementsAre(4, 12 /*3 elements*/, 16, 64, 256, 1024, 4000 /*1000 elements*/, 4096,
                          16384, 65536, 262144, 262148 /*65537 elements*/, 1 << 20));
  spec.uneven_sizes = false;
  EXPECT_THAT(CommCheckSizesBytes(spec),
              ElementsAre(4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20));
}

TEST(CommCheckSizesTest, MaxThatIsNotAPowerOfFourIsIncluded) {
  CommCheckSpec spec;
  spec.min_bytes = 8;
  spec.max_bytes = 100;
  spec.uneven_sizes = false;
  EXPECT_THAT(CommCheckSizesBytes(spec), ElementsAre(8, 32, 100));
  spec.min_bytes = spec.max_bytes = 64;
  EXPECT_THAT(CommCheckSizesBytes(spec), ElementsAre(64));
}

TEST(CommCheckSizesTest, DefaultsAreSortedUniqueWholeElements) {
  const std::vector<int64_t> sizes = CommCheckSizesBytes(CommCheckSpec{});
  ASSERT_FALSE(sizes.empty());
  EXPECT_EQ(sizes.front(), 4);
  EXPECT_EQ(sizes.back(), 64 << 20);
  EXPECT_TRUE(std::is_sorted(sizes.begin(), sizes.end()));
  EXPECT_EQ(std::adjacent_find(sizes.begin(), sizes.end()), sizes.end());
  for (const int64_t bytes : sizes) EXPECT_EQ(bytes % 4, 0) << bytes;
  // 4194305 elements (16 MiB + 4 bytes) fits under the default 64 MiB.
  EXPECT_NE(std::find(sizes.begin(), sizes.end(), int64_t{4194305} * 4), sizes.end());
}

TEST(CommCheckSizesTest, UnvalidatedSpecDoesNotLoop) {
  CommCheckSpec spec;
  spec.min_bytes = 0;
  spec.max_bytes = 2;
  EXPECT_THAT(CommCheckSizesBytes(spec), ElementsAre(4));
}

}  // namespace
}  // namespace shardline::placement

namespace shardline::placement {
namespace {

using ::testing::HasSubstr;

// kMinimalTrain with tp 2 and an elastic section (line 11 on).
std::string ElasticTrain(const std::string& elastic, const std::string& batch = "8") {
  std::string text =
      "name: gpt\nkind: train\nmodel:\n  layers: 4\n  heads: 4\n  d_model: 64\n"
      "  max_seq_len: 64\nsteps: 10\nbatch: " +
      batch + "\nparallel: {tp: 2, dp: 2}\n";
  return text + elastic;
}

TEST(ElasticJobSpecTest, DefaultsFollowTheLayoutAndEveryKeyIsRead) {
  absl::StatusOr<JobSpec> plain = ParseJobSpec(ElasticTrain(""), "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->elastic.enabled);  // no `elastic`: the first fault fails the job

  absl::StatusOr<JobSpec> spec = ParseJobSpec(ElasticTrain("elastic: {}\n"), "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->elastic.enabled);
  EXPECT_EQ(spec->elastic.min_actors, 2);  // tp·pp
  EXPECT_EQ(spec->elastic.max_actors, 4);  // the spec's own world
  absl::StatusOr<JobSpec> full = ParseJobSpec(
      ElasticTrain("elastic: {min_actors: 2, max_actors: 8, max_restarts: 3, restart_window_s: 60, "
                   "wait_timeout_s: 30, progress_timeout_s: 2.5}\n"),
      "job.yaml");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->elastic.max_actors, 8);
  EXPECT_EQ(full->elastic.max_restarts, 3);
  EXPECT_EQ(full->elastic.restart_window, std::chrono::seconds(60));
  EXPECT_EQ(full->elastic.wait_timeout, std::chrono::seconds(30));
  EXPECT_EQ(full->elastic.progress_timeout, std::chrono::milliseconds(2500));
}

TEST(ElasticJobSpecTest, BadSectionsNameTheKeysAndValues) {
  const auto error = [](const std::string& text) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "job.yaml");
    return spec.ok() ? std::string("(parsed)") : std::string(spec.status().message());
  };
  EXPECT_THAT(error(ElasticTrain("elastic: {min_actors: 6, max_actors: 4}\n")),
              HasSubstr("job.yaml:11:38: elastic.max_actors: min_actors 6 is more than "
                        "max_actors 4"));
  EXPECT_THAT(error(ElasticTrain("elastic: {min_actors: 1}\n")),
              HasSubstr("elastic.min_actors: min_actors 1 is below tp·pp = 2·1 = 2"));
  // Six actors with tp 2 is dp 3, which does not divide a batch of 10.
  EXPECT_THAT(error(ElasticTrain("elastic: {min_actors: 6, max_actors: 6}\n", "10")),
              HasSubstr("elastic: no dp gives a world in min_actors..max_actors = 6..6 with "
                        "tp·pp = 2 that divides the batch of 10"));
  EXPECT_THAT(error(ElasticTrain("elastic: {max_restarts: -1}\n")),
              HasSubstr("elastic.max_restarts"));
  EXPECT_THAT(error(ElasticTrain("elastic: {min: 2}\n")), HasSubstr("unknown key 'min'"));
}

TEST(ElasticJobSpecTest, TheLayoutTakesTheLargestDpTheDevicesHoldThatDividesTheBatch) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      ElasticTrain("elastic: {min_actors: 2, max_actors: 8}\n", "12"), "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto dp_for = [&](int devices) {
    absl::StatusOr<ParallelSpec> layout = ElasticLayout(*spec, devices);
    return layout.ok() ? layout->dp : -1;
  };
  EXPECT_EQ(dp_for(1), -1);  // below min_actors
  EXPECT_EQ(dp_for(2), 1);
  EXPECT_EQ(dp_for(5), 2);
  EXPECT_EQ(dp_for(7), 3);   // batch 12 / dp 3
  EXPECT_EQ(dp_for(8), 4);
  EXPECT_EQ(dp_for(100), 4);  // max_actors 8
  absl::StatusOr<ParallelSpec> none = ElasticLayout(*spec, 1);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("1 devices give no layout of tp·pp = 2 with 2 to 8 actors"));

  // The actor applies the generation's dp; tp, pp and zero stay the spec's.
  JobSpec actor_side = *spec;
  ParallelSpec layout = spec->parallel;
  layout.dp = 3;
  ASSERT_TRUE(ApplyPlannedLayout(actor_side, layout).ok());
  EXPECT_EQ(actor_side.actors, 6);
  layout.tp = 1;
  layout.dp = 6;
  EXPECT_THAT(std::string(ApplyPlannedLayout(actor_side, layout).message()),
              HasSubstr("an elastic job takes only another dp"));
  // Without `elastic` the layout is the spec's, dp included.
  absl::StatusOr<JobSpec> fixed = ParseJobSpec(ElasticTrain(""), "job.yaml");
  ParallelSpec other = fixed->parallel;
  other.dp = 1;
  EXPECT_FALSE(ApplyPlannedLayout(*fixed, other).ok());
}

}  // namespace
}  // namespace shardline::placement

namespace shardline::placement {
namespace {

// A valid serve spec that each test changes in one place.
constexpr char kServe[] =
    "name: svc\n"
    "kind: serve\n"
    "checkpoint: models/gpt2\n"
    "parallel: {tp: 2, pp: 2}\n";

TEST(ServeJobSpecTest, ExampleParsesAndEveryKeyIsRead) {
  absl::StatusOr<JobSpec> example = LoadJobSpecFile(SourceDir() + "/examples/serve.yaml");
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_EQ(example->kind, JobKind::kServe);
  EXPECT_EQ(example->actors, 2);
  EXPECT_TRUE(example->elastic.enabled);

  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      std::string(kServe) +
          "tokenizer: gpt2-files\nhf_heads: 4\nmodel_name: gpt2\nlisten: 0.0.0.0:9000\n"
          "api_key_file: serve.key\n"
          "limits: {max_running: 16, max_tokens_per_step: 512, max_queue: 3, block_size: 32, "
          "kv_cache: 64MiB}\n"
          "elastic: {max_restarts: 2, restart_window_s: 60, wait_timeout_s: 5}\n",
      "job.yaml", PathBase{.spec_dir = "/specs", .work_dir = "/work"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ServeSpec& serve = spec->serve;
  EXPECT_EQ(spec->actors, 4);
  EXPECT_EQ(spec->parallel.tp, 2);
  EXPECT_EQ(spec->parallel.pp, 2);
  EXPECT_EQ(spec->parallel.dp, 1);
  // What is read by name from the submitter's folder, and what ships with the spec.
  EXPECT_EQ(serve.checkpoint, "/work/models/gpt2");
  EXPECT_EQ(serve.tokenizer, "/specs/gpt2-files");
  EXPECT_EQ(serve.api_key_file, "/specs/serve.key");
  EXPECT_EQ(serve.hf_heads, 4);
  EXPECT_EQ(serve.model_name, "gpt2");
  EXPECT_EQ(serve.listen, "0.0.0.0:9000");
  EXPECT_EQ(serve.limits.max_running, 16);
  EXPECT_EQ(serve.limits.max_tokens_per_step, 512);
  EXPECT_EQ(serve.limits.max_queue, 3);
  EXPECT_EQ(serve.limits.block_size, 32);
  EXPECT_EQ(serve.limits.kv_cache_bytes, int64_t{64} << 20);
  EXPECT_TRUE(spec->elastic.enabled);
  EXPECT_EQ(spec->elastic.min_actors, 4);
  EXPECT_EQ(spec->elastic.max_actors, 4);
  EXPECT_EQ(spec->elastic.max_restarts, 2);
  EXPECT_EQ(spec->elastic.wait_timeout, std::chrono::seconds(5));
}

TEST(ServeJobSpecTest, DefaultsServeOnOneActorUntilCancelled) {
  absl::StatusOr<JobSpec> spec = Parse("name: svc\nkind: serve\ncheckpoint: m\ntokenizer: bytes\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->actors, 1);
  EXPECT_EQ(spec->serve.tokenizer, "bytes");  // a name, not a path
  EXPECT_EQ(spec->serve.listen, "127.0.0.1:8000");
  EXPECT_EQ(spec->serve.limits.max_running, 8);
  EXPECT_EQ(spec->serve.limits.kv_cache_bytes, 0);
  EXPECT_FALSE(spec->elastic.enabled);
  // No run_timeout_s: a service has no end of its own (a year).
  EXPECT_GE(spec->run_timeout, std::chrono::hours(24 * 365));
  spec = Parse("name: svc\nkind: serve\ncheckpoint: m\nrun_timeout_s: 60\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->run_timeout, std::chrono::seconds(60));
}

TEST(ServeJobSpecTest, BadSpecsNameTheKeyAndTheValue) {
  const std::string base = kServe;
  EXPECT_THAT(ErrorOf("name: svc\nkind: serve\n"), HasSubstr("checkpoint"));
  EXPECT_THAT(ErrorOf(base + "listen: nowhere\n"),
              HasSubstr("job.yaml:5:9: listen: 'nowhere' is not HOST:PORT"));
  EXPECT_THAT(ErrorOf(base + "listen: 'h:70000'\n"),
              HasSubstr("the port '70000' is not a number in 0..65535"));
  EXPECT_THAT(ErrorOf(base + "actors: 3\n"), HasSubstr("actors: must equal tp·pp = 4"));
  EXPECT_THAT(ErrorOf("name: svc\nkind: serve\ncheckpoint: m\nparallel: {tp: 2, dp: 2}\n"),
              HasSubstr("unknown key 'dp'"));
  EXPECT_THAT(ErrorOf(base + "limits: {max_running: 8, max_tokens_per_step: 4}\n"),
              HasSubstr("max_tokens_per_step 4 is less than max_running 8"));
  EXPECT_THAT(ErrorOf(base + "limits: {kv_cache: lots}\n"), HasSubstr("limits.kv_cache"));
  EXPECT_THAT(ErrorOf(base + "api_key: a\napi_key_file: k\n"),
              HasSubstr("give api_key or api_key_file, not both"));
  EXPECT_THAT(ErrorOf(base + "elastic: {min_actors: 2}\n"), HasSubstr("unknown key 'min_actors'"));
  // A serving group exchanges host memory, on GPUs too.
  EXPECT_THAT(ErrorOf(base + "devices: cuda\nbackend: nccl\n"),
              HasSubstr("backend: a serve job's ranks exchange host memory: use 'shm', 'gloo' or "
                        "'auto', not 'nccl'"));
  absl::StatusOr<JobSpec> on_gpus = Parse(base + "devices: cuda\n");
  ASSERT_TRUE(on_gpus.ok()) << on_gpus.status();
  EXPECT_EQ(on_gpus->devices, DeviceKind::kCuda);
  EXPECT_EQ(ResolveBackend(*on_gpus), Backend::kShm);
  EXPECT_TRUE(Parse(base + "devices: cuda\nbackend: shm\n").ok());
  // The other kinds' keys, each way.
  EXPECT_THAT(ErrorOf(base + "steps: 10\n"),
              HasSubstr("steps: only allowed with kind: train, not 'serve'"));
  EXPECT_THAT(ErrorOf(base + "comm_check: {}\n"),
              HasSubstr("comm_check: only allowed with kind: comm-check, not 'serve'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "listen: 'h:1'\n"),
              HasSubstr("listen: only allowed with kind: serve, not 'comm-check'"));
}

TEST(ServeJobSpecTest, AutoLeavesTheLayoutToTheCoordinator) {
  absl::StatusOr<JobSpec> spec =
      Parse("name: svc\nkind: serve\ncheckpoint: m\nparallel: auto\nactors: 4\nelastic: {}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->parallel_auto);
  EXPECT_EQ(spec->actors, 4);  // the most devices the plan may take
  EXPECT_EQ(spec->parallel.world(), 1);
  EXPECT_EQ(spec->elastic.max_actors, 4);
}

TEST(ServeJobSpecTest, HostPortSplits) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(ParseHostPort("127.0.0.1:0", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 0);
  ASSERT_TRUE(ParseHostPort("[::1]:8000", &host, &port).ok());
  EXPECT_EQ(host, "[::1]");
  EXPECT_EQ(port, 8000);
  for (const char* bad : {"", ":80", "host:", "host", "h:+1", "h:-1", "h:65536", "h:123456"}) {
    EXPECT_FALSE(ParseHostPort(bad, &host, &port).ok()) << bad;
  }
}

}  // namespace
}  // namespace shardline::placement
