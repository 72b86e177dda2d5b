#include "worker/model/data/synthetic_corpus.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "common/counter_hash.h"

namespace shardline::data {
namespace {

constexpr std::array<const char*, 8> kNouns = {"cat",  "dog",  "fox",  "owl",
                                               "bird", "fish", "frog", "bear"};
constexpr std::array<const char*, 6> kAdjectives = {"red", "big", "small", "old", "blue", "quick"};
constexpr std::array<const char*, 4> kVerbs = {"sees", "likes", "finds", "chases"};

// A sequential generator is fine here (unlike the sampler): the corpus is made once, whole.
class Generator {
 public:
  explicit Generator(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_++); }
  size_t Below(size_t n) { return static_cast<size_t>(UniformBelow(Next(), n)); }
  template <size_t N>
  const char* Pick(const std::array<const char*, N>& choices) {
    return choices[Below(N)];
  }

 private:
  uint64_t state_;
};

void NounPhrase(Generator& gen, std::string& out) {
  absl::StrAppend(&out, "the ");
  if (gen.Below(2) == 0) absl::StrAppend(&out, gen.Pick(kAdjectives), " ");
  absl::StrAppend(&out, gen.Pick(kNouns));
}

void Sentence(Generator& gen, std::string& out) {
  switch (gen.Below(5)) {
    case 0: {  // subject verb object
      NounPhrase(gen, out);
      absl::StrAppend(&out, " ", gen.Pick(kVerbs), " ");
      NounPhrase(gen, out);
      absl::StrAppend(&out, ".");
      break;
    }
    case 1: {  // single-digit addition
      const size_t a = gen.Below(10);
      const size_t b = gen.Below(10);
      absl::StrAppend(&out, a, " + ", b, " = ", a + b, ".");
      break;
    }
    case 2: {  // counting up from a random start
      const size_t start = gen.Below(10);
      const size_t count = 3 + gen.Below(4);
      absl::StrAppend(&out, "count");
      for (size_t i = 0; i < count; ++i) absl::StrAppend(&out, " ", start + i);
      absl::StrAppend(&out, ".");
      break;
    }
    case 3: {  // copy
      std::string words;
      const size_t count = 1 + gen.Below(3);
      for (size_t i = 0; i < count; ++i) {
        absl::StrAppend(&words, i == 0 ? "" : " ", gen.Pick(kNouns));
      }
      absl::StrAppend(&out, "echo ", words, " : ", words, ".");
      break;
    }
    default: {  // number agreement
      const bool plural = gen.Below(2) == 0;
      absl::StrAppend(&out, "the ", gen.Pick(kNouns), plural ? "s are " : " is ",
                      gen.Pick(kAdjectives), ".");
      break;
    }
  }
}

}  // namespace

SyntheticCorpus::SyntheticCorpus(uint64_t seed, size_t length) : seed_(seed) {
  Generator gen(Mix64(seed));
  text_.reserve(length + 256);
  while (text_.size() < length) {
    const size_t sentences = 2 + gen.Below(4);
    for (size_t i = 0; i < sentences; ++i) {
      if (i > 0) text_.push_back(' ');
      Sentence(gen, text_);
    }
    text_.push_back('\n');
  }
  text_.resize(length);
}

TextDataset SyntheticCorpus::ToDataset(const ByteTokenizer& tokenizer) const {
  return TextDataset::FromText(text_, absl::StrCat("synthetic(seed=", seed_, ")"), tokenizer);
}

}  // namespace shardline::data
