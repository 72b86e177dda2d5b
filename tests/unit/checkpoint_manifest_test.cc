#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/status_macros.h"
#include "worker/checkpoint/manifest.h"

namespace shardline::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

// Two tensor-parallel ranks: "h.0.fc.w" (8, 4) split by rows, "h.0.fc_proj.b" (4) replicated.
Manifest TwoRanks() {
  Manifest manifest;
  manifest.step = 100;
  manifest.world_size = 2;
  manifest.metadata["n_layer"] = "1";
  ManifestTensor& fc = manifest.tensors["h.0.fc.w"];
  fc.global_shape = {8, 4};
  fc.shards = {{0, "rank-0.safetensors", "h.0.fc.w", {0, 0}, {4, 4}},
               {1, "rank-1.safetensors", "h.0.fc.w", {4, 0}, {4, 4}}};
  ManifestTensor& bias = manifest.tensors["h.0.fc_proj.b"];
  bias.global_shape = {4};
  bias.shards = {{0, "rank-0.safetensors", "h.0.fc_proj.b", {0}, {4}},
                 {1, "rank-1.safetensors", "h.0.fc_proj.b", {0}, {4}}};
  return manifest;
}

TEST(ManifestTest, RoundTripsThroughAFile) {
  std::string dir = ::testing::TempDir() + "/manifest_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const Manifest manifest = TwoRanks();
  ASSERT_TRUE(WriteManifest(dir + "/manifest.json", manifest).ok());
  absl::StatusOr<Manifest> read = ReadManifest(dir + "/manifest.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, manifest);
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
