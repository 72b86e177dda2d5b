// The step-deterministic sampler: which samples make up global step s is a pure function of
// (seed, s) and the dataset, never of the plan, the rank, or what ran before. A sharded run, a run
// restarted from a checkpoint with another plan, and an unsharded run all see the same global
// batch, which is what makes their losses comparable.
//
// Sample i of step s is the window of seq_len + 1 tokens at offset
//   UniformBelow(Hash3(seed, s, i), size - seq_len)
// (common/counter_hash.h): inputs are its first seq_len tokens, targets the last seq_len (shifted by one).
// Windows are drawn with replacement, so there are no epochs to track across restarts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/data/text_dataset.h"

namespace shardline::data {

// `count` samples of `seq_len` tokens, row-major (count, seq_len): sample j's tokens are at
// [j * seq_len, (j + 1) * seq_len). targets[k] is the token after inputs[k] in the dataset.
struct Batch {
  int64_t first_sample = 0;  // the global index of row 0
  int64_t count = 0;
  int64_t seq_len = 0;
  std::vector<Token> inputs;
  std::vector<Token> targets;
};

class Sampler {
 public:
  // InvalidArgument unless seq_len >= 1, global_batch >= 1 and the dataset holds at least
  // seq_len + 1 tokens (the message names the dataset's source and both sizes).
  static absl::StatusOr<Sampler> Create(const TextDataset& dataset, int64_t seq_len,
                                        int64_t global_batch, uint64_t seed);

  int64_t seq_len() const { return seq_len_; }
  int64_t global_batch() const { return global_batch_; }
  uint64_t seed() const { return seed_; }

  // Where sample `index` of `step` starts in the token stream. Defined for any index, so that
  // callers may check a sample without building a batch; only [0, global_batch) are trained on.
  uint64_t Offset(uint64_t step, int64_t index) const;

  // The whole global batch of `step`: samples 0 .. global_batch - 1.
  Batch GlobalBatch(uint64_t step) const;

  // Samples [first_sample, first_sample + count) of `step`: what one data-parallel rank or one
  // micro-batch trains on. Consecutive ranges concatenate to GlobalBatch(step). InvalidArgument
  // when the range is empty or leaves [0, global_batch).
  absl::StatusOr<Batch> MicroBatch(uint64_t step, int64_t first_sample, int64_t count) const;

  // One sample, as a batch of one row.
  absl::StatusOr<Batch> Sample(uint64_t step, int64_t index) const {
    return MicroBatch(step, index, 1);
  }

 private:
  Sampler(std::shared_ptr<const std::vector<Token>> tokens, int64_t seq_len, int64_t global_batch,
          uint64_t seed)
      : tokens_(std::move(tokens)), seq_len_(seq_len), global_batch_(global_batch), seed_(seed) {}

  Batch Rows(uint64_t step, int64_t first_sample, int64_t count) const;

  std::shared_ptr<const std::vector<Token>> tokens_;
  int64_t seq_len_;
  int64_t global_batch_;
  uint64_t seed_;
};

}  // namespace shardline::data
