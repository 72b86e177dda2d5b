#include "worker/model/data/sampler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/counter_hash.h"

namespace shardline::data {

absl::StatusOr<Sampler> Sampler::Create(const TextDataset& dataset, int64_t seq_len,
                                        int64_t global_batch, uint64_t seed) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sampler: seq_len must be >= 1, got ", seq_len));
  }
  if (global_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: global_batch must be >= 1, got ", global_batch));
  }
  if (dataset.size() < static_cast<size_t>(seq_len) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: dataset ", dataset.source(), " has ", dataset.size(),
                     " tokens, fewer than seq_len + 1 = ", seq_len + 1, " needed for one sample"));
  }
  return Sampler(dataset.shared_tokens(), seq_len, global_batch, seed);
}

uint64_t Sampler::Offset(uint64_t step, int64_t index) const {
  // Offsets o with o + seq_len < size, so that the target window fits too.
  const uint64_t windows = tokens_->size() - static_cast<uint64_t>(seq_len_);
  return UniformBelow(Hash3(seed_, step, static_cast<uint64_t>(index)), windows);
}

Batch Sampler::GlobalBatch(uint64_t step) const { return Rows(step, 0, global_batch_); }

absl::StatusOr<Batch> Sampler::MicroBatch(uint64_t step, int64_t first_sample,
                                          int64_t count) const {
  if (count < 1 || first_sample < 0 || first_sample > global_batch_ - count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler: samples [", first_sample, ", ", first_sample + count, ") of step ", step,
        " are not a non-empty part of the global batch [0, ", global_batch_, ")"));
  }
  return Rows(step, first_sample, count);
}

Batch Sampler::Rows(uint64_t step, int64_t first_sample, int64_t count) const {
  Batch batch;
  batch.first_sample = first_sample;
  batch.count = count;
  batch.seq_len = seq_len_;
  const size_t row = static_cast<size_t>(seq_len_);
  batch.inputs.resize(static_cast<size_t>(count) * row);
  batch.targets.resize(static_cast<size_t>(count) * row);
  for (int64_t j = 0; j < count; ++j) {
    const auto window = tokens_->begin() + static_cast<ptrdiff_t>(Offset(step, first_sample + j));
    std::copy(window, window + seq_len_, batch.inputs.begin() + j * seq_len_);
    std::copy(window + 1, window + 1 + seq_len_, batch.targets.begin() + j * seq_len_);
  }
  return batch;
}

}  // namespace shardline::data
