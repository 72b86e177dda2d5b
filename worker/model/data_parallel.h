// How one rank's training state lives under data parallelism, and how it stays in step with the
// other data-parallel ranks: the data-parallel strategy, which ShardedGpt chooses once (from
// parallel.zero) and then calls without knowing which it is. The engine's layers produce a unit's
// gradient and ask for a unit's parameters; the strategy decides where they live, when they are
// reduced or gathered, and which part of them this rank updates.
//
// The strategies are DeepSpeed's ZeRO stages over the units of shard_layout.h (a layer, an
// embedding table, the final norm, the head), each cut into dp shards of ceil(size / dp) elements,
// rank i owning [i·S, (i+1)·S) of every unit:
//   stage 0: parameters, gradients and AdamW moments whole; each unit's gradient all-reduced once,
//            after the last micro-batch's backward produced it;
//   stage 1: the moments sharded: each rank updates its shard of every unit, then all-gathers it;
//   stage 2: the gradients sharded too: each micro-batch's unit gradient is reduce-scattered into
//            the owned shard as soon as it is ready, and its buffer freed;
//   stage 3: the parameters sharded too: a unit is all-gathered just before each use (forward and
//            backward of every micro-batch) and freed right after.
// Under stages 0 and 1 the whole gradients are all-reduced in buckets (data_parallel.bucket_mb):
// runs of consecutive units, filled from the last unit back as the backward produces them, each
// reduced as soon as its last unit is ready, on the strategy's communication thread
// (comm_thread.h), so that the reductions overlap the rest of the backward pass, as DDP's buckets.
// With data_parallel.compression a bucket's reduction is exact inside each host and compressed
// between hosts (gradient_compression.h).
//
// DiLoCo (data_parallel.sync: diloco) is the other strategy: each data-parallel rank is a site
// that trains alone with its own AdamW (stage 0's state, no gradient crosses sites) and every
// `every` steps the sites average their parameters' change since the last sync and take one
// outer Nesterov step on it, fragment by fragment (DilocoStrategy in data_parallel.cc).
//
// One caller thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/train_state.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "kernels/cpu/optimizer.h"
#include "placement/data_parallel_spec.h"
#include "worker/comm/communicator.h"
#include "worker/model/shard_layout.h"

namespace shardline::model {

// Told the order in which a step's data-parallel work happens (tests check that reductions
// overlap the backward; no timing): "ready h.3" when a unit's gradient is complete, "reduce
// h.3..lm_head" when a bucket's reduction starts on the communication thread. Called from both
// threads.
class DataParallelTrace {
 public:
  virtual ~DataParallelTrace() = default;
  virtual void Record(std::string event) = 0;
};

// One kind of state a rank saves and loads (ShardedGpt::StatePieces, LoadState).
struct SavedState {
  checkpoint::StateKind kind = checkpoint::StateKind::kParam;
  // Per-site kinds (checkpoint::IsPerSite): the leading index this rank's values take, and the
  // number of sites.
  int site = -1;
  int sites = 0;
  // Loaded only when a run resumes (not when it starts from init_from's parameters).
  bool resume_only = false;
  // When the checkpoint has none of a strategy's kind (another strategy wrote it) or not this
  // rank's site (it was written with fewer sites): load `fallback`'s tensor into it instead, or
  // zero it, or (neither) leave it as the kinds before it in SavedStates left it.
  std::optional<checkpoint::StateKind> fallback = std::nullopt;
  bool zeros_if_missing = false;
  // Error feedback written with another number of sites: this rank's site loads the sum over the
  // stored sites of these kinds' tensors, divided by `sites`, so that the sites together carry
  // what the old ones did (GradientCompressor's SpreadCarriedError); zeros when none is stored.
  std::vector<checkpoint::StateKind> spread_from = {};
};

struct DataParallelOptions {
  const ShardLayout* layout = nullptr;  // must outlive the strategy
  comm::Communicator* dp = nullptr;     // null: a group of one
  int dp_size = 1;
  int dp_index = 0;
  // Where the rank's state and the transient buffers live (its allocator) and what updates them.
  // Before a collective reads what the backend wrote, the strategy waits for the backend.
  kernels::Backend* backend = nullptr;
  // Memory the data-parallel peers map (a shared-memory group), where whole gradients are kept so
  // that their all-reduce reads them in place; null otherwise.
  kernels::Allocator* peer_mapped = nullptr;
  // Buckets, compression, DiLoCo (validated: placement::CheckDataParallel).
  placement::DataParallelSpec spec;
  DataParallelTrace* trace = nullptr;  // optional; must outlive the strategy
};

class DataParallelStrategy {
 public:
  // ZeRO stage `zero` (0..3) over `options`, or DiLoCo when options.spec says so: allocates the
  // state (zeroed) and starts the communication thread. InvalidArgument for another stage.
  static absl::StatusOr<std::unique_ptr<DataParallelStrategy>> Create(
      int zero, const DataParallelOptions& options);
  virtual ~DataParallelStrategy() = default;

  // ---- where the state lives ----
  // Whether this rank keeps only its owned part of each unit of the parameters, gradients or a
  // moment (StateKind kParam, or kExpAvg/kExpAvgSq for the moments), or all of it.
  virtual bool KeepsOwnedOnly(checkpoint::StateKind kind) const = 0;
  // [begin, end) of unit u (in its floats) that this rank owns: its partition for saving, the
  // norm and the update, whatever the stage.
  virtual int64_t OwnedBegin(int u) const = 0;
  virtual int64_t OwnedEnd(int u) const = 0;
  // Where element `local` (flat in the tensor's box) of the tensor's `kind` lives; only for
  // elements this rank keeps (LoadRange).
  virtual float* StateAt(checkpoint::StateKind kind, const ShardTensor& tensor,
                         int64_t local) const = 0;
  // What a checkpoint holds of this rank's state, in the order it is saved: the parameters and
  // their AdamW moments, then the strategy's own kinds.
  virtual std::vector<SavedState> SavedStates() const;
  // [begin, end) of unit u of `kind` that this rank saves (the owned part for the parameters and
  // moments, so that the data-parallel ranks share the writing), and that it keeps and loads.
  virtual std::pair<int64_t, int64_t> SavedRange(checkpoint::StateKind kind, int u) const = 0;
  virtual std::pair<int64_t, int64_t> LoadRange(checkpoint::StateKind kind, int u) const = 0;
  // LoadState loaded `kind` from the checkpoint (not a fallback).
  virtual void StateLoaded(checkpoint::StateKind) {}
  // Whether each data-parallel rank trains a model of its own between syncs (DiLoCo): the
  // gradient norm and the loss are then its replica's, not the job's.
  virtual bool IndependentReplicas() const { return false; }

  // The gradient of element `local` of the tensor, after the step's reduction; only for elements
  // this rank owns.
  virtual const float* ReducedGradAt(const ShardTensor& tensor, int64_t local) const = 0;
  // The reduced gradient of unit u this rank holds once the step's reductions finished: the whole
  // unit (stages 0, 1) or its owned shard (2, 3); both stages' "wte" units line up, so the tied
  // embedding copies can be summed through it.
  virtual std::span<float> ReducedUnitGrads(int u) = 0;

  // ---- one micro-batch ----
  // Unit u's parameters as a forward or backward reads them (stage 3 gathers the unit: every
  // data-parallel rank must ask for the same units in the same order); ReleaseParams frees what
  // UnitParams gathered.
  virtual absl::StatusOr<float*> UnitParams(int u) = 0;
  virtual void ReleaseParams(int u) = 0;
  // Where the backward writes (accumulates) unit u's gradient of this micro-batch.
  virtual absl::StatusOr<float*> UnitGrads(int u) = 0;
  // Unit u's gradient of this micro-batch is complete: reduce it (now or after the last
  // micro-batch).
  virtual absl::Status GradsReady(int u, bool last_micro_batch) = 0;

  // ---- one step ----
  // Step `step` (1-based) begins; its passes follow. (DiLoCo sends the fragments due at the step
  // before, so that their exchange overlaps this step's passes.)
  virtual absl::Status BeginStep(int64_t /*step*/) { return absl::OkStatus(); }
  // Zeroes the gradients before the step's first micro-batch.
  virtual absl::Status ZeroGrads() = 0;
  // Waits for every queued reduction; the first error of the step.
  virtual absl::Status FinishReductions() = 0;
  // Scales the gradients by clip_scale (when below 1) and runs AdamW on what this rank updates
  // (decay only where the tensor decays), then brings every rank's parameters back in step.
  virtual absl::Status Update(double clip_scale, int64_t step,
                              const kernels::cpu::AdamWConfig& adamw) = 0;
  virtual absl::Status ClearOptimizerState() = 0;

  // Seconds the caller waited on data-parallel collectives since the last call.
  virtual double TakeWaitSeconds() = 0;
  // Bytes kept between steps: parameters, gradients (between micro-batches), both moments.
  virtual int64_t param_bytes() const = 0;
  virtual int64_t grad_bytes() const = 0;
  virtual int64_t optimizer_bytes() const = 0;
};

}  // namespace shardline::model
