#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"

namespace shardline::data {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSeqLen = 16;
constexpr int64_t kGlobalBatch = 8;
constexpr uint64_t kSeed = 1234;

TextDataset Corpus() { return SyntheticCorpus(/*seed=*/5, /*length=*/10'000).ToDataset(); }

Sampler MakeSampler(const TextDataset& dataset, uint64_t seed = kSeed) {
  absl::StatusOr<Sampler> sampler = Sampler::Create(dataset, kSeqLen, kGlobalBatch, seed);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

std::vector<Token> Row(const std::vector<Token>& tokens, int64_t row) {
  return {tokens.begin() + row * kSeqLen, tokens.begin() + (row + 1) * kSeqLen};
}

TEST(SamplerTest, GlobalBatchHasTheDeclaredShape) {
  const TextDataset dataset = Corpus();
  const Batch batch = MakeSampler(dataset).GlobalBatch(0);
  EXPECT_EQ(batch.first_sample, 0);
  EXPECT_EQ(batch.count, kGlobalBatch);
  EXPECT_EQ(batch.seq_len, kSeqLen);
  EXPECT_EQ(batch.inputs.size(), static_cast<size_t>(kGlobalBatch * kSeqLen));
  EXPECT_EQ(batch.targets.size(), static_cast<size_t>(kGlobalBatch * kSeqLen));
}

TEST(SamplerTest, SamplesAreWindowsOfTheDatasetWithTargetsShiftedByOne) {
  const TextDataset dataset = Corpus();
  const Sampler sampler = MakeSampler(dataset);
  for (uint64_t step = 0; step < 50; ++step) {
    const Batch batch = sampler.GlobalBatch(step);
    for (int64_t i = 0; i < kGlobalBatch; ++i) {
      const uint64_t offset = sampler.Offset(step, i);
      // The target window ends at offset + seq_len, which must exist.
      ASSERT_LT(offset + kSeqLen, dataset.size());
      for (int64_t t = 0; t < kSeqLen; ++t) {
        ASSERT_EQ(batch.inputs[i * kSeqLen + t], dataset.tokens()[offset + t]);
        ASSERT_EQ(batch.targets[i * kSeqLen + t], dataset.tokens()[offset + t + 1]);
      }
    }
  }
}

TEST(SamplerTest, IsAPureFunctionOfSeedStepAndIndex) {
  // Two samplers over two separately built datasets, queried in different orders, agree.
  const TextDataset first_dataset = Corpus();
  const TextDataset second_dataset = Corpus();
  const Sampler first = MakeSampler(first_dataset);
  const Sampler second = MakeSampler(second_dataset);
  std::vector<Batch> forward;
  for (uint64_t step = 0; step < 10; ++step) forward.push_back(first.GlobalBatch(step));
  for (uint64_t step = 10; step-- > 0;) {
    const Batch batch = second.GlobalBatch(step);
    EXPECT_EQ(batch.inputs, forward[step].inputs) << "step " << step;
    EXPECT_EQ(batch.targets, forward[step].targets) << "step " << step;
  }
  // A single sample, computed alone and late, is the same row.
  absl::StatusOr<Batch> sample = second.Sample(/*step=*/7, /*index=*/5);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->inputs, Row(forward[7].inputs, 5));
  EXPECT_EQ(sample->targets, Row(forward[7].targets, 5));
}

TEST(SamplerTest, OffsetsArePinned) {
  // The data order is part of what a checkpoint resumes: a change here changes every run. If you
  // change the hash on purpose, update these values and say so in the change. The values were
  // checked against an independent Python implementation of common/counter_hash.h.
  const TextDataset dataset = Corpus();
  const Sampler sampler = MakeSampler(dataset);
  EXPECT_EQ(sampler.Offset(0, 0), 3225u);
  EXPECT_EQ(sampler.Offset(1, 0), 5958u);
  EXPECT_EQ(sampler.Offset(123456, 7), 3533u);
}

TEST(SamplerTest, StepsSeedsAndIndicesGiveDifferentSamples) {
  const TextDataset dataset = Corpus();
  const Sampler sampler = MakeSampler(dataset);
  const Sampler other_seed = MakeSampler(dataset, kSeed + 1);
  EXPECT_NE(sampler.GlobalBatch(0).inputs, sampler.GlobalBatch(1).inputs);
  EXPECT_NE(sampler.GlobalBatch(0).inputs, other_seed.GlobalBatch(0).inputs);
  std::set<uint64_t> offsets;
  for (int64_t i = 0; i < kGlobalBatch; ++i) offsets.insert(sampler.Offset(3, i));
  // 8 draws from ~10k windows: a collision would have probability ~0.3%, not worth a flake.
  EXPECT_GE(offsets.size(), static_cast<size_t>(kGlobalBatch - 1));
}

TEST(SamplerTest, OffsetsAreRoughlyUniform) {
  const TextDataset dataset = Corpus();
  const Sampler sampler = MakeSampler(dataset);
  constexpr int kBins = 10;
  constexpr int kDraws = 20'000;
  std::vector<int> bins(kBins);
  const uint64_t windows = dataset.size() - kSeqLen;
  for (int d = 0; d < kDraws; ++d) {
    ++bins[sampler.Offset(static_cast<uint64_t>(d / kGlobalBatch), d % kGlobalBatch) * kBins /
           windows];
  }
  // Expected 2000 per bin with a standard deviation of ~42: +-10% is over 4 sigma.
  for (int b = 0; b < kBins; ++b) {
    EXPECT_NEAR(bins[b], kDraws / kBins, kDraws / kBins / 10) << "bin " << b;
  }
}

TEST(SamplerTest, MicroBatchesConcatenateToTheGlobalBatch) {
  const TextDataset dataset = Corpus();
  const Sampler sampler = MakeSampler(dataset);
  for (uint64_t step : {0ULL, 1ULL, 99ULL}) {
    const Batch global = sampler.GlobalBatch(step);
    std::vector<Token> inputs;
    std::vector<Token> targets;
    // An uneven split, as data-parallel ranks times micro-batches might give.
    for (auto [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 1}, {4, 4}}) {
      absl::StatusOr<Batch> micro = sampler.MicroBatch(step, first, count);
      ASSERT_TRUE(micro.ok()) << micro.status();
      EXPECT_EQ(micro->first_sample, first);
      EXPECT_EQ(micro->count, count);
      inputs.insert(inputs.end(), micro->inputs.begin(), micro->inputs.end());
      targets.insert(targets.end(), micro->targets.begin(), micro->targets.end());
    }
    EXPECT_EQ(inputs, global.inputs);
    EXPECT_EQ(targets, global.targets);
  }
}

TEST(SamplerTest, MicroBatchOutsideTheGlobalBatchIsAnError) {
  const TextDataset dataset = Corpus();
  const Sampler sampler = MakeSampler(dataset);
  for (auto [first, count] :
       std::vector<std::pair<int64_t, int64_t>>{{-1, 2}, {7, 2}, {0, 0}, {8, 1}, {0, 9}}) {
    absl::StatusOr<Batch> micro = sampler.MicroBatch(4, first, count);
    ASSERT_FALSE(micro.ok()) << first << "+" << count;
    EXPECT_EQ(micro.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ToString(micro.status().message()), HasSubstr("global batch [0, 8)"));
  }
}

TEST(SamplerTest, CreateRejectsBadSizes) {
  const TextDataset tiny = TextDataset::FromText("0123456789", "tiny.txt");
  absl::StatusOr<Sampler> too_long = Sampler::Create(tiny, /*seq_len=*/10, 1, kSeed);
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(ToString(too_long.status().message()), HasSubstr("tiny.txt has 10 tokens"));
  // seq_len 9 needs exactly 10 tokens: one window.
  absl::StatusOr<Sampler> exact = Sampler::Create(tiny, /*seq_len=*/9, 2, kSeed);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->Offset(5, 1), 0u);
  EXPECT_FALSE(Sampler::Create(tiny, 0, 1, kSeed).ok());
  EXPECT_FALSE(Sampler::Create(tiny, 4, 0, kSeed).ok());
}

}  // namespace
}  // namespace shardline::data
