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
// (Compressed reductions and DiLoCo's outer step are further strategies behind this interface.)
//
// Every collective runs on the strategy's communication thread (comm_thread.h), so a unit's
// reduction overlaps the rest of the backward pass. One caller thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/train_state.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "kernels/cpu/optimizer.h"
#include "worker/comm/communicator.h"
#include "worker/model/shard_layout.h"

namespace shardline::model {

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
};

class DataParallelStrategy {
 public:
  // ZeRO stage `zero` (0..3) over `options`: allocates the state (zeroed) and starts the
  // communication thread. InvalidArgument for another stage.
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
  // elements this rank keeps.
  virtual float* StateAt(checkpoint::StateKind kind, const ShardTensor& tensor,
                         int64_t local) const = 0;
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
