#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "placement/job_spec.h"

namespace shardline::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_DIR_DEFAULT;
}

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
  EXPECT_EQ(ResolveBackend(*spec), Backend::kGloo);
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
  EXPECT_THAT(ErrorOf("name: check\nkind: train\nactors: 2\n"),
              HasSubstr("job.yaml:2:7: kind: expected one of 'comm-check', got 'train'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "devices: gpu\n"),
              HasSubstr("devices: expected one of 'cpu', 'cuda', got 'gpu'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "backend: ncl\n"),
              HasSubstr("backend: expected one of 'auto', 'gloo', 'nccl', got 'ncl'; did you "
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
  EXPECT_EQ(ResolveBackend(spec), Backend::kGloo);
  spec.devices = DeviceKind::kCuda;
  EXPECT_EQ(ResolveBackend(spec), Backend::kNccl);
  spec.backend = Backend::kGloo;
  EXPECT_EQ(ResolveBackend(spec), Backend::kGloo);
  absl::StatusOr<JobSpec> gloo_on_cuda =
      Parse(std::string(kMinimal) + "devices: cuda\nbackend: gloo\n");
  ASSERT_TRUE(gloo_on_cuda.ok()) << gloo_on_cuda.status();
}

TEST(JobSpecTest, NamesMatchYamlSpellings) {
  EXPECT_EQ(JobKindName(JobKind::kCommCheck), "comm-check");
  EXPECT_EQ(DeviceKindName(DeviceKind::kCpu), "cpu");
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
  EXPECT_EQ(BackendName(Backend::kAuto), "auto");
  EXPECT_EQ(BackendName(Backend::kGloo), "gloo");
  EXPECT_EQ(BackendName(Backend::kNccl), "nccl");
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
