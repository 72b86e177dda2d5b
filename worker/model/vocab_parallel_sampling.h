// Sampling the next token where the logits are: each tensor-parallel rank holds the logits of its
// vocabulary rows only (the vocab-parallel head), and the ranks agree on each row's token by
// exchanging a few numbers per row, never the logits themselves (Megatron's vocab-parallel
// cross-entropy does the same for the loss):
//   greedy: each rank's best (value, id); the best of those, lowest id on ties;
//   temperature over the whole vocabulary: the global max, then each rank's sum of weights; the
//     draw falls in one rank's share, and that rank finds the token in its rows;
//   top-k: each rank's k best (value, id); every rank merges the same candidates and draws.
// The token is SampleToken's on the whole row (inference.h): the same candidates in the same
// order, the same draw. (For the whole-vocabulary draw the partial sums are added in another
// grouping, so a draw within ~1e-16 of a boundary between two tokens could fall the other way.)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/model/inference.h"

namespace shardline::model {

// How one logit row is sampled: the request's options and the index of the token it draws.
struct RowSampling {
  SamplingOptions options;
  uint64_t draw = 0;
};

// The token of each row of `local_logits` (rows × (vocab_end − vocab_begin), this rank's
// vocabulary [vocab_begin, vocab_end) of `vocab`), the same on every rank of `tp`. Every rank of
// `tp` calls it together with the same `rows`; tp == nullptr means this rank holds the whole
// vocabulary. InvalidArgument for a negative top_k or sizes that disagree; a communicator error
// names the exchange.
absl::StatusOr<std::vector<int32_t>> SampleVocabParallel(std::span<const float> local_logits,
                                                         int vocab_begin, int vocab_end, int vocab,
                                                         std::span<const RowSampling> rows,
                                                         comm::Communicator* tp);

}  // namespace shardline::model
