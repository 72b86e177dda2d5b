// The continuous-batching scheduler and its KV block pool (worker/serving/batch_scheduler.h,
// kv_block_pool.h), with no model: a small driver plays the engine (Schedule, Complete, then a
// token or Finish for each sampled entry). Cases for FIFO admission, the token budget with decodes
// first, chunked prefill, max_running, admission by free blocks, recompute preemption and Finish;
// then a seeded random simulation that checks every invariant of the header after every step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "worker/serving/batch_scheduler.h"
#include "worker/serving/kv_block_pool.h"

namespace shardline::serving {

// For gtest's messages (found by argument-dependent lookup, so not in the anonymous namespace).
void PrintTo(const StepEntry& e, std::ostream* os) {
  *os << "{" << e.id << ", " << e.start << ", " << e.count << (e.sample ? ", sample}" : "}");
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

BatchScheduler Make(SchedulerLimits limits) {
  absl::StatusOr<BatchScheduler> s = BatchScheduler::Create(limits);
  if (!s.ok()) {
    ADD_FAILURE() << s.status();
    limits = {.num_blocks = 1, .max_context = 2};
    s = BatchScheduler::Create(limits);
  }
  return std::move(*s);
}

// Plays the engine: after each step, a sampled sequence gets its token, or is Finished once it
// has max_tokens of them.
class Driver {
 public:
  explicit Driver(BatchScheduler& s) : s_(s) {}

  absl::Status Add(SeqId id, int prompt_len, int max_tokens) {
    absl::Status status = s_.Add(id, prompt_len, max_tokens);
    if (status.ok()) max_tokens_[id] = max_tokens;
    return status;
  }
  StepPlan Step() {
    StepPlan plan = s_.Schedule();
    s_.Complete(plan);
    Sampled(plan);
    return plan;
  }
  void Sampled(const StepPlan& plan) {
    for (const StepEntry& e : plan.entries) {
      if (!e.sample || !max_tokens_.contains(e.id)) continue;
      if (++generated_[e.id] == max_tokens_[e.id]) {
        s_.Finish(e.id);
        max_tokens_.erase(e.id);
        finished_.push_back(e.id);
      } else {
        s_.AppendToken(e.id);
      }
    }
  }
  int generated(SeqId id) const { return generated_.contains(id) ? generated_.at(id) : 0; }
  const std::vector<SeqId>& finished() const { return finished_; }

 private:
  BatchScheduler& s_;
  std::map<SeqId, int> max_tokens_;
  std::map<SeqId, int> generated_;
  std::vector<SeqId> finished_;
};

// The header's invariants between steps (no plan outstanding).
void ExpectInvariants(const BatchScheduler& s) {
  const SchedulerLimits& l = s.limits();
  std::set<int32_t> owned;
  int owned_count = 0;
  EXPECT_LE(s.running(), l.max_running);
  int prefilling = 0;
  for (size_t i = 0; i < s.running_ids().size(); ++i) {
    const SeqId id = s.running_ids()[i];
    const std::optional<SeqInfo> info = s.Info(id);
    ASSERT_TRUE(info.has_value()) << id;
    EXPECT_EQ(info->state, SeqState::kRunning) << id;
    EXPECT_LE(info->computed, info->known) << id;
    EXPECT_LE(info->known, info->max_total) << id;
    EXPECT_LE(info->max_total, l.max_context) << id;
    const std::span<const int32_t> table = s.BlockTable(id);
    EXPECT_EQ(static_cast<int>(table.size()), info->blocks) << id;
    EXPECT_EQ(info->blocks, CeilDiv(info->computed, l.block_size))
        << "sequence " << id << " with " << info->computed << " positions";
    for (const int32_t b : table) {
      EXPECT_GE(b, 0);
      EXPECT_LT(b, l.num_blocks);
      EXPECT_TRUE(owned.insert(b).second) << "block " << b << " owned twice";
      ++owned_count;
    }
    if (info->computed < info->known - 1) {
      ++prefilling;
      EXPECT_EQ(i, s.running_ids().size() - 1) << "a prefilling sequence that is not the newest";
    }
  }
  EXPECT_LE(prefilling, 1);
  EXPECT_EQ(owned_count + s.free_blocks(), l.num_blocks);
  for (const SeqId id : s.waiting_ids()) {
    const std::optional<SeqInfo> info = s.Info(id);
    ASSERT_TRUE(info.has_value()) << id;
    EXPECT_EQ(info->state, SeqState::kWaiting) << id;
    EXPECT_EQ(info->computed, 0) << id;
    EXPECT_EQ(info->blocks, 0) << id;
    EXPECT_TRUE(s.BlockTable(id).empty()) << id;
  }
  EXPECT_EQ(s.waiting(), static_cast<int>(s.waiting_ids().size()));
}

// ---- KvBlockPool ----

TEST(KvBlockPoolTest, HandsOutTheLowestFreeBlocksOrNone) {
  KvBlockPool pool(4);
  EXPECT_EQ(pool.num_blocks(), 4);
  EXPECT_EQ(pool.free_blocks(), 4);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(2, a));
  EXPECT_THAT(a, ElementsAre(0, 1));
  EXPECT_TRUE(pool.allocated(1));
  EXPECT_FALSE(pool.allocated(2));
  std::vector<int32_t> b = {7};  // appended to, not replaced
  EXPECT_FALSE(pool.Allocate(3, b));
  EXPECT_THAT(b, ElementsAre(7));
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_TRUE(pool.Allocate(0, b));
  ASSERT_TRUE(pool.Allocate(2, b));
  EXPECT_THAT(b, ElementsAre(7, 2, 3));
  EXPECT_EQ(pool.free_blocks(), 0);
  EXPECT_FALSE(pool.Allocate(1, b));
}

TEST(KvBlockPoolTest, FreedBlocksComeBackLowestFirst) {
  KvBlockPool pool(6);
  std::vector<int32_t> all;
  ASSERT_TRUE(pool.Allocate(6, all));
  const std::vector<int32_t> give_back = {4, 1, 3};
  pool.Free(give_back);
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_FALSE(pool.allocated(4));
  std::vector<int32_t> again;
  ASSERT_TRUE(pool.Allocate(2, again));
  EXPECT_THAT(again, ElementsAre(1, 3));
  ASSERT_TRUE(pool.Allocate(1, again));
  EXPECT_THAT(again, ElementsAre(1, 3, 4));
  pool.Free(again);
  pool.Free(std::vector<int32_t>{0, 2, 5});
  EXPECT_EQ(pool.free_blocks(), 6);
}

TEST(KvBlockPoolDeathTest, FreeingABlockThatIsNotAllocatedAborts) {
  KvBlockPool pool(3);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(2, a));
  pool.Free(std::vector<int32_t>{0});
  EXPECT_DEATH(pool.Free(std::vector<int32_t>{0}), "block 0 of 3 is not allocated");
  EXPECT_DEATH(pool.Free(std::vector<int32_t>{1, 1}), "block 1 of 3 is not allocated");
  EXPECT_DEATH(pool.Free(std::vector<int32_t>{2}), "block 2 of 3 is not allocated");
  EXPECT_DEATH(pool.Free(std::vector<int32_t>{3}), "block 3 of 3 is not allocated");
  EXPECT_DEATH(pool.Free(std::vector<int32_t>{-1}), "block -1 of 3 is not allocated");
}

// ---- Limits and Add ----

TEST(BatchSchedulerTest, CreateRefusesLimitsOutOfRangeNamingTheField) {
  const SchedulerLimits good{.max_running = 4,
                             .max_tokens_per_step = 16,
                             .block_size = 4,
                             .num_blocks = 8,
                             .max_queue = 4,
                             .max_context = 32};
  EXPECT_TRUE(BatchScheduler::Create(good).ok());
  struct Case {
    SchedulerLimits limits;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({good, "max_running"});
  cases.back().limits.max_running = 0;
  cases.push_back({good, "block_size"});
  cases.back().limits.block_size = 0;
  cases.push_back({good, "num_blocks"});
  cases.back().limits.num_blocks = 0;
  cases.push_back({good, "max_queue"});
  cases.back().limits.max_queue = -1;
  cases.push_back({good, "max_context"});
  cases.back().limits.max_context = 1;
  cases.push_back({good, "max_in_flight"});
  cases.back().limits.max_in_flight = 0;
  cases.push_back({good, "max_tokens_per_step (3) must be >= max_running (4)"});
  cases.back().limits.max_tokens_per_step = 3;
  for (const Case& c : cases) {
    const absl::StatusOr<BatchScheduler> s = BatchScheduler::Create(c.limits);
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr(c.field));
  }
}

TEST(BatchSchedulerTest, AddRefusesWhatItCannotRun) {
  BatchScheduler s = Make({.max_running = 2,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 4,
                           .max_queue = 2,
                           .max_context = 32});
  absl::Status st = s.Add(1, 30, 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("prompt_len 30 + max_tokens 10 = 40 is past max_context 32"));
  EXPECT_EQ(s.Add(1, 0, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Add(1, 4, 0).code(), absl::StatusCode::kInvalidArgument);
  // 4 blocks of 4 positions: 17 positions (18 tokens, the last never computed) never fit.
  st = s.Add(1, 10, 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("needs up to 5 KV blocks of 4 positions"));
  EXPECT_THAT(st.message(), HasSubstr("the pool's 4"));
  EXPECT_TRUE(s.Add(1, 10, 7).ok());  // 16 positions: exactly the pool
  EXPECT_EQ(s.Add(1, 2, 2).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(s.Add(2, 2, 2).ok());
  st = s.Add(3, 2, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("2 sequences"));
  EXPECT_EQ(s.waiting(), 2);
  EXPECT_FALSE(s.Info(3).has_value());

  Driver d(s);
  d.Step();  // both admitted: the queue has room again
  EXPECT_EQ(s.waiting(), 0);
  EXPECT_EQ(s.running(), 2);
  EXPECT_EQ(s.Add(1, 2, 2).code(), absl::StatusCode::kAlreadyExists);  // running counts too
  EXPECT_TRUE(s.Add(3, 2, 2).ok());
  s.Finish(1);
  EXPECT_TRUE(s.Add(1, 2, 2).ok());  // a finished id may come back
}

// ---- Scheduling ----

TEST(BatchSchedulerTest, AdmitsInFifoOrderUpToMaxRunning) {
  BatchScheduler s = Make({.max_running = 3,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 32,
                           .max_queue = 8,
                           .max_context = 32});
  Driver d(s);
  for (SeqId id : {50, 20, 40, 10, 30}) ASSERT_TRUE(d.Add(id, 3, 8).ok());
  StepPlan plan = s.Schedule();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{50, 0, 3, true}, StepEntry{20, 0, 3, true},
                                        StepEntry{40, 0, 3, true}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kMaxRunning);
  EXPECT_EQ(s.running(), 3);
  EXPECT_THAT(s.waiting_ids(), ElementsAre(10, 30));
  s.Complete(plan);
  d.Sampled(plan);

  s.Finish(20);
  plan = d.Step();
  // The running ones decode first; then the head of the queue takes the freed place.
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{50, 3, 1, true}, StepEntry{40, 3, 1, true},
                                        StepEntry{10, 0, 3, true}));
  EXPECT_THAT(s.running_ids(), ElementsAre(50, 40, 10));
  EXPECT_THAT(s.waiting_ids(), ElementsAre(30));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kMaxRunning);
  ExpectInvariants(s);
}

TEST(BatchSchedulerTest, DecodesComeFirstAndTheBudgetIsNeverExceeded) {
  BatchScheduler s = Make({.max_running = 5,
                           .max_tokens_per_step = 10,
                           .block_size = 4,
                           .num_blocks = 32,
                           .max_queue = 8,
                           .max_context = 64});
  Driver d(s);
  for (SeqId id : {1, 2, 3}) ASSERT_TRUE(d.Add(id, 2, 20).ok());
  StepPlan plan = d.Step();
  EXPECT_EQ(plan.total_tokens(), 6);
  ASSERT_TRUE(d.Add(4, 20, 4).ok());
  ASSERT_TRUE(d.Add(5, 1, 4).ok());
  plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 2, 1, true}, StepEntry{2, 2, 1, true},
                                        StepEntry{3, 2, 1, true}, StepEntry{4, 0, 7, false}));
  EXPECT_EQ(plan.total_tokens(), 10);
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kBudget);  // 5 waits for budget
  plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 3, 1, true}, StepEntry{2, 3, 1, true},
                                        StepEntry{3, 3, 1, true}, StepEntry{4, 7, 7, false}));
  EXPECT_EQ(s.waiting(), 1);
  plan = d.Step();
  // 4's last chunk leaves one token: 5's whole prompt.
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 4, 1, true}, StepEntry{2, 4, 1, true},
                                        StepEntry{3, 4, 1, true}, StepEntry{4, 14, 6, true},
                                        StepEntry{5, 0, 1, true}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kNone);
  EXPECT_EQ(plan.total_tokens(), 10);
  plan = d.Step();
  EXPECT_EQ(plan.total_tokens(), 5);
  EXPECT_EQ(s.running(), 5);
  ExpectInvariants(s);
}

TEST(BatchSchedulerTest, ALongPromptIsChunkedAndSamplesOnlyOnItsLastChunk) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 32,
                           .block_size = 16,
                           .num_blocks = 16,
                           .max_queue = 8,
                           .max_context = 128});
  Driver d(s);
  ASSERT_TRUE(d.Add(7, 100, 3).ok());
  const std::vector<StepEntry> chunks = {
      {7, 0, 32, false}, {7, 32, 32, false}, {7, 64, 32, false}, {7, 96, 4, true}};
  const std::vector<int> blocks = {2, 4, 6, 7};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const StepPlan plan = s.Schedule();
    EXPECT_THAT(plan.entries, ElementsAre(chunks[i])) << "step " << i;
    // Blocks for the positions this step computes, no more.
    EXPECT_EQ(s.BlockTable(7).size(), static_cast<size_t>(blocks[i])) << "step " << i;
    s.Complete(plan);
    d.Sampled(plan);
    EXPECT_EQ(s.Info(7)->computed, chunks[i].start + chunks[i].count);
    ExpectInvariants(s);
  }
  EXPECT_EQ(d.generated(7), 1);
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{7, 100, 1, true}));
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{7, 101, 1, true}));
  EXPECT_THAT(d.finished(), ElementsAre(7));
  EXPECT_EQ(s.free_blocks(), 16);
  EXPECT_TRUE(s.Schedule().empty());
}

TEST(BatchSchedulerTest, APartialPrefillContinuesBeforeNewSequencesAreAdmitted) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 32,
                           .block_size = 8,
                           .num_blocks = 32,
                           .max_queue = 8,
                           .max_context = 128});
  Driver d(s);
  ASSERT_TRUE(d.Add(1, 80, 2).ok());
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{1, 0, 32, false}));
  ASSERT_TRUE(d.Add(2, 4, 2).ok());
  StepPlan plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 32, 32, false}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kBudget);
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{1, 64, 16, true}, StepEntry{2, 0, 4, true}));
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{1, 80, 1, true}, StepEntry{2, 4, 1, true}));
  EXPECT_THAT(d.finished(), ElementsAre(1, 2));
}

TEST(BatchSchedulerTest, TheQueueHeadWaitsForBlocksAndNoOneOvertakesIt) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 4,
                           .max_queue = 8,
                           .max_context = 16});
  Driver d(s);
  ASSERT_TRUE(d.Add(1, 12, 4).ok());  // 3 blocks now, 4 at most
  ASSERT_TRUE(d.Add(2, 8, 1).ok());   // 2 blocks: only 1 is free
  ASSERT_TRUE(d.Add(3, 2, 1).ok());   // 1 block would fit, but 2 is ahead of it
  StepPlan plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 0, 12, true}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kBlocks);
  EXPECT_EQ(s.free_blocks(), 1);
  EXPECT_THAT(s.waiting_ids(), ElementsAre(2, 3));
  s.Finish(1);  // cancelled while running: its blocks come back
  EXPECT_EQ(s.free_blocks(), 4);
  EXPECT_EQ(s.running(), 0);
  plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{2, 0, 8, true}, StepEntry{3, 0, 2, true}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kNone);
  EXPECT_THAT(d.finished(), ElementsAre(2, 3));
  EXPECT_EQ(s.free_blocks(), 4);
}

TEST(BatchSchedulerTest, WhenThePoolRunsDryTheNewestIsPreemptedAndRecomputes) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 4,
                           .max_queue = 8,
                           .max_context = 32});
  Driver d(s);
  ASSERT_TRUE(d.Add(1, 4, 8).ok());  // up to 11 positions: 3 blocks
  ASSERT_TRUE(d.Add(2, 4, 8).ok());
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{1, 0, 4, true}, StepEntry{2, 0, 4, true}));
  ASSERT_TRUE(d.Add(3, 1, 1).ok());
  // Positions 4..7: each takes a second block in the first of these steps; 3 finds none free.
  for (int pos = 4; pos < 8; ++pos) {
    const StepPlan plan = d.Step();
    EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, pos, 1, true}, StepEntry{2, pos, 1, true}));
    EXPECT_EQ(plan.admission_stop, AdmissionStop::kBlocks);
    ExpectInvariants(s);
  }
  EXPECT_EQ(s.free_blocks(), 0);
  EXPECT_EQ(s.Info(2)->known, 9);
  const std::vector<int32_t> blocks_of_2(s.BlockTable(2).begin(), s.BlockTable(2).end());

  // Position 8 needs a third block: 1 preempts 2, the newest, which goes back ahead of 3.
  StepPlan plan = s.Schedule();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 8, 1, true}));
  EXPECT_THAT(plan.preempted, ElementsAre(2));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kPreempted);
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_THAT(s.waiting_ids(), ElementsAre(2, 3));
  EXPECT_THAT(s.running_ids(), ElementsAre(1));
  EXPECT_TRUE(s.BlockTable(2).empty());
  EXPECT_EQ(s.Info(2)->state, SeqState::kWaiting);
  EXPECT_EQ(s.Info(2)->computed, 0);
  EXPECT_EQ(s.Info(2)->known, 9);  // its prompt and the 5 tokens it generated
  EXPECT_EQ(s.free_blocks(), 1);   // 2's two blocks came back; 1 took one of them
  EXPECT_TRUE(std::find(blocks_of_2.begin(), blocks_of_2.end(), s.BlockTable(1).back()) !=
              blocks_of_2.end());
  s.Complete(plan);
  d.Sampled(plan);
  ExpectInvariants(s);

  // 2 needs 3 blocks to recompute its 9 tokens: it waits until 1 finishes.
  plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 9, 1, true}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kBlocks);
  plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 10, 1, true}));
  EXPECT_THAT(d.finished(), ElementsAre(1));
  EXPECT_EQ(d.generated(1), 8);
  EXPECT_EQ(s.free_blocks(), 4);

  plan = d.Step();  // the prompt and generated tokens, at once; then 3 behind it
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{2, 0, 9, true}, StepEntry{3, 0, 1, true}));
  for (int pos = 9; pos < 11; ++pos) {
    EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{2, pos, 1, true}));
  }
  EXPECT_THAT(d.finished(), ElementsAre(1, 3, 2));
  EXPECT_EQ(d.generated(2), 8);
  EXPECT_EQ(s.free_blocks(), 4);
  EXPECT_EQ(s.preemptions(), 1);
}

TEST(BatchSchedulerTest, TheNewestPreemptsItselfWhenItNeedsABlock) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 2,
                           .max_queue = 8,
                           .max_context = 8});
  Driver d(s);
  ASSERT_TRUE(d.Add(1, 2, 6).ok());  // 7 positions at most: 2 blocks
  ASSERT_TRUE(d.Add(2, 4, 2).ok());  // 5 positions at most: 2 blocks
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{1, 0, 2, true}, StepEntry{2, 0, 4, true}));
  EXPECT_EQ(s.free_blocks(), 0);
  // 2's position 4 needs a block; none is free and 2 is the newest.
  StepPlan plan = s.Schedule();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 2, 1, true}));
  EXPECT_THAT(plan.preempted, ElementsAre(2));
  EXPECT_THAT(s.waiting_ids(), ElementsAre(2));
  EXPECT_EQ(s.free_blocks(), 1);
  s.Complete(plan);
  d.Sampled(plan);
  for (int pos = 3; pos < 7; ++pos) {
    plan = d.Step();
    EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, pos, 1, true}));
    // 2 needs 2 blocks for its 5 known tokens: 1 holds one, then both.
    EXPECT_EQ(plan.admission_stop, AdmissionStop::kBlocks);
  }
  EXPECT_THAT(d.finished(), ElementsAre(1));
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{2, 0, 5, true}));
  EXPECT_THAT(d.finished(), ElementsAre(1, 2));
  EXPECT_EQ(d.generated(2), 2);
  EXPECT_EQ(s.free_blocks(), 2);
}

TEST(BatchSchedulerTest, AChunkShortOfBlocksShrinksOrPreemptsItself) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 8,
                           .block_size = 2,
                           .num_blocks = 6,
                           .max_queue = 8,
                           .max_context = 12});
  Driver d(s);
  ASSERT_TRUE(d.Add(1, 2, 5).ok());   // up to 6 positions: 3 blocks
  ASSERT_TRUE(d.Add(2, 10, 1).ok());  // 10 positions: 5 blocks
  EXPECT_THAT(d.Step().entries, ElementsAre(StepEntry{1, 0, 2, true}, StepEntry{2, 0, 6, false}));
  EXPECT_EQ(s.free_blocks(), 2);
  // 1's decode takes a block; 2's chunk gets the one left (2 positions of the 4 due).
  StepPlan plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 2, 1, true}, StepEntry{2, 6, 2, false}));
  EXPECT_EQ(plan.admission_stop, AdmissionStop::kNone);
  EXPECT_EQ(s.free_blocks(), 0);
  ExpectInvariants(s);
  // 1 fits its position 3 in its block; 2 has no room at all and is the newest.
  plan = d.Step();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{1, 3, 1, true}));
  EXPECT_THAT(plan.preempted, ElementsAre(2));
  EXPECT_EQ(s.free_blocks(), 4);
  ExpectInvariants(s);
  while (s.running() + s.waiting() > 0) {
    ASSERT_FALSE(d.Step().empty());
    ExpectInvariants(s);
  }
  EXPECT_THAT(d.finished(), ElementsAre(1, 2));
}

TEST(BatchSchedulerTest, FinishRemovesWaitingRunningAndIgnoresUnknownIds) {
  BatchScheduler s = Make({.max_running = 2,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 8,
                           .max_queue = 8,
                           .max_context = 32});
  Driver d(s);
  for (SeqId id : {1, 2, 3, 4}) ASSERT_TRUE(d.Add(id, 5, 4).ok());
  d.Step();
  EXPECT_THAT(s.running_ids(), ElementsAre(1, 2));
  EXPECT_EQ(s.free_blocks(), 4);
  s.Finish(3);  // waiting
  EXPECT_THAT(s.waiting_ids(), ElementsAre(4));
  EXPECT_FALSE(s.Info(3).has_value());
  s.Finish(1);  // running
  EXPECT_THAT(s.running_ids(), ElementsAre(2));
  EXPECT_EQ(s.free_blocks(), 6);
  EXPECT_TRUE(s.BlockTable(1).empty());
  s.Finish(99);  // unknown
  s.Finish(1);   // already finished
  EXPECT_EQ(s.running() + s.waiting(), 2);
  ExpectInvariants(s);

  // Cancelled while its step runs: Complete skips it, and its blocks are free at once.
  StepPlan plan = s.Schedule();
  EXPECT_THAT(plan.entries, ElementsAre(StepEntry{2, 5, 1, true}, StepEntry{4, 0, 5, true}));
  s.Finish(4);
  EXPECT_EQ(s.free_blocks(), 6);
  s.Complete(plan);
  s.Finish(2);
  EXPECT_EQ(s.free_blocks(), 8);
  EXPECT_TRUE(s.Schedule().empty());
}

TEST(BatchSchedulerDeathTest, CallsOutOfTheStepOrderAbort) {
  BatchScheduler s = Make({.max_running = 2,
                           .max_tokens_per_step = 64,
                           .block_size = 4,
                           .num_blocks = 8,
                           .max_queue = 8,
                           .max_context = 32});
  ASSERT_TRUE(s.Add(1, 5, 2).ok());
  EXPECT_DEATH(s.AppendToken(1), "not a running sequence with a sample due");
  const StepPlan plan = s.Schedule();
  EXPECT_DEATH(s.Schedule(), "Schedule before step 1 is Completed");
  EXPECT_DEATH(s.AppendToken(1), "not a running sequence with a sample due");
  s.Complete(plan);
  EXPECT_DEATH(s.Complete(plan), "Complete of step 1, but no step is outstanding");
  s.AppendToken(1);
  EXPECT_DEATH(s.AppendToken(1), "not a running sequence with a sample due");
  const StepPlan next = s.Schedule();
  EXPECT_DEATH(s.Complete(plan), "Complete of step 1, but the oldest outstanding is 2");
  StepPlan forged = next;
  forged.entries[0].count = 2;
  EXPECT_DEATH(s.Complete(forged), "is not its planned work");
  s.Complete(next);
  s.AppendToken(1);  // its 2nd token: max_total reached
  EXPECT_TRUE(s.Schedule().empty()) << "a sequence at max_total has nothing to compute";
  EXPECT_DEATH(s.AppendToken(1), "not a running sequence with a sample due");
}

// ---- A long random run ----

struct SimConfig {
  uint32_t seed;
  double arrivals;  // per step, on average (0..2)
  SchedulerLimits limits;
};
void PrintTo(const SimConfig& c, std::ostream* os) { *os << "seed " << c.seed; }

class BatchSchedulerSimulationTest : public ::testing::TestWithParam<SimConfig> {};

// Random arrivals (prompt lengths, max_tokens), stops and cancels (some while the step runs),
// for thousands of steps, then a drain. After each Schedule the plan is held against a model of
// every sequence; after each step the header's invariants are checked.
TEST_P(BatchSchedulerSimulationTest, KeepsEveryInvariantAndFinishesEverySequence) {
  const SimConfig& config = GetParam();
  const SchedulerLimits& l = config.limits;
  BatchScheduler s = Make(l);
  std::mt19937 rng(config.seed);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };

  struct Model {
    int known = 0;
    int max_total = 0;
    int computed = 0;
    bool running = false;
    bool admitted_once = false;
  };
  std::map<SeqId, Model> live;
  std::vector<SeqId> added_order;       // accepted by Add
  std::vector<SeqId> first_admissions;  // in the order they first ran
  std::set<SeqId> cancelled_unadmitted;
  SeqId next_id = 1;
  int64_t finished = 0, cancelled = 0, refused_full = 0, chunked = 0;
  int max_prompt = std::min(l.max_context - 1, l.num_blocks * l.block_size);

  auto cancel_random = [&] {
    if (live.empty()) return;
    auto it = live.begin();
    std::advance(it, uniform(0, static_cast<int>(live.size()) - 1));
    if (!it->second.admitted_once) cancelled_unadmitted.insert(it->first);
    s.Finish(it->first);
    live.erase(it);
    ++cancelled;
  };

  const int kSteps = 10000;
  const int kMaxDrain = 100000;
  for (int step = 0; step < kSteps + kMaxDrain; ++step) {
    SCOPED_TRACE(::testing::Message() << "seed " << config.seed << " step " << step);
    const bool arriving = step < kSteps;
    if (!arriving && live.empty()) break;
    if (arriving) {
      for (int n = chance(config.arrivals / 2) + chance(config.arrivals / 2); n > 0; --n) {
        const int prompt = chance(0.2) ? uniform(1, max_prompt) : uniform(1, 8);
        const int room = std::min(l.max_context, l.num_blocks * l.block_size + 1) - prompt;
        const int max_tokens = uniform(1, std::min(room, 24));
        const SeqId id = next_id++;
        const absl::Status st = s.Add(id, prompt, max_tokens);
        if (st.code() == absl::StatusCode::kResourceExhausted) {
          EXPECT_GE(s.waiting(), l.max_queue);
          ++refused_full;
          continue;
        }
        ASSERT_TRUE(st.ok()) << st << " prompt " << prompt << " max_tokens " << max_tokens;
        live[id] = Model{.known = prompt, .max_total = prompt + max_tokens};
        added_order.push_back(id);
      }
      if (chance(0.01)) cancel_random();
    }

    const std::vector<SeqId> running_before = s.running_ids();
    const std::vector<SeqId> waiting_before = s.waiting_ids();
    const StepPlan plan = s.Schedule();
    if (!live.empty()) {
      ASSERT_FALSE(plan.empty()) << "a stall with " << live.size() << " left";
    }

    // The preempted are the newest running, newest first, now at the queue's front.
    ASSERT_LE(plan.preempted.size(), running_before.size());
    for (size_t i = 0; i < plan.preempted.size(); ++i) {
      ASSERT_EQ(plan.preempted[i], running_before[running_before.size() - 1 - i]);
      Model& m = live.at(plan.preempted[i]);
      m.running = false;
      m.computed = 0;
    }
    const std::vector<SeqId> waiting_now = s.waiting_ids();
    for (size_t i = 0; i < plan.preempted.size(); ++i) {
      ASSERT_EQ(waiting_now[i], plan.preempted[plan.preempted.size() - 1 - i]);
    }
    // Entries: within the budget, one per sequence, decodes of the running first and in running
    // order, then at most one chunk of a running sequence, then admissions from the queue's head.
    EXPECT_LE(plan.total_tokens(), l.max_tokens_per_step);
    std::set<SeqId> seen;
    size_t e = 0;
    size_t last_running_index = 0;
    auto index_in_running = [&](SeqId id) {
      return static_cast<size_t>(std::find(running_before.begin(), running_before.end(), id) -
                                 running_before.begin());
    };
    for (; e < plan.entries.size(); ++e) {  // decodes
      const StepEntry& x = plan.entries[e];
      const size_t index = index_in_running(x.id);
      if (index == running_before.size() || x.count != 1) break;
      ASSERT_TRUE(e == 0 || index > last_running_index) << "decodes out of running order";
      last_running_index = index;
    }
    int running_chunks = 0;
    for (; e < plan.entries.size(); ++e) {
      if (index_in_running(plan.entries[e].id) == running_before.size()) break;
      ++running_chunks;
      ASSERT_GT(plan.entries[e].count, 1) << "a decode after a chunk";
    }
    EXPECT_LE(running_chunks, 1);
    const size_t admissions = plan.entries.size() - e;
    if (!plan.preempted.empty()) {
      EXPECT_EQ(admissions, 0u) << "admitted in a preempting step";
    }
    for (size_t a = 0; a < admissions; ++a, ++e) {
      ASSERT_LT(a, waiting_before.size());
      EXPECT_EQ(plan.entries[e].id, waiting_before[a]) << "not admitted in FIFO order";
      EXPECT_EQ(plan.entries[e].start, 0);
    }
    if (!running_before.empty() && std::find(plan.preempted.begin(), plan.preempted.end(),
                                             running_before.front()) == plan.preempted.end()) {
      // The oldest running sequence always makes progress.
      EXPECT_TRUE(std::any_of(plan.entries.begin(), plan.entries.end(),
                              [&](const StepEntry& x) { return x.id == running_before.front(); }));
    }
    for (const StepEntry& x : plan.entries) {
      ASSERT_TRUE(seen.insert(x.id).second) << "two entries for " << x.id;
      Model& m = live.at(x.id);
      EXPECT_EQ(x.start, m.computed) << x.id;
      EXPECT_GE(x.count, 1);
      EXPECT_LE(x.start + x.count, m.known);
      EXPECT_EQ(x.sample, x.start + x.count == m.known);
      if (!m.running) {
        m.running = true;
        if (!m.admitted_once) first_admissions.push_back(x.id);
        m.admitted_once = true;
      }
      if (!x.sample) ++chunked;
      // Blocks for exactly the positions the cache will hold after the step.
      EXPECT_EQ(static_cast<int>(s.BlockTable(x.id).size()),
                CeilDiv(x.start + x.count, l.block_size));
    }
    EXPECT_LE(s.running(), l.max_running);

    // Sometimes a cancel lands while the step runs.
    if (arriving && chance(0.01)) cancel_random();
    s.Complete(plan);
    for (const StepEntry& x : plan.entries) {
      auto it = live.find(x.id);
      if (it == live.end()) continue;
      it->second.computed = x.start + x.count;
      if (!x.sample) continue;
      // The sampled token: a stop now and then, else the length limit.
      if (it->second.known + 1 == it->second.max_total || chance(0.03)) {
        s.Finish(x.id);
        live.erase(it);
        ++finished;
      } else {
        s.AppendToken(x.id);
        ++it->second.known;
      }
    }
    ExpectInvariants(s);
    for (const auto& [id, m] : live) {
      const std::optional<SeqInfo> info = s.Info(id);
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->known, m.known);
      EXPECT_EQ(info->computed, m.computed);
      EXPECT_EQ(info->state == SeqState::kRunning, m.running);
    }
    if (HasFailure()) return;
  }
  EXPECT_TRUE(live.empty()) << live.size() << " sequences never finished";
  EXPECT_EQ(s.running() + s.waiting(), 0);
  EXPECT_EQ(s.free_blocks(), l.num_blocks);
  // No one was passed over: first admissions follow Add order.
  std::vector<SeqId> expected;
  for (const SeqId id : added_order) {
    if (!cancelled_unadmitted.contains(id)) expected.push_back(id);
  }
  EXPECT_EQ(first_admissions, expected);
  EXPECT_GT(finished, 500);
  EXPECT_GT(refused_full, 0) << "the queue was never full";
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(chunked, 0) << "no prompt was chunked: the run tests less than it should";
  std::cout << "seed " << config.seed << ": " << added_order.size() << " added, " << finished
            << " finished, " << cancelled << " cancelled, " << refused_full << " refused (full), "
            << s.preemptions() << " preemptions, " << chunked << " partial chunks\n";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, BatchSchedulerSimulationTest,
    ::testing::Values(
        // A pool of barely one context: preemption all the time.
        SimConfig{1,
                  0.4,
                  {.max_running = 6,
                   .max_tokens_per_step = 16,
                   .block_size = 4,
                   .num_blocks = 16,
                   .max_queue = 16,
                   .max_context = 64}},
        // Blocks of one position, a budget equal to max_running.
        SimConfig{2,
                  0.25,
                  {.max_running = 4,
                   .max_tokens_per_step = 4,
                   .block_size = 1,
                   .num_blocks = 40,
                   .max_queue = 8,
                   .max_context = 40}},
        // Room for everyone: admission is limited by max_running and the budget.
        SimConfig{3,
                  1.2,
                  {.max_running = 8,
                   .max_tokens_per_step = 48,
                   .block_size = 16,
                   .num_blocks = 64,
                   .max_queue = 32,
                   .max_context = 96}},
        // Blocks larger than most prompts, one running sequence.
        SimConfig{4,
                  0.15,
                  {.max_running = 1,
                   .max_tokens_per_step = 7,
                   .block_size = 32,
                   .num_blocks = 2,
                   .max_queue = 4,
                   .max_context = 64}}));

// ---- Several plans in flight (pipeline stages) ----

TEST(BatchSchedulerTest, PlansInFlightTakeDisjointSequencesAndCompleteInOrder) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 32,
                           .block_size = 4,
                           .num_blocks = 32,
                           .max_queue = 8,
                           .max_context = 64,
                           .max_in_flight = 2});
  ASSERT_TRUE(s.Add(1, 3, 4).ok());
  ASSERT_TRUE(s.Add(2, 5, 4).ok());
  const StepPlan a = s.Schedule();
  EXPECT_THAT(a.entries, ElementsAre(StepEntry{1, 0, 3, true}, StepEntry{2, 0, 5, true}));
  EXPECT_EQ(s.in_flight(), 1);
  // Both are in flight: nothing for them, and an empty plan is not outstanding.
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_EQ(s.in_flight(), 1);
  ASSERT_TRUE(s.Add(3, 2, 4).ok());
  const StepPlan b = s.Schedule();
  EXPECT_THAT(b.entries, ElementsAre(StepEntry{3, 0, 2, true}));
  EXPECT_EQ(s.in_flight(), 2);
  EXPECT_EQ(s.Info(3)->blocks, 1);
  s.Complete(a);
  s.AppendToken(1);
  s.AppendToken(2);
  // 3 is still in flight; 1 and 2 decode.
  const StepPlan c = s.Schedule();
  EXPECT_THAT(c.entries, ElementsAre(StepEntry{1, 3, 1, true}, StepEntry{2, 5, 1, true}));
  s.Complete(b);
  s.AppendToken(3);
  s.Complete(c);
  EXPECT_EQ(s.in_flight(), 0);
  EXPECT_EQ(s.Info(1)->computed, 4);
  EXPECT_EQ(s.Info(3)->computed, 2);
}

TEST(BatchSchedulerTest, PlansInFlightShareTheRunningSequences) {
  // max_running 5 over 2 plans: 3 entries a plan at most, so the second plan is not left empty.
  BatchScheduler s = Make({.max_running = 5,
                           .max_tokens_per_step = 32,
                           .block_size = 4,
                           .num_blocks = 32,
                           .max_queue = 8,
                           .max_context = 64,
                           .max_in_flight = 2});
  for (SeqId id = 1; id <= 5; ++id) ASSERT_TRUE(s.Add(id, 2, 4).ok());
  const StepPlan a = s.Schedule();
  EXPECT_THAT(a.entries, ElementsAre(StepEntry{1, 0, 2, true}, StepEntry{2, 0, 2, true},
                                     StepEntry{3, 0, 2, true}));
  EXPECT_EQ(a.admission_stop, AdmissionStop::kBudget);
  const StepPlan b = s.Schedule();
  EXPECT_THAT(b.entries, ElementsAre(StepEntry{4, 0, 2, true}, StepEntry{5, 0, 2, true}));
  s.Complete(a);
  for (SeqId id = 1; id <= 3; ++id) s.AppendToken(id);
  const StepPlan c = s.Schedule();  // 4 and 5 are in flight
  EXPECT_THAT(c.entries, ElementsAre(StepEntry{1, 2, 1, true}, StepEntry{2, 2, 1, true},
                                     StepEntry{3, 2, 1, true}));
  s.Complete(b);
  s.Complete(c);
}

TEST(BatchSchedulerTest, APreemptionNeverTakesASequenceInFlight) {
  // 3 blocks of 2 positions; 1 (older) and 2 (newer) hold one each after their prompts. 2's
  // decode takes the last block and is in flight when 1's decode needs a block: 1 may not take
  // 2's, so it preempts itself, and 2's step completes with its blocks.
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 8,
                           .block_size = 2,
                           .num_blocks = 3,
                           .max_queue = 4,
                           .max_context = 6,
                           .max_in_flight = 2});
  ASSERT_TRUE(s.Add(1, 2, 3).ok());
  ASSERT_TRUE(s.Add(2, 2, 3).ok());
  const StepPlan prompts = s.Schedule();
  ASSERT_THAT(prompts.entries, ElementsAre(StepEntry{1, 0, 2, true}, StepEntry{2, 0, 2, true}));
  s.Complete(prompts);
  s.AppendToken(2);  // 1's token comes later (its plan is elsewhere in the pipeline)
  const StepPlan two = s.Schedule();
  ASSERT_THAT(two.entries, ElementsAre(StepEntry{2, 2, 1, true}));
  EXPECT_EQ(s.free_blocks(), 0);
  s.AppendToken(1);
  const StepPlan one = s.Schedule();
  EXPECT_THAT(one.preempted, ElementsAre(1));
  EXPECT_TRUE(one.entries.empty());
  EXPECT_EQ(s.Info(1)->state, SeqState::kWaiting);
  EXPECT_EQ(s.Info(2)->blocks, 2);
  s.Complete(two);  // undisturbed
  EXPECT_EQ(s.Info(2)->computed, 3);
  s.AppendToken(2);
  // 1 recomputes once 2 is done with the blocks.
  s.Finish(2);
  const StepPlan again = s.Schedule();
  EXPECT_THAT(again.entries, ElementsAre(StepEntry{1, 0, 3, true}));
  s.Complete(again);
}

TEST(BatchSchedulerTest, APrefillInFlightHoldsAdmissionsUntilItsLastChunk) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 8,
                           .block_size = 4,
                           .num_blocks = 16,
                           .max_queue = 4,
                           .max_context = 32,
                           .max_in_flight = 2});
  ASSERT_TRUE(s.Add(1, 12, 2).ok());
  const StepPlan a = s.Schedule();
  EXPECT_THAT(a.entries, ElementsAre(StepEntry{1, 0, 8, false}));
  ASSERT_TRUE(s.Add(2, 3, 2).ok());
  const StepPlan b = s.Schedule();  // 1's next chunk waits for a; 2 waits for 1's prefill
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.admission_stop, AdmissionStop::kPrefillInFlight);
  s.Complete(a);
  const StepPlan c = s.Schedule();  // 1's last chunk, then 2 in the budget left
  EXPECT_THAT(c.entries, ElementsAre(StepEntry{1, 8, 4, true}, StepEntry{2, 0, 3, true}));
  s.Complete(c);
}

TEST(BatchSchedulerDeathTest, PlansInFlightPastTheLimitOrOutOfOrderAbort) {
  BatchScheduler s = Make({.max_running = 4,
                           .max_tokens_per_step = 32,
                           .block_size = 4,
                           .num_blocks = 16,
                           .max_queue = 8,
                           .max_context = 32,
                           .max_in_flight = 2});
  ASSERT_TRUE(s.Add(1, 3, 2).ok());
  const StepPlan a = s.Schedule();
  ASSERT_TRUE(s.Add(2, 3, 2).ok());
  const StepPlan b = s.Schedule();
  ASSERT_FALSE(b.empty());
  ASSERT_TRUE(s.Add(3, 3, 2).ok());
  EXPECT_DEATH(s.Schedule(), "Schedule before step 1 is Completed \\(2 in flight, at most 2\\)");
  EXPECT_DEATH(s.Complete(b), "Complete of step 2, but the oldest outstanding is 1");
  s.Complete(a);
  s.Complete(b);
}

// A pipeline of `depth` stages: plans are Scheduled while fewer than depth are in flight and
// Completed oldest first, with random arrivals, stops and cancels (also of sequences in flight).
// After every call: no sequence is in two outstanding plans, no in-flight sequence is preempted,
// blocks are owned once and cover what each sequence computed or reserved, the budget holds;
// at the end every sequence finished and every block is free.
class BatchSchedulerPipelineTest : public ::testing::TestWithParam<int> {};

TEST_P(BatchSchedulerPipelineTest, KeepsThePlansInFlightDisjointAndFinishesEverySequence) {
  const int depth = GetParam();
  const SchedulerLimits l{.max_running = 6,
                          .max_tokens_per_step = 16,
                          .block_size = 4,
                          .num_blocks = 20,
                          .max_queue = 16,
                          .max_context = 64,
                          .max_in_flight = depth};
  BatchScheduler s = Make(l);
  std::mt19937 rng(40 + depth);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
  std::map<SeqId, int> remaining;   // live sequences: tokens still to sample
  std::map<SeqId, int> known;       // prompt + sampled so far
  std::deque<StepPlan> flight;
  std::set<SeqId> busy;             // sequences with an entry in an outstanding plan
  SeqId next_id = 1;
  int64_t finished = 0, preempted = 0, cancelled_in_flight = 0, steps = 0;
  const auto complete_oldest = [&] {
    StepPlan plan = std::move(flight.front());
    flight.pop_front();
    s.Complete(plan);
    for (const StepEntry& e : plan.entries) {
      busy.erase(e.id);
      if (!e.sample || !remaining.contains(e.id)) continue;
      if (--remaining[e.id] == 0 || chance(0.03)) {
        s.Finish(e.id);
        remaining.erase(e.id);
        ++finished;
      } else {
        s.AppendToken(e.id);
        ++known[e.id];
      }
    }
  };
  for (int step = 0; step < 20000; ++step) {
    SCOPED_TRACE(::testing::Message() << "depth " << depth << " step " << step);
    if (step < 15000 && chance(0.35)) {
      const int prompt = chance(0.2) ? uniform(1, 40) : uniform(1, 6);
      const int max_tokens = uniform(1, std::min(20, 64 - prompt));
      if (s.Add(next_id, prompt, max_tokens).ok()) {
        remaining[next_id] = max_tokens;
        known[next_id] = prompt;
      }
      ++next_id;
    }
    if (step >= 15000 && remaining.empty() && flight.empty()) break;
    if (chance(0.01) && !remaining.empty()) {  // a cancel, in flight or not
      auto it = remaining.begin();
      std::advance(it, uniform(0, static_cast<int>(remaining.size()) - 1));
      if (busy.contains(it->first)) ++cancelled_in_flight;
      s.Finish(it->first);
      remaining.erase(it);
    }
    if (static_cast<int>(flight.size()) < depth) {
      const std::vector<SeqId> running_before = s.running_ids();
      StepPlan plan = s.Schedule();
      ++steps;
      EXPECT_LE(plan.total_tokens(), l.max_tokens_per_step);
      for (const SeqId v : plan.preempted) {
        EXPECT_FALSE(busy.contains(v)) << "preempted " << v << " while in flight";
        ++preempted;
      }
      for (const StepEntry& e : plan.entries) {
        EXPECT_TRUE(busy.insert(e.id).second) << e.id << " in two plans in flight";
        EXPECT_LE(e.start + e.count, known[e.id]);
        EXPECT_EQ(e.sample, e.start + e.count == known[e.id]);
      }
      if (!plan.empty()) {
        flight.push_back(std::move(plan));
      } else if (!flight.empty()) {
        complete_oldest();  // nothing new to start: the pipeline moves on
      }
    } else {
      complete_oldest();
    }
    EXPECT_EQ(s.in_flight(), static_cast<int>(flight.size()));
    // Blocks: owned once, each running sequence holding those of its computed or reserved
    // positions (between ceil(computed/bs) and ceil(computed + the largest chunk)/bs).
    std::set<int32_t> owned;
    int owned_count = 0;
    for (const SeqId id : s.running_ids()) {
      const std::optional<SeqInfo> info = s.Info(id);
      ASSERT_TRUE(info.has_value());
      EXPECT_GE(info->blocks, CeilDiv(info->computed, l.block_size)) << id;
      if (!busy.contains(id)) EXPECT_EQ(info->blocks, CeilDiv(info->computed, l.block_size)) << id;
      for (const int32_t b : s.BlockTable(id)) {
        EXPECT_TRUE(owned.insert(b).second) << "block " << b << " owned twice";
        ++owned_count;
      }
    }
    EXPECT_EQ(owned_count + s.free_blocks(), l.num_blocks);
    if (HasFailure()) return;
  }
  EXPECT_TRUE(remaining.empty()) << remaining.size() << " sequences never finished";
  EXPECT_EQ(s.running() + s.waiting(), 0);
  EXPECT_EQ(s.free_blocks(), l.num_blocks);
  EXPECT_GT(finished, 1000);
  EXPECT_GT(preempted, 0) << "no preemption: the run tests less than it should";
  EXPECT_GT(cancelled_in_flight, 0);
  std::cout << "depth " << depth << ": " << steps << " plans, " << finished << " finished, "
            << preempted << " preemptions, " << cancelled_in_flight << " cancelled in flight\n";
}

INSTANTIATE_TEST_SUITE_P(Depths, BatchSchedulerPipelineTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace shardline::serving
