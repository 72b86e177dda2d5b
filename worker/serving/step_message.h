// The messages of a serving group (worker/serving/batching_engine.h) and how they travel.
//
// A step: the flattened tokens, positions, block tables and logit rows of one step
// (model::PagedStep) and how each logit row is sampled — what every rank needs to run the same
// step. The receivers decode it and check every size and index against their own limits before
// using it: a malformed message is an error naming the field, never an out-of-range read.
//
// How it travels: a Slot. The leader (rank 0 of the first pipeline stage) broadcasts each slot to
// the other ranks of its stage's tensor-parallel group (BroadcastSlot). With pipeline stages, the
// stages then form a ring over each pipeline group (TurnRing): every turn, each stage sends the
// slot it has just computed to the next stage — the step with the residual stream after its
// layers — and the last stage sends the first the tokens it sampled; every stage receives from
// the one before at the same turn. So with P stages, P steps are in flight, one per stage,
// GPipe's steady state for decoding (vLLM's virtual engines), and no send ever waits on a stage
// that is itself sending (a ring of SendRecvs, not of Sends).
//
// On the wire: a header of kHeaderInts int32 (kind, payload length in int32, residual length in
// floats), then one int32 body: the payload — for a step, counts (N, sequences, blocks per
// sequence, logit rows), the arrays, and per logit row its temperature and top_p (float bits),
// top_k, and the seed and draw (two int32 each); for tokens, one per logit row — and the
// residual's float bits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/model/paged_inference.h"
#include "worker/model/vocab_parallel_sampling.h"

namespace shardline::serving {

enum class StepKind : int32_t {
  kStep = 1,    // a step's payload (and, between stages, its residual) follows
  kIdle = 2,    // nothing to do: keeps the ring turning and the followers' waits in their deadline
  kStop = 3,    // the engine is shutting down
  kTokens = 4,  // the last stage's sampled tokens, one per logit row, to the first stage
};

inline constexpr int kHeaderInts = 3;

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

// One message of a serving group.
struct Slot {
  StepKind kind = StepKind::kIdle;
  std::vector<int32_t> payload;  // kStep: EncodeStep's; kTokens: the tokens; else empty
  std::vector<float> residual;   // kStep from one stage to the next: (N, C); else empty
};

// The most a slot may carry, from the receiver's own limits: anything past them is refused.
struct SlotLimits {
  int64_t max_payload_ints = 0;
  int64_t max_residual_floats = 0;
  static SlotLimits For(const model::PagedCacheOptions& cache, int d_model);
};

// The leader (rank 0 of `tp`) sends `slot` to the other ranks of its stage; they receive it into
// `slot`. A residual does not travel this way (every rank of the stage computes its own).
// InvalidArgument for a malformed header; the communicator's error otherwise.
absl::Status BroadcastSlot(comm::Communicator& tp, Slot& slot, const SlotLimits& limits);

// One turn of the pipeline ring over `pp` (this rank's pipeline group; its stage is pp.rank(),
// of pp.size() >= 2): sends `out` to the next stage (the last stage's to the first) and returns
// what the stage before sent. Every stage turns together. InvalidArgument for a malformed header
// (an unknown kind, lengths past `limits`, an idle or stop slot that carries anything); the
// communicator's error otherwise.
absl::StatusOr<Slot> TurnRing(comm::Communicator& pp, const Slot& out, const SlotLimits& limits);

}  // namespace shardline::serving
