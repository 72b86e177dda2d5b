#include "worker/serving/batch_scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::serving {
namespace {

// For calls that break the contract in the header: the engine's bookkeeping is wrong, and going
// on would put positions in the wrong cache blocks.
[[noreturn]] void ContractViolation(const std::string& what) {
  std::fprintf(stderr, "BatchScheduler: %s\n", what.c_str());
  std::abort();
}

}  // namespace

std::string_view AdmissionStopName(AdmissionStop stop) {
  switch (stop) {
    case AdmissionStop::kNone:
      return "none";
    case AdmissionStop::kMaxRunning:
      return "max_running";
    case AdmissionStop::kBudget:
      return "token budget";
    case AdmissionStop::kBlocks:
      return "free blocks";
    case AdmissionStop::kPreempted:
      return "preempted this step";
    case AdmissionStop::kPrefillInFlight:
      return "a prefill in flight";
  }
  return "?";
}

int StepPlan::total_tokens() const {
  int total = 0;
  for (const StepEntry& e : entries) total += e.count;
  return total;
}

absl::StatusOr<BatchScheduler> BatchScheduler::Create(SchedulerLimits limits) {
  auto at_least = [](const char* field, int value, int min) -> absl::Status {
    if (value >= min) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler limits: ", field, " must be >= ", min, ", got ", value));
  };
  for (absl::Status s :
       {at_least("max_running", limits.max_running, 1),
        at_least("block_size", limits.block_size, 1), at_least("num_blocks", limits.num_blocks, 1),
        at_least("max_queue", limits.max_queue, 0),
        at_least("max_context", limits.max_context, 2),
        at_least("max_in_flight", limits.max_in_flight, 1)}) {
    if (!s.ok()) return s;
  }
  // Every running sequence's decode must fit one step, or the newest ones could wait for the
  // budget behind older decodes for as long as those run.
  if (limits.max_tokens_per_step < limits.max_running) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler limits: max_tokens_per_step (", limits.max_tokens_per_step,
                     ") must be >= max_running (", limits.max_running, ")"));
  }
  return BatchScheduler(limits);
}

BatchScheduler::BatchScheduler(SchedulerLimits limits)
    : limits_(limits), pool_(limits.num_blocks) {}

int BatchScheduler::BlocksFor(int positions) const {
  return (positions + limits_.block_size - 1) / limits_.block_size;
}

int BatchScheduler::Target(const Sequence& s) {
  return s.known < s.max_total ? s.known : s.known - 1;
}

absl::Status BatchScheduler::Add(SeqId id, int prompt_len, int max_tokens) {
  if (prompt_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_len must be >= 1, got ", prompt_len));
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  const int64_t total = int64_t{prompt_len} + max_tokens;
  if (total > limits_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_len ", prompt_len, " + max_tokens ",
                                                   max_tokens, " = ", total,
                                                   " is past max_context ", limits_.max_context));
  }
  // The last sampled token is never computed: total - 1 positions at most.
  const int blocks = BlocksFor(static_cast<int>(total) - 1);
  if (blocks > limits_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_len ", prompt_len, " + max_tokens ", max_tokens, " needs up to ",
                     blocks, " KV blocks of ", limits_.block_size,
                     " positions, more than the pool's ", limits_.num_blocks));
  }
  if (seqs_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", id));
  if (waiting() >= limits_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (", limits_.max_queue, " sequences)"));
  }
  Sequence s;
  s.known = prompt_len;
  s.max_total = static_cast<int>(total);
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
  return absl::OkStatus();
}

StepPlan BatchScheduler::Schedule() {
  if (in_flight() >= limits_.max_in_flight) {
    ContractViolation(absl::StrCat("Schedule before step ", outstanding_.front(),
                                   " is Completed (", in_flight(), " in flight, at most ",
                                   limits_.max_in_flight, ")"));
  }
  // A chunk of an earlier plan in flight that leaves prompt positions due: its next chunk comes
  // before newcomers.
  const bool prefill_in_flight = std::any_of(running_.begin(), running_.end(), [this](SeqId id) {
    const Sequence& s = seqs_.at(id);
    return s.in_flight() && Target(s) - s.reserved > 1;
  });
  StepPlan plan;
  plan.step = ++step_;
  int budget = limits_.max_tokens_per_step;
  ScheduleDecodes(plan, budget);
  ScheduleRunningChunks(plan, budget);
  if (!plan.preempted.empty()) {
    // As vLLM: the blocks just freed are for the running sequences; admitting now would take
    // them and let the victim be preempted again next step.
    plan.admission_stop = AdmissionStop::kPreempted;
  } else {
    Admit(plan, budget, prefill_in_flight);
  }
  if (!plan.empty()) outstanding_.push_back(plan.step);
  return plan;
}

SeqId BatchScheduler::PreemptNewest(StepPlan& plan, int& budget) {
  auto newest = std::find_if(running_.rbegin(), running_.rend(),
                             [this](SeqId id) { return !seqs_.at(id).in_flight(); });
  if (newest == running_.rend()) ContractViolation("a preemption with every sequence in flight");
  const SeqId victim = *newest;
  running_.erase(std::next(newest).base());
  Sequence& v = seqs_.at(victim);
  pool_.Free(v.blocks);
  v.blocks.clear();
  v.computed = 0;
  v.reserved = 0;
  v.running = false;
  waiting_.push_front(victim);
  // By the invariants a victim has no entry yet (step 1 goes oldest first and the victim is the
  // newest; in step 2 it is the chunk's own sequence); this keeps the plan right regardless.
  auto it = std::find_if(plan.entries.begin(), plan.entries.end(),
                         [victim](const StepEntry& e) { return e.id == victim; });
  if (it != plan.entries.end()) {
    budget += it->count;
    plan.entries.erase(it);
  }
  plan.preempted.push_back(victim);
  ++preemptions_;
  return victim;
}

int BatchScheduler::MaxEntries() const {
  return (limits_.max_running + limits_.max_in_flight - 1) / limits_.max_in_flight;
}

void BatchScheduler::ScheduleDecodes(StepPlan& plan, int& budget) {
  for (size_t i = 0; i < running_.size() && budget > 0 &&
                     static_cast<int>(plan.entries.size()) < MaxEntries();
       ++i) {
    const SeqId id = running_[i];
    Sequence& s = seqs_.at(id);
    if (s.in_flight() || Target(s) - s.computed != 1) continue;
    bool preempted_itself = false;
    while (static_cast<int>(s.blocks.size()) < BlocksFor(s.computed + 1) &&
           !pool_.Allocate(1, s.blocks)) {
      if (PreemptNewest(plan, budget) == id) {
        preempted_itself = true;
        break;
      }
    }
    if (preempted_itself) break;  // the newest out of flight: no one after it has work due
    s.reserved = s.computed + 1;
    plan.entries.push_back({id, s.computed, 1, s.reserved == s.known});
    --budget;
  }
}

void BatchScheduler::ScheduleRunningChunks(StepPlan& plan, int& budget) {
  const int bs = limits_.block_size;
  for (size_t i = 0; i < running_.size() && budget > 0 &&
                     static_cast<int>(plan.entries.size()) < MaxEntries();
       ++i) {
    const SeqId id = running_[i];
    Sequence& s = seqs_.at(id);
    const int due = Target(s) - s.computed;
    if (s.in_flight() || due <= 1) continue;  // in flight, nothing due, or a decode (step 1)
    int count = 0;
    while (true) {
      const int room = static_cast<int>(s.blocks.size()) * bs - s.computed + free_blocks() * bs;
      count = std::min({due, budget, room});
      if (count > 0) break;
      if (PreemptNewest(plan, budget) == id) break;
    }
    if (count == 0) break;  // it preempted itself: the newest out of flight
    const int need = BlocksFor(s.computed + count) - static_cast<int>(s.blocks.size());
    if (!pool_.Allocate(need, s.blocks)) ContractViolation("a chunk's blocks were counted free");
    s.reserved = s.computed + count;
    plan.entries.push_back({id, s.computed, count, s.reserved == s.known});
    budget -= count;
  }
}

void BatchScheduler::Admit(StepPlan& plan, int& budget, bool prefill_in_flight) {
  if (prefill_in_flight && !waiting_.empty()) {
    plan.admission_stop = AdmissionStop::kPrefillInFlight;
    return;
  }
  while (!waiting_.empty()) {
    if (running() >= limits_.max_running) {
      plan.admission_stop = AdmissionStop::kMaxRunning;
      return;
    }
    if (budget == 0 || static_cast<int>(plan.entries.size()) >= MaxEntries()) {
      plan.admission_stop = AdmissionStop::kBudget;
      return;
    }
    const SeqId id = waiting_.front();
    Sequence& s = seqs_.at(id);
    const int count = std::min(Target(s), budget);
    if (!pool_.Allocate(BlocksFor(count), s.blocks)) {
      plan.admission_stop = AdmissionStop::kBlocks;  // FIFO: no one behind it goes first
      return;
    }
    waiting_.pop_front();
    running_.push_back(id);
    s.running = true;
    s.reserved = count;
    plan.entries.push_back({id, 0, count, count == s.known});
    budget -= count;
  }
  plan.admission_stop = AdmissionStop::kNone;
}

void BatchScheduler::Complete(const StepPlan& plan) {
  if (plan.empty()) return;
  if (outstanding_.empty() || plan.step != outstanding_.front()) {
    ContractViolation(
        outstanding_.empty()
            ? absl::StrCat("Complete of step ", plan.step, ", but no step is outstanding")
            : absl::StrCat("Complete of step ", plan.step, ", but the oldest outstanding is ",
                           outstanding_.front()));
  }
  outstanding_.pop_front();
  for (const StepEntry& e : plan.entries) {
    auto it = seqs_.find(e.id);
    if (it == seqs_.end() || !it->second.running) continue;  // Finished since Schedule
    Sequence& s = it->second;
    if (e.start != s.computed || e.start + e.count != s.reserved) {
      ContractViolation(absl::StrCat("Complete: sequence ", e.id, " entry [", e.start, ", +",
                                     e.count, ") is not its planned work"));
    }
    s.computed = s.reserved;
  }
}

void BatchScheduler::AppendToken(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || !it->second.running || it->second.computed != it->second.known ||
      it->second.known >= it->second.max_total) {
    ContractViolation(
        absl::StrCat("AppendToken(", id, "): it is not a running sequence with a sample due"));
  }
  ++it->second.known;
}

void BatchScheduler::Finish(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  if (it->second.running) {
    pool_.Free(it->second.blocks);
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  seqs_.erase(it);
}

std::span<const int32_t> BatchScheduler::BlockTable(SeqId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

std::optional<SeqInfo> BatchScheduler::Info(SeqId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return std::nullopt;
  const Sequence& s = it->second;
  return SeqInfo{s.running ? SeqState::kRunning : SeqState::kWaiting, s.known, s.computed,
                 s.max_total, static_cast<int>(s.blocks.size())};
}

}  // namespace shardline::serving
