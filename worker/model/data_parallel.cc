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
#include "worker/model/gradient_compression.h"

namespace shardline::model {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Units first..last (layout order) of a bucket, floats [begin, begin + size) of the whole
// gradients; `ready` counts the units of this step's last micro-batch reported so far.
struct Bucket {
  int first = 0, last = 0;
  int64_t begin = 0, size = 0;
  int ready = 0;
};

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
    MakeBuckets();
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
    if (options_.spec.compressed() && options_.dp != nullptr) {
      CompressionOptions compression;
      compression.kind = options_.spec.compression;
      compression.rank = options_.spec.rank;
      ASSIGN_OR_RETURN(compressor_,
                       GradientCompressor::Create(compression, options_.dp->host_split(), whole));
      MakeBucketMatrices();
    }
    return absl::OkStatus();
  }

  // The matrices of each bucket PowerSGD may compress: every tensor of two or more dimensions,
  // seen as (all but its last dimension) × its last, in the rank's box.
  void MakeBucketMatrices() {
    bucket_matrices_.assign(buckets_.size(), {});
    for (const ShardTensor& t : layout_.tensors()) {
      if (t.box_shape.size() < 2) continue;
      const Bucket& bucket = buckets_[bucket_of_[t.unit]];
      int64_t rows = 1;
      for (size_t d = 0; d + 1 < t.box_shape.size(); ++d) rows *= t.box_shape[d];
      bucket_matrices_[bucket_of_[t.unit]].push_back(
          BucketMatrix{.offset = layout_.units()[t.unit].begin + t.offset - bucket.begin,
                       .rows = rows,
                       .cols = t.box_shape.back()});
    }
  }

  // Runs of consecutive units of about spec.bucket_bytes, from the last unit back (the order the
  // backward produces them in), each contiguous in the whole-gradient buffer so that one
  // collective reduces it in place. A unit larger than a bucket is a bucket of its own.
  void MakeBuckets() {
    const auto& units = layout_.units();
    bucket_of_.assign(units.size(), -1);
    const int64_t limit = std::max<int64_t>(1, options_.spec.bucket_bytes / int64_t{sizeof(float)});
    int last = static_cast<int>(units.size()) - 1;
    while (last >= 0) {
      int first = last;
      int64_t size = units[last].size;
      while (first > 0 && size < limit &&
             units[first - 1].begin + units[first - 1].size == units[first].begin &&
             size + units[first - 1].size <= limit) {
        --first;
        size += units[first].size;
      }
      const int index = static_cast<int>(buckets_.size());
      buckets_.push_back(Bucket{first, last, units[first].begin, size, 0});
      for (int u = first; u <= last; ++u) bucket_of_[u] = index;
      last = first - 1;
    }
  }

  std::string BucketName(const Bucket& b) const {
    const auto& units = layout_.units();
    return b.first == b.last ? units[b.first].name
                             : units[b.first].name + ".." + units[b.last].name;
  }

  void Trace(std::string event) const {
    if (options_.trace != nullptr) options_.trace->Record(std::move(event));
  }

  bool KeepsOwnedOnly(checkpoint::StateKind kind) const override {
    return kind == checkpoint::StateKind::kParam ? params_sharded_ : moments_sharded_;
  }

  std::vector<SavedState> SavedStates() const override {
    std::vector<SavedState> states = DataParallelStrategy::SavedStates();
    if (compressor_) {
      // Error feedback: each site's leader keeps it (the other ranks of its host hold none).
      using K = checkpoint::StateKind;
      const int site = compressor_->site(), sites = compressor_->sites();
      states.push_back({.kind = K::kCarriedError,
                        .site = site,
                        .sites = sites,
                        .resume_only = true,
                        .zeros_if_missing = true,
                        .spread_from = {K::kCarriedError, K::kServerError}});
      if (compressor_->options().kind == CompressionKind::kInt8) {
        states.push_back({.kind = K::kServerError,
                          .site = site,
                          .sites = sites,
                          .resume_only = true,
                          .zeros_if_missing = true});
      }
    }
    return states;
  }

  std::pair<int64_t, int64_t> SavedRange(checkpoint::StateKind kind, int u) const override {
    if (IsErrorFeedback(kind)) return LoadRange(kind, u);
    return {OwnedBegin(u), OwnedEnd(u)};
  }
  std::pair<int64_t, int64_t> LoadRange(checkpoint::StateKind kind, int u) const override {
    if (IsErrorFeedback(kind)) {
      const bool held =
          compressor_ && compressor_->holds_state() &&
          (kind == checkpoint::StateKind::kCarriedError || !compressor_->server_error().empty());
      return {0, held ? layout_.units()[u].size : 0};
    }
    if (KeepsOwnedOnly(kind)) return {OwnedBegin(u), OwnedEnd(u)};
    return {0, layout_.units()[u].size};
  }

  static bool IsErrorFeedback(checkpoint::StateKind kind) {
    return kind == checkpoint::StateKind::kCarriedError ||
           kind == checkpoint::StateKind::kServerError;
  }

  int64_t OwnedBegin(int u) const override {
    return std::min<int64_t>(options_.dp_index * shard_size_[u], layout_.units()[u].size);
  }
  int64_t OwnedEnd(int u) const override {
    return std::min<int64_t>((options_.dp_index + 1) * shard_size_[u], layout_.units()[u].size);
  }

  float* StateAt(checkpoint::StateKind kind, const ShardTensor& t, int64_t local) const override {
    if (IsErrorFeedback(kind)) {
      // The compressor's own buffers, gradient-shaped: read for a save, written by a load (the
      // same floats its LoadState would copy in, on the communication thread's idle time between
      // steps).
      const std::span<const float> state = kind == checkpoint::StateKind::kCarriedError
                                               ? compressor_->carried_error()
                                               : compressor_->server_error();
      return const_cast<float*>(state.data()) + layout_.units()[t.unit].begin + t.offset + local;
    }
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
    if (last_micro_batch) Trace("ready " + what);
    if (!grads_sharded_) {
      // Whole gradients accumulate over the micro-batches; a bucket is reduced once, after the
      // last micro-batch produced all of its units.
      if (!last_micro_batch || dp == nullptr) return absl::OkStatus();
      Bucket& bucket = buckets_[bucket_of_[u]];
      if (++bucket.ready == bucket.last - bucket.first + 1) SubmitBucket(bucket);
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
    for (Bucket& bucket : buckets_) bucket.ready = 0;
    return options_.backend->Fill(grads_.data<float>(), grads_.numel(), 0.0f);
  }

  absl::Status FinishReductions() override {
    if (!grads_sharded_ && options_.dp != nullptr) {
      // A unit the backward never reported (none today) still gets its reduction.
      for (Bucket& bucket : buckets_) {
        if (bucket.ready > 0 && bucket.ready <= bucket.last - bucket.first) SubmitBucket(bucket);
      }
    }
    return Wait();
  }

  // Queues the all-reduce of a bucket's whole gradients (summed over the group, in place).
  void SubmitBucket(Bucket& bucket) {
    bucket.ready = bucket.last - bucket.first + 2;  // submitted: no second time this step
    comm::Communicator* dp = options_.dp;
    float* g = grads_.data<float>() + bucket.begin;
    const size_t n = static_cast<size_t>(bucket.size);
    const std::string name = BucketName(bucket);
    if (compressor_) {
      const int index = static_cast<int>(&bucket - buckets_.data());
      const int64_t begin = bucket.begin;
      comm_thread_->Submit([=, this] {
        Trace("reduce " + name);
        return Annotate(
            compressor_->AllReduceSum(begin, g, static_cast<int64_t>(n), bucket_matrices_[index]),
            "data-parallel compressed sum of the gradients of " + name);
      });
      return;
    }
    comm_thread_->Submit([=, this] {
      Trace("reduce " + name);
      return Annotate(dp->AllReduce(g, n, DType::kFloat32, comm::ReduceOp::kSum),
                      "data-parallel all-reduce of the gradients of " + name);
    });
  }

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

  std::vector<Bucket> buckets_;        // stages 0, 1: from the last unit back
  std::vector<int> bucket_of_;         // per unit
  std::vector<int64_t> shard_size_;    // per unit: ceil(size / dp)
  std::vector<int64_t> shard_offset_;  // per unit: where its shard starts in shard buffers
  int64_t shard_total_ = 0;

  kernels::Tensor params_;                     // whole units, or (stage 3) the owned shards
  kernels::Tensor grads_;                      // whole units, or (stages 2, 3) the owned shards
  kernels::Tensor adam_m_, adam_v_;            // whole units, or (stages 1-3) the owned shards
  std::vector<kernels::Tensor> gathered_;      // stage 3: units gathered for the current use
  std::vector<kernels::Tensor> grad_scratch_;  // stages 2, 3: units' gradient of this micro-batch
  double wait_seconds_ = 0;
  std::unique_ptr<GradientCompressor> compressor_;          // data_parallel.compression, else null
  std::vector<std::vector<BucketMatrix>> bucket_matrices_;  // per bucket, with a compressor
  std::unique_ptr<CommThread> comm_thread_;  // last: stops (draining) before the buffers go
};

// DiLoCo (Douillard et al. 2023) over the data-parallel group, each rank of which is a site: a
// site trains alone with stage 0's state and no reduction (its `inner_` strategy is a group of
// one), and every `every` steps the sites average their parameters' change since the last sync
// (the pseudo-gradient, anchor − parameters) over the group and take one outer Nesterov step on
// the anchor, which then becomes every site's parameters:
//   m ← μ·m + Δ;  anchor ← anchor − lr·(Δ + μ·m)      (torch.optim.SGD(nesterov=True), as TorchFT)
// The inner AdamW moments stay each site's. Nothing else crosses sites: the gradient norm and the
// loss are the site's own (IndependentReplicas).
//
// With fragments F > 1 (Streaming DiLoCo), unit u belongs to fragment u mod F (strided, so that
// each fragment holds layers from the whole depth) and fragment f syncs at the steps t with
// t ≡ ⌊(f + 1)·H / F⌋ (mod H): the exchanges are spread over the round. A fragment's pseudo-
// gradient is computed at the end of its step t and all-reduced during step t + 1's forward and
// backward; at step t + 1's update the new anchor is applied and the inner step taken meanwhile
// is kept on top of it (parameters ← new anchor + (θ(t+1) − θ(t))). With F = 1 the sync is
// synchronous at step t, so that H = 1, outer lr 1 and no momentum is plain averaging.
class DilocoStrategy final : public DataParallelStrategy {
 public:
  DilocoStrategy(const DataParallelOptions& options, std::unique_ptr<DataParallelStrategy> inner)
      : options_(options), layout_(*options.layout), inner_(std::move(inner)) {}

  ~DilocoStrategy() override {
    if (comm_thread_) comm_thread_->Drain().IgnoreError();
  }

  absl::Status Allocate() {
    const int64_t whole = layout_.total();
    kernels::Allocator& allocator = options_.backend->allocator();
    ASSIGN_OR_RETURN(anchor_, kernels::Tensor::Zeros({whole}, DType::kFloat32, allocator));
    ASSIGN_OR_RETURN(momentum_, kernels::Tensor::Zeros({whole}, DType::kFloat32, allocator));
    const int F = options_.spec.fragments;
    fragments_.assign(F, {});
    for (int u = 0; u < static_cast<int>(layout_.units().size()); ++u) {
      fragments_[u % F].push_back(u);
    }
    comm_thread_ = std::make_unique<CommThread>(2);
    return absl::OkStatus();
  }

  // ---- state: the site's parameters and moments are the inner strategy's ----
  bool KeepsOwnedOnly(checkpoint::StateKind) const override { return false; }
  int64_t OwnedBegin(int) const override { return 0; }
  int64_t OwnedEnd(int u) const override { return layout_.units()[u].size; }

  std::vector<SavedState> SavedStates() const override {
    using K = checkpoint::StateKind;
    const int site = options_.dp_index, sites = options_.dp_size;
    // The parameters and moments a checkpoint names plainly are site 0's, a complete state that a
    // run without DiLoCo (or an export) can take; every site's own are the site kinds.
    return {{.kind = K::kParam},
            {.kind = K::kExpAvg, .resume_only = true},
            {.kind = K::kExpAvgSq, .resume_only = true},
            {.kind = K::kOuterAnchor, .resume_only = true, .fallback = K::kParam},
            {.kind = K::kOuterMomentum, .resume_only = true, .zeros_if_missing = true},
            {.kind = K::kSiteParam, .site = site, .sites = sites},
            {.kind = K::kSiteExpAvg, .site = site, .sites = sites, .resume_only = true},
            {.kind = K::kSiteExpAvgSq, .site = site, .sites = sites, .resume_only = true}};
  }

  std::pair<int64_t, int64_t> SavedRange(checkpoint::StateKind kind, int u) const override {
    using K = checkpoint::StateKind;
    const int64_t size = layout_.units()[u].size;
    if (kind == K::kOuterAnchor || kind == K::kOuterMomentum) {
      // The same on every site: the sites share the writing, as ZeRO's partition.
      const int64_t shard = (size + options_.dp_size - 1) / options_.dp_size;
      return {std::min(options_.dp_index * shard, size),
              std::min((options_.dp_index + 1) * shard, size)};
    }
    if (!checkpoint::IsPerSite(kind) && options_.dp_index != 0) return {0, 0};
    return {0, size};
  }

  std::pair<int64_t, int64_t> LoadRange(checkpoint::StateKind, int u) const override {
    return {0, layout_.units()[u].size};
  }

  float* StateAt(checkpoint::StateKind kind, const ShardTensor& t, int64_t local) const override {
    using K = checkpoint::StateKind;
    const int64_t at = layout_.units()[t.unit].begin + t.offset + local;
    switch (kind) {
      case K::kOuterAnchor:
        return const_cast<float*>(anchor_.data<float>()) + at;
      case K::kOuterMomentum:
        return const_cast<float*>(momentum_.data<float>()) + at;
      case K::kParam:
      case K::kSiteParam:
        return inner_->StateAt(K::kParam, t, local);
      case K::kExpAvg:
      case K::kSiteExpAvg:
        return inner_->StateAt(K::kExpAvg, t, local);
      case K::kExpAvgSq:
      case K::kSiteExpAvgSq:
        return inner_->StateAt(K::kExpAvgSq, t, local);
      default:
        return nullptr;
    }
  }

  void StateLoaded(checkpoint::StateKind kind) override {
    if (kind == checkpoint::StateKind::kOuterAnchor) anchor_loaded_ = true;
  }
  const float* ReducedGradAt(const ShardTensor& t, int64_t local) const override {
    return inner_->ReducedGradAt(t, local);
  }
  std::span<float> ReducedUnitGrads(int u) override { return inner_->ReducedUnitGrads(u); }
  bool IndependentReplicas() const override { return true; }

  // ---- one micro-batch, one step: the site's own ----
  absl::StatusOr<float*> UnitParams(int u) override { return inner_->UnitParams(u); }
  void ReleaseParams(int u) override { inner_->ReleaseParams(u); }
  absl::StatusOr<float*> UnitGrads(int u) override { return inner_->UnitGrads(u); }
  absl::Status GradsReady(int u, bool last) override { return inner_->GradsReady(u, last); }
  absl::Status BeginStep(int64_t step) override {
    RETURN_IF_ERROR(StartRound());
    // A fragment due at the previous step goes out now, overlapping this step's passes.
    if (step > 1 && options_.spec.fragments > 1) {
      for (int f = 0; f < options_.spec.fragments; ++f) {
        if (Due(f, step - 1)) RETURN_IF_ERROR(SendFragment(f));
      }
    }
    return absl::OkStatus();
  }
  absl::Status ZeroGrads() override { return inner_->ZeroGrads(); }
  absl::Status FinishReductions() override { return inner_->FinishReductions(); }

  absl::Status Update(double clip_scale, int64_t step,
                      const kernels::cpu::AdamWConfig& adamw) override {
    RETURN_IF_ERROR(StartRound());
    RETURN_IF_ERROR(inner_->Update(clip_scale, step, adamw));
    // Fragments sent at this step's start: their new anchor, with this step's inner change kept.
    for (Pending& p : pending_) RETURN_IF_ERROR(ApplyFragment(p, /*keep_inner_step=*/true));
    pending_.clear();
    if (options_.spec.fragments == 1 && Due(0, step)) {
      RETURN_IF_ERROR(SendFragment(0));
      for (Pending& p : pending_) RETURN_IF_ERROR(ApplyFragment(p, /*keep_inner_step=*/false));
      pending_.clear();
    }
    return absl::OkStatus();
  }

  absl::Status ClearOptimizerState() override {
    RETURN_IF_ERROR(options_.backend->Fill(momentum_.data<float>(), momentum_.numel(), 0.0f));
    return inner_->ClearOptimizerState();
  }

  double TakeWaitSeconds() override {
    return std::exchange(wait_seconds_, 0.0) + inner_->TakeWaitSeconds();
  }
  int64_t param_bytes() const override {
    return inner_->param_bytes() + static_cast<int64_t>(anchor_.nbytes());
  }
  int64_t grad_bytes() const override { return inner_->grad_bytes(); }
  int64_t optimizer_bytes() const override {
    return inner_->optimizer_bytes() + static_cast<int64_t>(momentum_.nbytes());
  }

 private:
  // A fragment's exchange in flight: its pseudo-gradient being summed over the sites, and the
  // site's own (to recover the parameters it was computed from).
  struct Pending {
    int fragment = 0;
    std::vector<kernels::Tensor> summed, own;  // per unit of the fragment
  };

  // Before the first step this strategy runs: the anchor is the checkpoint's (loaded into it), or
  // else the parameters the run starts from (initialised, or init_from's).
  absl::Status StartRound() {
    if (started_) return absl::OkStatus();
    started_ = true;
    if (anchor_loaded_) return absl::OkStatus();
    return CopyParams(anchor_.data<float>(), /*to_params=*/false);
  }

  bool Due(int f, int64_t step) const {
    const int64_t H = options_.spec.every;
    const int64_t offset = (static_cast<int64_t>(f) + 1) * H / options_.spec.fragments;
    return step % H == offset % H;
  }

  // Copies every unit's parameters into `anchor` (to_params false) or back (true).
  absl::Status CopyParams(float* anchor, bool to_params) {
    for (int u = 0; u < static_cast<int>(layout_.units().size()); ++u) {
      ASSIGN_OR_RETURN(float* params, inner_->UnitParams(u));
      float* a = anchor + layout_.units()[u].begin;
      const int64_t n = layout_.units()[u].size;
      RETURN_IF_ERROR(to_params ? options_.backend->Copy(params, a, n)
                                : options_.backend->Copy(a, params, n));
    }
    return absl::OkStatus();
  }

  // Computes fragment f's pseudo-gradient (anchor − parameters) and queues its sum over the sites.
  absl::Status SendFragment(int f) {
    kernels::Backend& backend = *options_.backend;
    Pending p;
    p.fragment = f;
    for (const int u : fragments_[f]) {
      const int64_t n = layout_.units()[u].size;
      ASSIGN_OR_RETURN(float* params, inner_->UnitParams(u));
      ASSIGN_OR_RETURN(kernels::Tensor delta,
                       kernels::Tensor::Empty({n}, DType::kFloat32, backend.allocator()));
      float* d = delta.data<float>();
      RETURN_IF_ERROR(backend.Copy(d, params, n));
      RETURN_IF_ERROR(backend.Scale(d, n, -1.0f));
      RETURN_IF_ERROR(backend.Accumulate(d, anchor_.data<float>() + layout_.units()[u].begin, n));
      ASSIGN_OR_RETURN(kernels::Tensor own,
                       kernels::Tensor::Empty({n}, DType::kFloat32, backend.allocator()));
      RETURN_IF_ERROR(backend.Copy(own.data<float>(), d, n));
      p.summed.push_back(std::move(delta));
      p.own.push_back(std::move(own));
    }
    RETURN_IF_ERROR(backend.Synchronize());  // before the communicator reads the deltas
    comm::Communicator* dp = options_.dp;
    for (size_t i = 0; i < p.summed.size(); ++i) {
      float* d = p.summed[i].data<float>();
      const size_t n = static_cast<size_t>(p.summed[i].numel());
      const std::string name = layout_.units()[fragments_[f][i]].name;
      comm_thread_->Submit([=, this] {
        if (options_.trace != nullptr) options_.trace->Record("outer " + name);
        return Annotate(dp->AllReduce(d, n, DType::kFloat32, comm::ReduceOp::kSum),
                        "DiLoCo's all-reduce of the pseudo-gradient of " + name);
      });
    }
    pending_.push_back(std::move(p));
    return absl::OkStatus();
  }

  // Waits for fragment p's sum, takes the outer Nesterov step on its anchor and sets the site's
  // parameters to it (plus the inner step taken since the send, when `keep_inner_step`).
  absl::Status ApplyFragment(Pending& p, bool keep_inner_step) {
    const auto start = Clock::now();
    absl::Status drained = comm_thread_->Drain();
    wait_seconds_ += Since(start);
    RETURN_IF_ERROR(drained);
    kernels::Backend& backend = *options_.backend;
    const float mu = static_cast<float>(options_.spec.outer_momentum);
    const float lr = static_cast<float>(options_.spec.outer_lr);
    for (size_t i = 0; i < p.summed.size(); ++i) {
      const int u = fragments_[p.fragment][i];
      const int64_t n = layout_.units()[u].size;
      const int64_t begin = layout_.units()[u].begin;
      float* delta = p.summed[i].data<float>();
      float* m = momentum_.data<float>() + begin;
      float* anchor = anchor_.data<float>() + begin;
      ASSIGN_OR_RETURN(float* params, inner_->UnitParams(u));
      RETURN_IF_ERROR(backend.Scale(delta, n, 1.0f / static_cast<float>(options_.dp_size)));
      if (keep_inner_step) {
        // θ(t) = anchor − own Δ: the parameters keep θ(t+1) − θ(t) = θ(t+1) + own Δ − anchor.
        RETURN_IF_ERROR(backend.Accumulate(params, p.own[i].data<float>(), n));
        RETURN_IF_ERROR(backend.Scale(anchor, n, -1.0f));
        RETURN_IF_ERROR(backend.Accumulate(params, anchor, n));
        RETURN_IF_ERROR(backend.Scale(anchor, n, -1.0f));
      }
      if (mu != 0.0f) {
        RETURN_IF_ERROR(backend.Scale(m, n, mu));
        RETURN_IF_ERROR(backend.Accumulate(m, delta, n));
        // delta ← Δ + μ·m, Nesterov's look-ahead.
        float* look = p.own[i].data<float>();
        RETURN_IF_ERROR(backend.Copy(look, m, n));
        RETURN_IF_ERROR(backend.Scale(look, n, mu));
        RETURN_IF_ERROR(backend.Accumulate(delta, look, n));
      }
      RETURN_IF_ERROR(backend.Scale(delta, n, -lr));
      RETURN_IF_ERROR(backend.Accumulate(anchor, delta, n));
      if (keep_inner_step) {
        RETURN_IF_ERROR(backend.Accumulate(params, anchor, n));
      } else {
        RETURN_IF_ERROR(backend.Copy(params, anchor, n));
      }
    }
    return backend.Synchronize();
  }

  const DataParallelOptions options_;
  const ShardLayout& layout_;
  std::unique_ptr<DataParallelStrategy> inner_;  // the site's state, a group of one
  kernels::Tensor anchor_;                       // the parameters at the last sync, whole
  kernels::Tensor momentum_;                     // the outer momentum, whole
  std::vector<std::vector<int>> fragments_;      // units of each fragment
  std::vector<Pending> pending_;
  bool started_ = false;
  bool anchor_loaded_ = false;
  double wait_seconds_ = 0;
  std::unique_ptr<CommThread> comm_thread_;  // last: stops (draining) before the buffers go
};

}  // namespace

std::vector<SavedState> DataParallelStrategy::SavedStates() const {
  using K = checkpoint::StateKind;
  return {{.kind = K::kParam},
          {.kind = K::kExpAvg, .resume_only = true},
          {.kind = K::kExpAvgSq, .resume_only = true}};
}

absl::StatusOr<std::unique_ptr<DataParallelStrategy>> DataParallelStrategy::Create(
    int zero, const DataParallelOptions& options) {
  if (zero < 0 || zero > 3) {
    return absl::InvalidArgumentError(absl::StrCat("ZeRO stage ", zero, " is not 0..3"));
  }
  if (options.spec.diloco()) {
    if (zero != 0) {
      return absl::InvalidArgumentError(absl::StrCat("DiLoCo needs ZeRO stage 0, not ", zero));
    }
    // The site's own state: stage 0 over a group of one.
    DataParallelOptions site = options;
    site.dp = nullptr;
    site.dp_size = 1;
    site.dp_index = 0;
    site.peer_mapped = nullptr;
    site.spec = placement::DataParallelSpec();
    auto inner = std::make_unique<ZeroStrategy>(0, site);
    RETURN_IF_ERROR(inner->Allocate());
    auto strategy = std::make_unique<DilocoStrategy>(options, std::move(inner));
    RETURN_IF_ERROR(strategy->Allocate());
    return std::unique_ptr<DataParallelStrategy>(std::move(strategy));
  }
  auto strategy = std::make_unique<ZeroStrategy>(zero, options);
  RETURN_IF_ERROR(strategy->Allocate());
  return std::unique_ptr<DataParallelStrategy>(std::move(strategy));
}

}  // namespace shardline::model
