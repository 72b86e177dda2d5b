#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/status_macros.h"
#include "checkpoint/manifest.h"

namespace shardline::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

// Two tensor-parallel ranks: "h.0.fc.w" (8, 4) split by rows, "h.0.fc_proj.b" (4) replicated,
// with the train and plan sections a writer fills in.
Manifest TwoRanks() {
  Manifest manifest;
  manifest.step = 100;
  manifest.world_size = 2;
  manifest.metadata["n_layer"] = "1";
  manifest.train.seed = 7;
  manifest.train.batch = 8;
  manifest.train.seq_len = 16;
  manifest.train.data.source = "file";
  manifest.train.data.path = "/data/text.txt";
  manifest.train.data.tokens = 12345;
  manifest.train.data.xxh3 = 0xfedcba9876543210ull;
  manifest.train.steps = 300;
  manifest.train.optimizer.lr = 3e-4;
  manifest.train.optimizer.warmup_steps = 10;
  manifest.plan.tp = 2;
  manifest.plan.micro_batch = 4;
  manifest.plan.stage_layers = {1};
  manifest.files["rank-0.safetensors"] = {0, 1000, 0x0123456789abcdefull};
  manifest.files["rank-1.safetensors"] = {1, 1000, 42};
  ManifestTensor& fc = manifest.tensors["h.0.fc.w"];
  fc.global_shape = {8, 4};
  fc.shards = {{0, "rank-0.safetensors", "h.0.fc.w", {0, 0}, {4, 4}, 1},
               {1, "rank-1.safetensors", "h.0.fc.w", {4, 0}, {4, 4}, 2}};
  ManifestTensor& bias = manifest.tensors["h.0.fc_proj.b"];
  bias.global_shape = {4};
  bias.shards = {{0, "rank-0.safetensors", "h.0.fc_proj.b", {0}, {4}, 3},
                 {1, "rank-1.safetensors", "h.0.fc_proj.b", {0}, {4}, 4}};
  return manifest;
}

TEST(ManifestTest, RoundTripsThroughAFileWithEverySection) {
  std::string dir = ::testing::TempDir() + "/manifest_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const Manifest manifest = TwoRanks();
  ASSERT_TRUE(WriteManifest(DefaultFileSystem(), dir + "/manifest.json", manifest).ok());
  absl::StatusOr<Manifest> read = ReadManifest(dir + "/manifest.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, manifest);
  // The synthetic corpus is described by its seed and size instead of a path.
  Manifest synthetic = TwoRanks();
  synthetic.train.data = {"synthetic", "", 3, 65536, 65536, 99};
  absl::StatusOr<Manifest> parsed = ParseManifest(ManifestToJson(synthetic), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->train.data, synthetic.train.data);
  // Checksums are 16 hex digits in the file.
  EXPECT_THAT(ManifestToJson(manifest), HasSubstr("\"xxh3_64\": \"0123456789abcdef\""));
}

TEST(ManifestTest, ThePlanKeepsItsScheduleAndRecomputationAndOldManifestsReadAsBefore) {
  Manifest interleaved = TwoRanks();
  interleaved.plan.schedule = "interleaved";
  interleaved.plan.virtual_stages = 2;
  interleaved.plan.recompute = "selective";
  const std::string json = ManifestToJson(interleaved);
  EXPECT_THAT(json, HasSubstr("\"schedule\": \"interleaved\""));
  absl::StatusOr<Manifest> parsed = ParseManifest(json, "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->plan, interleaved.plan);
  EXPECT_EQ(PlanSummary(parsed->plan),
            "tp 2 · pp 1 · dp 1 · ZeRO 0 · interleaved ×2 · recompute selective (cpu, fp32)");

  // A manifest written before the three keys: 1F1B, one chunk, no recomputation.
  std::string old = ManifestToJson(TwoRanks());
  for (const std::string key : {",\n  \"schedule\": \"1f1b\"", ",\n  \"virtual_stages\": 1",
                                ",\n  \"recompute\": \"none\""}) {
    const size_t at = old.find(key);
    ASSERT_NE(at, std::string::npos) << key << " in\n" << old;
    old.erase(at, key.size());
  }
  ASSERT_EQ(old.find("recompute"), std::string::npos);
  parsed = ParseManifest(old, "old.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->plan.schedule, "1f1b");
  EXPECT_EQ(parsed->plan.virtual_stages, 1);
  EXPECT_EQ(parsed->plan.recompute, "none");
  EXPECT_EQ(parsed->plan, TwoRanks().plan);
  EXPECT_EQ(PlanSummary(parsed->plan), "tp 2 · pp 1 · dp 1 · ZeRO 0 (cpu, fp32)");

  // A wrong type is an error naming the plan.
  std::string bad = ManifestToJson(interleaved);
  bad.replace(bad.find("\"virtual_stages\": 2"), 19, "\"virtual_stages\": 2.5");
  EXPECT_THAT(ParseManifest(bad, "bad.json").status().message(), HasSubstr("in plan"));
}

TEST(ManifestTest, FilesMustBeListedNamedInsideTheStepAndOfTheirRank) {
  Manifest unlisted = TwoRanks();
  unlisted.files.erase("rank-1.safetensors");
  EXPECT_THAT(Message(ValidateManifest(unlisted, "m.json")),
              AllOf(HasSubstr("tensor 'h.0.fc.w'"), HasSubstr("rank-1.safetensors"),
                    HasSubstr("not among the manifest's files")));
  Manifest other_rank = TwoRanks();
  other_rank.files["rank-1.safetensors"].rank = 0;
  EXPECT_THAT(Message(ValidateManifest(other_rank, "m.json")),
              HasSubstr("the file belongs to rank 0"));
  for (const std::string bad : {"../rank-1.safetensors", "/tmp/rank-1.safetensors"}) {
    Manifest escape = TwoRanks();
    escape.files[bad] = {1, 10, 0};
    EXPECT_THAT(Message(ValidateManifest(escape, "m.json")),
                AllOf(HasSubstr(bad), HasSubstr("not a name inside the step's folder")))
        << bad;
  }
}

TEST(ManifestTest, OtherVersionsAndBadChecksumsAreRefused) {
  std::string text = ManifestToJson(TwoRanks());
  std::string v1 = text;
  v1.replace(v1.find("\"version\": 2"), 12, "\"version\": 1");
  EXPECT_THAT(Message(ParseManifest(v1, "m.json").status()),
              AllOf(HasSubstr("m.json"), HasSubstr("version 1, expected 2")));
  std::string checksum = text;
  checksum.replace(checksum.find("0123456789abcdef"), 16, "0123456789abcdeg");
  EXPECT_THAT(Message(ParseManifest(checksum, "m.json").status()),
              AllOf(HasSubstr("file 'rank-0.safetensors'"), HasSubstr("not a checksum")));
  std::string source = text;
  source.replace(source.find("\"file\","), 7, "\"tape\",");
  EXPECT_THAT(Message(ParseManifest(source, "m.json").status()),
              AllOf(HasSubstr("in train"), HasSubstr("neither synthetic nor file")));
}

TEST(ManifestTest, OptimizerStateIsWholeOrAbsent) {
  Manifest manifest = TwoRanks();
  EXPECT_FALSE(HasOptimizerState(manifest));
  for (const std::string name : {"h.0.fc.w", "h.0.fc_proj.b"}) {
    for (const StateKind kind : {StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      manifest.tensors[StateTensorName(kind, name)] = manifest.tensors.at(name);
    }
  }
  EXPECT_TRUE(ValidateManifest(manifest, "m.json").ok());
  EXPECT_TRUE(HasOptimizerState(manifest));
  manifest.tensors.erase("optim.exp_avg_sq.h.0.fc_proj.b");
  EXPECT_FALSE(HasOptimizerState(manifest));
  EXPECT_EQ(ParseStateTensorName("optim.exp_avg_sq.h.0.fc.w").kind, StateKind::kExpAvgSq);
  EXPECT_EQ(ParseStateTensorName("optim.exp_avg_sq.h.0.fc.w").param, "h.0.fc.w");
  EXPECT_EQ(ParseStateTensorName("optim.exp_avg.wte").kind, StateKind::kExpAvg);
  EXPECT_EQ(ParseStateTensorName("wte").kind, StateKind::kParam);
}

TEST(ManifestTest, PartialOverlapIsAnError) {
  Manifest manifest = TwoRanks();
  manifest.tensors["h.0.fc.w"].shards[1].offsets = {3, 0};
  manifest.tensors["h.0.fc.w"].shards[1].shape = {5, 4};
  EXPECT_THAT(
      Message(ValidateManifest(manifest, "m.json")),
      AllOf(HasSubstr("m.json"), HasSubstr("tensor 'h.0.fc.w'"), HasSubstr("partly overlaps")));
}

TEST(ManifestTest, HoleIsAnError) {
  Manifest manifest = TwoRanks();
  manifest.tensors["h.0.fc.w"].shards[1].shape = {3, 4};
  EXPECT_THAT(Message(ValidateManifest(manifest, "m.json")),
              AllOf(HasSubstr("tensor 'h.0.fc.w'"), HasSubstr("cover 28 of 32")));
}

TEST(ManifestTest, SliceOutsideTheTensorOrRankOutsideTheWorldIsAnError) {
  Manifest outside = TwoRanks();
  outside.tensors["h.0.fc.w"].shards[1].offsets = {5, 0};
  EXPECT_THAT(Message(ValidateManifest(outside, "m.json")),
              HasSubstr("leaves the global shape [8, 4]"));
  Manifest rank = TwoRanks();
  rank.tensors["h.0.fc_proj.b"].shards[1].rank = 2;
  EXPECT_THAT(Message(ValidateManifest(rank, "m.json")),
              AllOf(HasSubstr("tensor 'h.0.fc_proj.b'"), HasSubstr("rank outside [0, 2)")));
  Manifest dims = TwoRanks();
  dims.tensors["h.0.fc.w"].shards[0].offsets = {0};
  EXPECT_THAT(Message(ValidateManifest(dims, "m.json")), HasSubstr("do not match the rank"));
}

TEST(ManifestTest, MalformedJsonNamesWhere) {
  EXPECT_THAT(Message(ParseManifest("{", "m.json").status()), HasSubstr("m.json"));
  const std::string text = ManifestToJson(TwoRanks());
  std::string wrong_type = text;
  wrong_type.replace(wrong_type.find("\"step\": 100"), 11, "\"step\": \"x\"");
  EXPECT_THAT(Message(ParseManifest(wrong_type, "m.json").status()), HasSubstr("in step"));
  std::string bad_dtype = text;
  bad_dtype.replace(bad_dtype.find("\"F32\""), 5, "\"F99\"");
  EXPECT_THAT(Message(ParseManifest(bad_dtype, "m.json").status()),
              AllOf(HasSubstr("tensor 'h.0.fc.w'"), HasSubstr("unknown dtype \"F99\"")));
  EXPECT_EQ(ReadManifest("/nonexistent/manifest.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardline::checkpoint
