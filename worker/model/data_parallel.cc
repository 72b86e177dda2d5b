#include "worker/model/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/tensor.h"
#include "worker/model/comm_thread.h"

namespace shardline::model {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ZeRO stage 0..3: which of the state is kept sharded is the whole difference between the stages,
// and it is fixed at construction.
class ZeroStrategy final : public DataParallelStrategy {
 public:
  ZeroStrategy(int zero, const DataParallelOptions& options)
      : options_(options),
        layout_(*options.layout),
        params_sharded_(zero >= 3),
        grads_sharded_(zero >= 2),
        moments_sharded_(zero >= 1) {}

  ~ZeroStrategy() override {
    if (comm_thread_) comm_thread_->Drain().IgnoreError();
  }

  absl::Status Allocate() {
    const auto& units = layout_.units();
    shard_size_.resize(units.size());
    shard_offset_.resize(units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      shard_size_[u] = (units[u].size + options_.dp_size - 1) / options_.dp_size;
      shard_offset_[u] = shard_total_;
      shard_total_ += shard_size_[u];
    }
    kernels::Allocator& allocator = options_.backend->allocator();
    const int64_t whole = layout_.total();
    ASSIGN_OR_RETURN(params_, kernels::Tensor::Zeros({params_sharded_ ? shard_total_ : whole},
                                                     DType::kFloat32, allocator));
    // Whole gradients are all-reduced in place: over shared memory they live where the peers map
    // them, so each byte is read once by the rank that reduces it (ShmCommunicator's single copy).
    kernels::Allocator& grad_allocator =
        !grads_sharded_ && options_.peer_mapped != nullptr ? *options_.peer_mapped : allocator;
    ASSIGN_OR_RETURN(grads_, kernels::Tensor::Zeros({grads_sharded_ ? shard_total_ : whole},
                                                    DType::kFloat32, grad_allocator));
    const int64_t moments = moments_sharded_ ? shard_total_ : whole;
    ASSIGN_OR_RETURN(adam_m_, kernels::Tensor::Zeros({moments}, DType::kFloat32, allocator));
    ASSIGN_OR_RETURN(adam_v_, kernels::Tensor::Zeros({moments}, DType::kFloat32, allocator));
    gathered_.assign(units.size(), kernels::Tensor());
    grad_scratch_.assign(units.size(), kernels::Tensor());
    // Two queued reductions keep the thread busy while bounding stage 2/3's waiting gradient
    // buffers to two units.
    comm_thread_ = std::make_unique<CommThread>(2);
    return absl::OkStatus();
  }

  bool KeepsOwnedOnly(checkpoint::StateKind kind) const override {
    return kind == checkpoint::StateKind::kParam ? params_sharded_ : moments_sharded_;
  }

  int64_t OwnedBegin(int u) const override {
    return std::min<int64_t>(options_.dp_index * shard_size_[u], layout_.units()[u].size);
  }
  int64_t OwnedEnd(int u) const override {
    return std::min<int64_t>((options_.dp_index + 1) * shard_size_[u], layout_.units()[u].size);
  }

  float* StateAt(checkpoint::StateKind kind, const ShardTensor& t, int64_t local) const override {
    // The buffers are the strategy's own; this const method hands out a pointer for the caller to
    // read (CopyState) or write (LoadState).
    const kernels::Tensor& buffer = kind == checkpoint::StateKind::kParam    ? params_
                                    : kind == checkpoint::StateKind::kExpAvg ? adam_m_
                                                                             : adam_v_;
    return At(const_cast<float*>(buffer.data<float>()), KeepsOwnedOnly(kind), t, local);
  }

  const float* ReducedGradAt(const ShardTensor& t, int64_t local) const override {
    return At(const_cast<float*>(grads_.data<float>()), grads_sharded_, t, local);
  }

  std::span<float> ReducedUnitGrads(int u) override {
    float* g = grads_.data<float>();
    if (grads_sharded_) return {g + shard_offset_[u], static_cast<size_t>(shard_size_[u])};
    return {g + layout_.units()[u].begin, static_cast<size_t>(layout_.units()[u].size)};
  }

  absl::StatusOr<float*> UnitParams(int u) override {
    if (!params_sharded_) return params_.data<float>() + layout_.units()[u].begin;
    if (gathered_[u].defined()) return gathered_[u].data<float>();
    const int64_t S = shard_size_[u];
    ASSIGN_OR_RETURN(gathered_[u], kernels::Tensor::Empty({S * options_.dp_size}, DType::kFloat32,
                                                          options_.backend->allocator()));
    const float* shard = params_.data<float>() + shard_offset_[u];
    float* whole = gathered_[u].data<float>();
    comm::Communicator* dp = options_.dp;
    if (dp == nullptr) {
      // No group to gather from: this rank's own shard where a gather would put it.
      RETURN_IF_ERROR(options_.backend->Copy(whole + options_.dp_index * S, shard, S));
      return whole;
    }
    // The last update of the shard must have landed before the communicator reads it.
    RETURN_IF_ERROR(options_.backend->Synchronize());
    const std::string what = layout_.units()[u].name;
    comm_thread_->Submit([=] {
      return Annotate(dp->AllGather(shard, whole, static_cast<size_t>(S), DType::kFloat32),
                      "ZeRO-3 gather of " + what);
    });
    RETURN_IF_ERROR(Wait());
    return whole;
  }

  void ReleaseParams(int u) override {
    if (params_sharded_) gathered_[u] = kernels::Tensor();
  }

  absl::StatusOr<float*> UnitGrads(int u) override {
    if (!grads_sharded_) return grads_.data<float>() + layout_.units()[u].begin;
    if (!grad_scratch_[u].defined()) {
      // Padded to dp whole shards: the reduce-scatter's input.
      ASSIGN_OR_RETURN(grad_scratch_[u],
                       kernels::Tensor::Zeros({shard_size_[u] * options_.dp_size}, DType::kFloat32,
                                              options_.backend->allocator()));
    }
    return grad_scratch_[u].data<float>();
  }

  absl::Status GradsReady(int u, bool last_micro_batch) override {
    comm::Communicator* dp = options_.dp;
    kernels::Backend* backend = options_.backend;
    // The communication thread's collective reads what the backward wrote (on a device backend,
    // still queued): wait for it, and only then.
    if (dp != nullptr && (grads_sharded_ || last_micro_batch)) {
      RETURN_IF_ERROR(backend->Synchronize());
    }
    const std::string what = layout_.units()[u].name;
    if (!grads_sharded_) {
      // Whole gradients accumulate over the micro-batches; reduce once, after the last.
      if (!last_micro_batch || dp == nullptr) return absl::OkStatus();
      float* g = grads_.data<float>() + layout_.units()[u].begin;
      const size_t n = static_cast<size_t>(layout_.units()[u].size);
      comm_thread_->Submit([=] {
        return Annotate(dp->AllReduce(g, n, DType::kFloat32, comm::ReduceOp::kSum),
                        "data-parallel all-reduce of the gradients of " + what);
      });
      return absl::OkStatus();
    }
    // This micro-batch's gradient goes into the owned shard now, and its buffer is freed.
    const int64_t S = shard_size_[u];
    float* shard = grads_.data<float>() + shard_offset_[u];
    auto scratch = std::make_shared<kernels::Tensor>(std::move(grad_scratch_[u]));
    grad_scratch_[u] = kernels::Tensor();
    kernels::Allocator* allocator = &backend->allocator();
    const int dp_index = options_.dp_index;
    comm_thread_->Submit([=]() -> absl::Status {
      const float* mine;
      kernels::Tensor reduced;
      if (dp == nullptr) {
        mine = scratch->data<float>() + dp_index * S;
      } else {
        ASSIGN_OR_RETURN(reduced, kernels::Tensor::Empty({S}, DType::kFloat32, *allocator));
        RETURN_IF_ERROR(Annotate(
            dp->ReduceScatter(scratch->data<float>(), reduced.data<float>(), static_cast<size_t>(S),
                              DType::kFloat32, comm::ReduceOp::kSum),
            "data-parallel reduce-scatter of the gradients of " + what));
        mine = reduced.data<float>();
      }
      return backend->Accumulate(shard, mine, S);
    });
    return absl::OkStatus();
  }

  absl::Status ZeroGrads() override {
    return options_.backend->Fill(grads_.data<float>(), grads_.numel(), 0.0f);
  }

  absl::Status FinishReductions() override { return Wait(); }

  absl::Status Update(double clip_scale, int64_t step,
                      const kernels::cpu::AdamWConfig& adamw) override {
    kernels::Backend& backend = *options_.backend;
    if (clip_scale < 1.0) {
      RETURN_IF_ERROR(
          backend.Scale(grads_.data<float>(), grads_.numel(), static_cast<float>(clip_scale)));
    }
    float* p = params_.data<float>();
    float* g = grads_.data<float>();
    float* m = adam_m_.data<float>();
    float* v = adam_v_.data<float>();
    for (const ShardTensor& t : layout_.tensors()) {
      kernels::cpu::AdamWConfig config = adamw;
      if (!t.decay) config.weight_decay = 0.0f;
      const int u = t.unit;
      const int64_t unit_begin = layout_.units()[u].begin;
      if (!moments_sharded_) {
        // Stage 0: every rank updates all of it, the same way.
        const int64_t at = unit_begin + t.offset;
        RETURN_IF_ERROR(
            Annotate(backend.AdamW(p + at, g + at, m + at, v + at, t.numel, config, step),
                     "AdamW on " + t.name));
        continue;
      }
      // Stages 1-3: only the part of the tensor inside this rank's shard of the unit.
      const int64_t ob = OwnedBegin(u), oe = OwnedEnd(u);
      const int64_t begin = std::max(ob, t.offset), end = std::min(oe, t.offset + t.numel);
      if (begin >= end) continue;
      const int64_t in_shard = shard_offset_[u] + (begin - ob);
      float* pp = params_sharded_ ? p + in_shard : p + unit_begin + begin;
      float* gg = grads_sharded_ ? g + in_shard : g + unit_begin + begin;
      RETURN_IF_ERROR(
          Annotate(backend.AdamW(pp, gg, m + in_shard, v + in_shard, end - begin, config, step),
                   "AdamW on " + t.name));
    }
    return GatherUpdatedParams();
  }

  absl::Status ClearOptimizerState() override {
    RETURN_IF_ERROR(options_.backend->Fill(adam_m_.data<float>(), adam_m_.numel(), 0.0f));
    return options_.backend->Fill(adam_v_.data<float>(), adam_v_.numel(), 0.0f);
  }

  double TakeWaitSeconds() override { return std::exchange(wait_seconds_, 0.0); }
  int64_t param_bytes() const override { return static_cast<int64_t>(params_.nbytes()); }
  int64_t grad_bytes() const override { return static_cast<int64_t>(grads_.nbytes()); }
  int64_t optimizer_bytes() const override {
    return static_cast<int64_t>(adam_m_.nbytes() + adam_v_.nbytes());
  }

 private:
  // Element `local` of tensor t in a buffer holding whole units, or the owned shards.
  float* At(float* base, bool owned_only, const ShardTensor& t, int64_t local) const {
    const int u = t.unit;
    const int64_t x = t.offset + local;  // in the unit
    if (!owned_only) return base + layout_.units()[u].begin + x;
    return base + shard_offset_[u] + (x - OwnedBegin(u));
  }

  // Stages 1 and 2 updated only their shard of parameters they keep whole: all-gather each unit.
  absl::Status GatherUpdatedParams() {
    if (!moments_sharded_ || params_sharded_) return absl::OkStatus();
    comm::Communicator* dp = options_.dp;
    if (dp == nullptr) return absl::OkStatus();
    kernels::Backend* backend = options_.backend;
    for (size_t u = 0; u < layout_.units().size(); ++u) {
      const int64_t S = shard_size_[u];
      const int64_t size = layout_.units()[u].size;
      float* unit = params_.data<float>() + layout_.units()[u].begin;
      const int64_t ob = OwnedBegin(static_cast<int>(u)), oe = OwnedEnd(static_cast<int>(u));
      kernels::Allocator* allocator = &backend->allocator();
      const int dp_size = options_.dp_size;
      const std::string name = layout_.units()[u].name;
      comm_thread_->Submit([=]() -> absl::Status {
        // Shards are padded to S so that every rank sends the same count.
        ASSIGN_OR_RETURN(kernels::Tensor mine,
                         kernels::Tensor::Zeros({S}, DType::kFloat32, *allocator));
        ASSIGN_OR_RETURN(kernels::Tensor all,
                         kernels::Tensor::Empty({S * dp_size}, DType::kFloat32, *allocator));
        RETURN_IF_ERROR(backend->Copy(mine.data<float>(), unit + ob, oe - ob));
        RETURN_IF_ERROR(backend->Synchronize());  // before the communicator reads it
        RETURN_IF_ERROR(Annotate(dp->AllGather(mine.data<float>(), all.data<float>(),
                                               static_cast<size_t>(S), DType::kFloat32),
                                 "ZeRO all-gather of the updated " + name));
        return backend->Copy(unit, all.data<float>(), size);
      });
    }
    return Wait();
  }

  absl::Status Wait() {
    const auto start = Clock::now();
    absl::Status status = comm_thread_->Drain();
    wait_seconds_ += Since(start);
    return status;
  }

  const DataParallelOptions options_;
  const ShardLayout& layout_;
  const bool params_sharded_;   // stage 3
  const bool grads_sharded_;    // stages 2, 3
  const bool moments_sharded_;  // stages 1-3

  std::vector<int64_t> shard_size_;    // per unit: ceil(size / dp)
  std::vector<int64_t> shard_offset_;  // per unit: where its shard starts in shard buffers
  int64_t shard_total_ = 0;

  kernels::Tensor params_;                     // whole units, or (stage 3) the owned shards
  kernels::Tensor grads_;                      // whole units, or (stages 2, 3) the owned shards
  kernels::Tensor adam_m_, adam_v_;            // whole units, or (stages 1-3) the owned shards
  std::vector<kernels::Tensor> gathered_;      // stage 3: units gathered for the current use
  std::vector<kernels::Tensor> grad_scratch_;  // stages 2, 3: units' gradient of this micro-batch
  double wait_seconds_ = 0;
  std::unique_ptr<CommThread> comm_thread_;  // last: stops (draining) before the buffers go
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataParallelStrategy>> DataParallelStrategy::Create(
    int zero, const DataParallelOptions& options) {
  if (zero < 0 || zero > 3) {
    return absl::InvalidArgumentError(absl::StrCat("ZeRO stage ", zero, " is not 0..3"));
  }
  auto strategy = std::make_unique<ZeroStrategy>(zero, options);
  RETURN_IF_ERROR(strategy->Allocate());
  return std::unique_ptr<DataParallelStrategy>(std::move(strategy));
}

}  // namespace shardline::model
