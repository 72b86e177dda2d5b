// Continuous (iteration-level) batching, the I/O-free core, after vLLM v1's scheduler and KV block
// manager: each step the scheduler says which positions of which sequences the model computes,
// and which cache blocks hold them. It knows no tokens (the engine keeps the ids), no model and no
// clock; it is deterministic, so the same calls give the same plans.
//
// A step, as the engine drives it:
//   plan = Schedule();   run the model on plan.entries (rows in order, block tables from
//   BlockTable) Complete(plan);      then, for each entry with sample == true: AppendToken(id) or
//   Finish(id)
// A non-empty plan must be Completed before the next Schedule, unless max_in_flight > 1: then up
// to that many non-empty plans may be outstanding at once (pipeline stages each working on one,
// vLLM's batch queue), over disjoint sequences, and they are Completed in the order they were
// made. A sequence is in flight from the Schedule that gives it an entry to that plan's Complete:
// it gets no other entry and is never preempted meanwhile. After a failed step the engine
// Completes it and Finishes the sequences that cannot go on.
//
// A sequence has `known` tokens (prompt + generated so far), `computed` positions in the cache and
// a `max_total` = prompt_len + max_tokens. The engine Finishes it once it has its max_tokens (the
// last sampled token is never computed, so the cache holds at most max_total - 1 positions) or on
// a stop token; a running sequence at max_total that is not Finished gets no more work.
//
// Per step, in this order (each within the token budget, max_tokens_per_step):
//  1. Decodes: every running sequence with one position due (computed == known - 1), in running
//     (= admission) order. One that needs a new block and finds none free preempts the most
//     recently admitted running sequence, itself if it is that one (recompute preemption: the
//     victim's blocks are freed and it goes back to the FRONT of the waiting queue to recompute
//     all its known tokens).
//  2. The chunk of the running sequence still prefilling (or recomputing), if any: min(positions
//     due, budget left), shortened to the room in its last block and the free blocks; when that is
//     no position at all it preempts as in 1, which is itself (see the invariants).
//  3. Admission, FIFO from the waiting queue, only in a step that preempted nothing: the head is
//     admitted while running < max_running, budget is left and the blocks for its chunk
//     (min(known, budget left) positions) are free; otherwise it and everything behind it wait.
//     A prompt longer than the budget left is chunked: it continues in 2 in later steps, ahead of
//     newer admissions. An admitted sequence takes only the blocks for the positions it computes.
//
// With plans in flight, 1 and 2 skip the sequences in flight, a preemption takes the newest running
// sequence that is not in flight, and 3 admits no one while a sequence in flight still has prompt
// positions due after its chunk (so that at most one sequence prefills at a time, as below). A
// plan then has at most ceil(max_running / max_in_flight) entries (counted against the budget in
// 3), so that the running sequences are shared among the plans in flight rather than all taken by
// the first while the others' stages wait.
//
// Invariants (between calls; tests/unit/serving_batch_scheduler_test.cc checks them each step):
//  - Every block is either free in the pool or in the table of exactly one running sequence.
//  - A running sequence holds ceil(reserved / block_size) blocks, reserved = computed + the
//    positions of the outstanding plan (= computed after Complete). Waiting ones hold none and
//    have computed == 0.
//  - 0 <= computed <= known <= max_total <= max_context, and max_total - 1 positions fit the pool.
//  - running() <= max_running; a plan's total_tokens() <= max_tokens_per_step; at most one entry
//    per sequence.
//  - At most one running sequence is still prefilling, and it is the newest: admission stops at
//    the chunk that exhausts the budget and resumes only in a step its last chunk leaves budget in.
//  - Waiting is FIFO in Add order, except that preempted sequences go to its front (older first),
//    so sequences are first admitted in the order they were added: no one is passed over.
//  - Liveness: max_tokens_per_step >= max_running and every sequence fits the whole pool, so the
//    oldest running sequence always makes progress (it can preempt all newer ones). While every
//    sampled entry gets its AppendToken or Finish, a plan is empty only when no sequence is left
//    or every sequence with work due is in flight.
//
// Not thread-safe: one owner (the engine's loop) calls it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/serving/kv_block_pool.h"

namespace shardline::serving {

struct SchedulerLimits {
  int max_running = 8;            // sequences in the running batch (>= 1)
  int max_tokens_per_step = 256;  // prefill + decode tokens in one step (>= max_running)
  int block_size = 16;            // positions per KV block (>= 1)
  int num_blocks = 0;             // blocks in the pool (>= 1)
  int max_queue = 64;             // waiting sequences; past it Add is ResourceExhausted (>= 0)
  int max_context = 0;            // positions a sequence may use: prompt + max_tokens (>= 2)
  int max_in_flight = 1;          // non-empty plans outstanding at once (>= 1): pipeline stages
};

using SeqId = uint64_t;

// One sequence's work in a step: compute positions [start, start + count) of its known tokens;
// sample == true when that reaches its last known token (so the step's logits for its last row
// are needed).
struct StepEntry {
  SeqId id = 0;
  int start = 0;
  int count = 0;
  bool sample = false;

  friend bool operator==(const StepEntry&, const StepEntry&) = default;
};

// Why the waiting queue's head was not admitted in a step (kNone: nothing was left waiting).
enum class AdmissionStop { kNone, kMaxRunning, kBudget, kBlocks, kPreempted, kPrefillInFlight };
std::string_view AdmissionStopName(AdmissionStop stop);

struct StepPlan {
  std::vector<StepEntry> entries;  // decodes first (running order), then prefill chunks
  std::vector<SeqId> preempted;    // sequences whose cache was dropped this step (they recompute)
  AdmissionStop admission_stop = AdmissionStop::kNone;
  uint64_t step = 0;  // which Schedule made it (1, 2, ...): Complete takes the oldest outstanding

  int total_tokens() const;
  bool empty() const { return entries.empty(); }
};

enum class SeqState { kWaiting, kRunning };

// A sequence as the scheduler sees it (for the engine's stats and for tests).
struct SeqInfo {
  SeqState state = SeqState::kWaiting;
  int known = 0;      // prompt + generated tokens
  int computed = 0;   // positions in the cache
  int max_total = 0;  // prompt_len + max_tokens
  int blocks = 0;     // blocks held
};

class BatchScheduler {
 public:
  // InvalidArgument naming the field when a limit is out of its range (see SchedulerLimits).
  static absl::StatusOr<BatchScheduler> Create(SchedulerLimits limits);

  // A new sequence with `prompt_len` known tokens that may grow to prompt_len + max_tokens; it
  // waits at the back of the queue. InvalidArgument (naming the numbers) for prompt_len < 1,
  // max_tokens < 1, prompt_len + max_tokens > max_context, or one whose positions could never
  // fit the whole pool; AlreadyExists for an id that is waiting or running; ResourceExhausted
  // when max_queue sequences wait (preempted ones count, but are never refused).
  absl::Status Add(SeqId id, int prompt_len, int max_tokens);

  // The next step's work (see the header comment). Empty when no sequence out of flight has work
  // due. Aborts while max_in_flight non-empty plans are not Completed.
  StepPlan Schedule();
  // The step `plan` ran: its positions are in the cache. Entries of sequences Finished since
  // Schedule are skipped. Aborts for a plan that is not the oldest outstanding one (already
  // Completed, or out of order): the engine's bookkeeping is wrong. An empty plan is never
  // outstanding; completing it is a no-op.
  void Complete(const StepPlan& plan);
  // Non-empty plans Scheduled and not yet Completed.
  int in_flight() const { return static_cast<int>(outstanding_.size()); }
  // The token sampled for `id`'s entry with sample == true is now known. Aborts unless `id` is
  // running with a sample due (computed == known) and below max_total.
  void AppendToken(SeqId id);
  // Removes a sequence (finished, cancelled, or failed) wherever it is, freeing its blocks.
  // A no-op for unknown ids.
  void Finish(SeqId id);

  // The cache blocks of a sequence, in position order (the model's block table row). Empty for a
  // waiting or unknown sequence. Valid until the next non-const call.
  std::span<const int32_t> BlockTable(SeqId id) const;
  std::optional<SeqInfo> Info(SeqId id) const;
  // Running sequences in admission order (the newest last), waiting ones in queue order.
  const std::vector<SeqId>& running_ids() const { return running_; }
  std::vector<SeqId> waiting_ids() const { return {waiting_.begin(), waiting_.end()}; }

  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int free_blocks() const { return pool_.free_blocks(); }
  int64_t preemptions() const { return preemptions_; }  // since creation
  const SchedulerLimits& limits() const { return limits_; }

 private:
  struct Sequence {
    int known = 0;
    int max_total = 0;
    int computed = 0;
    int reserved = 0;  // positions the blocks are for: computed + its outstanding plan's
    bool running = false;
    bool in_flight() const { return reserved > computed; }
    std::vector<int32_t> blocks;
  };

  explicit BatchScheduler(SchedulerLimits limits);

  int BlocksFor(int positions) const;
  // Entries one plan may have: ceil(max_running / max_in_flight).
  int MaxEntries() const;
  // Positions the sequence needs in the cache: its known tokens, but for one at max_total, whose
  // last token is never computed.
  static int Target(const Sequence& s);
  // Preempts the newest running sequence not in flight (there is one: the caller is scheduling
  // a sequence that is not), taking any entry it has out of `plan` (and its tokens back into
  // `budget`). Returns its id.
  SeqId PreemptNewest(StepPlan& plan, int& budget);
  void ScheduleDecodes(StepPlan& plan, int& budget);
  void ScheduleRunningChunks(StepPlan& plan, int& budget);
  void Admit(StepPlan& plan, int& budget, bool prefill_in_flight);

  SchedulerLimits limits_;
  KvBlockPool pool_;
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<SeqId> running_;  // admission order, newest last
  std::deque<SeqId> waiting_;
  uint64_t step_ = 0;
  std::deque<uint64_t> outstanding_;  // the non-empty plans not Completed yet, oldest first
  int64_t preemptions_ = 0;
};

}  // namespace shardline::serving
