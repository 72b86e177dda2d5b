// What the leader of a tensor-parallel serving group broadcasts before each step, so that every
// rank runs the same step: the flattened tokens, positions, block tables and logit rows of the
// step (model::PagedStep) and how each logit row is sampled. The followers decode it and check
// every size and index against their own limits before using it: a malformed message is an
// error naming the field, never an out-of-range read.
//
// On the wire: a header of kHeaderInts int32 (kind, payload length in int32), then for a step the
// payload — counts (N, sequences, blocks per sequence, logit rows), the arrays, and per logit row
// its temperature and top_p (float bits), top_k, and the seed and draw (two int32 each).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/paged_inference.h"
#include "worker/model/vocab_parallel_sampling.h"

namespace shardline::serving {

enum class StepKind : int32_t {
  kStep = 1,  // a payload follows
  kIdle = 2,  // nothing to do: keeps the followers' waits inside their deadline
  kStop = 3,  // the engine is shutting down
};

inline constexpr int kHeaderInts = 2;

// A step as the followers hold it: owns the arrays that a model::PagedStep points into.
struct StepMessage {
  std::vector<int32_t> tokens, positions, token_seq, block_tables, logit_rows;
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  std::vector<model::RowSampling> sampling;  // one per logit row

  model::PagedStep View() const;
};

// The payload of a step.
std::vector<int32_t> EncodeStep(const model::PagedStep& step,
                                std::span<const model::RowSampling> sampling);

// The step in `payload`. InvalidArgument naming the field when the counts disagree with the
// payload's length or pass `limits` (the follower's own cache options); the indices inside are
// checked by PagedGptForward::Forward.
absl::StatusOr<StepMessage> DecodeStep(std::span<const int32_t> payload,
                                       const model::PagedCacheOptions& limits);

}  // namespace shardline::serving
