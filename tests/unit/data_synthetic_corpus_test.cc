#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <unordered_map>

#include "worker/model/data/synthetic_corpus.h"

namespace shardline::data {
namespace {

// Cross-entropy in nats per byte of `test` under an order-`order` Markov model (the previous
// `order` bytes predict the next) fitted on `train`, with add-alpha smoothing over 256 bytes so
// that unseen events cost something instead of infinity. Order 0 is the unigram model.
double CrossEntropy(const std::string& train, const std::string& test, size_t order) {
  constexpr double kAlpha = 0.01;
  std::unordered_map<std::string, std::array<uint32_t, 256>> counts;
  std::unordered_map<std::string, uint64_t> totals;
  for (size_t i = order; i < train.size(); ++i) {
    const std::string context = train.substr(i - order, order);
    auto [it, inserted] = counts.try_emplace(context);
    if (inserted) it->second.fill(0);
    ++it->second[static_cast<unsigned char>(train[i])];
    ++totals[context];
  }
  double nats = 0;
  for (size_t i = order; i < test.size(); ++i) {
    const std::string context = test.substr(i - order, order);
    const auto it = counts.find(context);
    const double count = it == counts.end() ? 0 : it->second[static_cast<unsigned char>(test[i])];
    const double total = it == counts.end() ? 0 : static_cast<double>(totals[context]);
    nats -= std::log((count + kAlpha) / (total + 256 * kAlpha));
  }
  return nats / static_cast<double>(test.size() - order);
}

TEST(SyntheticCorpusTest, IsDeterministicPerSeedAndHasTheRequestedLength) {
  const SyntheticCorpus a(42, 5000);
  const SyntheticCorpus b(42, 5000);
  const SyntheticCorpus c(43, 5000);
  EXPECT_EQ(a.text().size(), 5000u);
  EXPECT_EQ(a.text(), b.text());
  EXPECT_NE(a.text(), c.text());
  // A shorter corpus is a prefix of a longer one, so a length change does not reshuffle data.
  EXPECT_EQ(SyntheticCorpus(42, 1234).text(), a.text().substr(0, 1234));
}

TEST(SyntheticCorpusTest, IsPrintableTextInLines) {
  const SyntheticCorpus corpus(1, 20'000);
  for (char c : corpus.text()) {
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << static_cast<int>(c);
  }
  EXPECT_GT(std::count(corpus.text().begin(), corpus.text().end(), '\n'), 100);
  const TextDataset dataset = corpus.ToDataset();
  EXPECT_EQ(dataset.size(), corpus.text().size());
  EXPECT_EQ(dataset.source(), "synthetic(seed=1)");
}

TEST(SyntheticCorpusTest, HasLowConditionalEntropy) {
  // Fitted on one seed, measured on another: the structure is in the grammar, not memorised.
  const std::string train = SyntheticCorpus(1, 1'000'000).text();
  const std::string test = SyntheticCorpus(2, 200'000).text();
  const double uniform = std::log(256.0);
  const double unigram = CrossEntropy(train, test, 0);
  const double bigram = CrossEntropy(train, test, 1);
  const double five_gram = CrossEntropy(train, test, 4);
  RecordProperty("unigram_nats", std::to_string(unigram));
  RecordProperty("bigram_nats", std::to_string(bigram));
  RecordProperty("five_gram_nats", std::to_string(five_gram));
  std::printf("uniform %.3f, unigram %.3f, bigram %.3f, 5-gram %.3f nats/byte\n", uniform, unigram,
              bigram, five_gram);
  // The bounds synthetic_corpus.h promises, with margin over the measured values.
  EXPECT_LT(unigram, 3.3);
  EXPECT_LT(bigram, 1.8);
  EXPECT_LT(five_gram, 0.8);
}

}  // namespace
}  // namespace shardline::data
