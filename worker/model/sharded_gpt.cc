#include "worker/model/sharded_gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/box.h"
#include "common/status_macros.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/optimizer.h"
#include "worker/model/carver.h"
#include "worker/model/counter_rng.h"
#include "worker/model/data_parallel.h"

namespace shardline::model {
namespace cpu = kernels::cpu;
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}


// Calls fn(local_index, global_flat_index) for every element of the box, in row-major box order.
template <typename Fn>
void ForEachBoxElement(const std::vector<int64_t>& global_shape,
                       const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape,
                       Fn&& fn) {
  const size_t dims = global_shape.size();
  std::vector<int64_t> stride(dims, 1);
  for (size_t d = dims; d-- > 1;) stride[d - 1] = stride[d] * global_shape[d];
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<int64_t> index(dims, 0);
  for (int64_t local = 0; local < count; ++local) {
    int64_t flat = 0;
    for (size_t d = 0; d < dims; ++d) flat += (offsets[d] + index[d]) * stride[d];
    fn(local, flat);
    for (size_t d = dims; d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}


}  // namespace

// Runs the data-parallel group's collectives, in submission order, on its own thread: every rank
// submits the same sequence, so the ranks' collectives match. After a failure the remaining tasks
// are dropped (their buffers freed) and Drain reports the first error.
// The activations one micro-batch keeps between its forward and its backward.
struct ShardedGpt::Slot {
  kernels::Tensor buffer;
  int chunk = 0;
  std::vector<float*> residual;  // chunk layers + 1, (b,T,C)
  std::vector<BlockActivations> blocks;
  // The chunk holding the head: the final norm and this rank's vocabulary columns of the logits,
  // and the loss's per-row statistics.
  HeadActivations head;
  LossActivations loss;
  // The micro-batch's tokens (the embedding's chunk) and targets (the head's), in the backend's
  // memory: (b,T) each.
  kernels::Tensor ids;
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
};

ShardedGpt::ShardedGpt(const ShardedOptions& options, const ShardedGroups& groups,
                       ShardLayout layout, kernels::Backend& backend)
    : options_(options),
      groups_(groups),
      layout_(std::move(layout)),
      backend_(backend),
      allocator_(backend.allocator()) {}

ShardedGpt::~ShardedGpt() = default;

absl::StatusOr<std::unique_ptr<ShardedGpt>> ShardedGpt::Create(const ShardedOptions& options,
                                                               const ShardedGroups& groups,
                                                               kernels::Backend& backend) {
  const placement::ParallelSpec& par = options.parallel;
  const placement::RankCoords& c = options.coords;
  // The collectives read and write the backend's memory: a host communicator cannot take a
  // device's buffers (wrap it in a comm::StagedCommunicator), nor NCCL the host's.
  const bool on_device = backend.device() != kernels::Device::kCpu;
  for (const auto& [group, kind] :
       {std::pair{groups.world, "world"}, std::pair{groups.tp, "tensor-parallel"},
        std::pair{groups.pp, "pipeline"}, std::pair{groups.dp, "data-parallel"},
        std::pair{groups.replica, "replica"}}) {
    if (group != nullptr && group->device_buffers() != on_device) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", kind, " group is a ", std::string(group->backend()),
                       " communicator of ", group->device_buffers() ? "device" : "host",
                       " buffers, and the engine runs on ", backend.Describe()));
    }
  }
  if (c.tp < 0 || c.tp >= par.tp || c.pp < 0 || c.pp >= par.pp || c.dp < 0 || c.dp >= par.dp) {
    return absl::InvalidArgumentError(absl::StrCat("coordinates tp ", c.tp, " pp ", c.pp, " dp ",
                                                   c.dp, " lie outside the layout tp=", par.tp,
                                                   " pp=", par.pp, " dp=", par.dp));
  }
  const auto check_group = [](const comm::Communicator* group, int size, const char* kind) {
    const int have = group == nullptr ? 1 : group->size();
    if (have == size) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("the ", kind, " communicator has ", have,
                                                   " ranks, the layout needs ", size));
  };
  RETURN_IF_ERROR(check_group(groups.tp, par.tp, "tensor-parallel"));
  RETURN_IF_ERROR(check_group(groups.pp, par.pp, "pipeline"));
  RETURN_IF_ERROR(check_group(groups.dp, par.dp, "data-parallel"));
  RETURN_IF_ERROR(check_group(groups.world, par.world(), "world"));
  if (options.data_parallel.diloco()) {
    RETURN_IF_ERROR(check_group(groups.replica, par.tp * par.pp, "replica"));
  }
  RETURN_IF_ERROR(placement::CheckDataParallel(options.data_parallel, par, options.config));
  if (options.seq_len < 1 || options.seq_len > options.config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len ", options.seq_len,
                                                   " must be in [1, max_seq_len ",
                                                   options.config.max_seq_len, "]"));
  }
  const int64_t mb = placement::MicroBatchSize(par, options.global_batch);
  if (mb < 1 || options.global_batch % (mb * par.dp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("global batch ", options.global_batch,
                                                   " is not divisible by micro_batch·dp = ", mb,
                                                   "·", par.dp));
  }
  ASSIGN_OR_RETURN(const auto chunks, placement::ChunksOf(par, options.config.layers));
  ShardPlace place;
  place.tp_size = par.tp;
  place.tp_index = c.tp;
  place.chunks = chunks[c.pp];
  place.first_stage = c.pp == 0;
  place.last_stage = c.pp == par.pp - 1;
  ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::Create(options.config, place));

  std::unique_ptr<ShardedGpt> model(new ShardedGpt(options, groups, std::move(layout), backend));
  model->micro_batch_ = mb;
  model->micro_batches_ = static_cast<int>(placement::MicroBatchCount(par, options.global_batch));
  ASSIGN_OR_RETURN(placement::PipelineSchedule schedule,
                   placement::PipelineSchedule::Of(par, model->micro_batches_));
  model->schedule_.emplace(std::move(schedule));
  if (groups.tp != nullptr) {
    ShardedGpt* self = model.get();
    model->tp_all_reduce_ = [self](float* data, int64_t n) { return self->TpAllReduce(data, n); };
    model->tp_all_reduce_max_ = [self](float* data, int64_t n) {
      return self->TpAllReduce(data, n, comm::ReduceOp::kMax);
    };
    if (model->layout_.kv_replicas() > 1) {
      model->kv_grad_sum_ = [self](float* data, int64_t n) {
        return self->SumSharedKeyValueGrads(data, n);
      };
    }
  }
  RETURN_IF_ERROR(model->Allocate());
  return model;
}

absl::Status ShardedGpt::Allocate() {
  // What is all-reduced in place over shared memory lives in memory the peers map: each byte is
  // then read once by the rank that reduces it (ShmCommunicator's single copy), instead of copied
  // into the segment and back.
  const auto over_shm = [](const comm::Communicator* group) {
    return group != nullptr && group->backend() == "shm";
  };
  if (over_shm(groups_.dp) || over_shm(groups_.tp)) {
    shared_memory_ = std::make_unique<comm::SharedHostAllocator>();
  }
  // The data-parallel strategy, chosen once: where parameters, gradients and moments live and how
  // they are reduced.
  DataParallelOptions dp;
  dp.layout = &layout_;
  dp.dp = groups_.dp;
  dp.dp_size = options_.parallel.dp;
  dp.dp_index = options_.coords.dp;
  dp.backend = &backend_;
  dp.peer_mapped = over_shm(groups_.dp) ? shared_memory_.get() : nullptr;
  dp.spec = options_.data_parallel;
  dp.trace = options_.trace;
  ASSIGN_OR_RETURN(data_parallel_, DataParallelStrategy::Create(options_.parallel.zero, dp));
  kernels::Allocator& activation_allocator =
      over_shm(groups_.tp) ? *shared_memory_ : allocator_;  // the slots' and backward scratch's

  // Activations: one slot per micro-batch in flight, as many as the schedule counts (under 1F1B
  // stage s has at most pp − s forwards waiting for their backward). What each block keeps in its
  // slot depends on the recomputation mode; the rest lives once, in the recompute scratch.
  const int stage = options_.coords.pp;
  const std::vector<placement::StageRange>& chunks = layout_.place().chunks;
  const int nchunks = static_cast<int>(chunks.size());
  const int64_t N = micro_batch_ * options_.seq_len;
  const int64_t C = options_.config.d_model;
  const int64_t Vs = layout_.vocab_shard();
  const BlockDims dims = MicroBatchDims();
  const placement::RecomputeMode mode = options_.parallel.recompute;
  // Carves with `carve` from one zeroed allocation of the activation allocator into `buffer`.
  const auto allocate = [&](kernels::Tensor& buffer, const auto& carve) -> absl::Status {
    Carver counter(nullptr);
    carve(counter);
    buffer = kernels::Tensor();
    if (counter.used() == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(
        buffer, kernels::Tensor::Zeros({counter.used()}, DType::kFloat32, activation_allocator));
    Carver carver(buffer.data<float>());
    carve(carver);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(allocate(recompute_buffer_,
                           [&](Carver& c) { CarveRecomputeScratch(c, dims, mode, recomputed_); }));
  if (const std::vector<float> inv_freq = RotaryFrequencies(options_.config); !inv_freq.empty()) {
    ASSIGN_OR_RETURN(rope_inv_freq_, kernels::Tensor::Zeros({static_cast<int64_t>(inv_freq.size())},
                                                            DType::kFloat32, allocator_));
    RETURN_IF_ERROR(backend_.ToDevice(rope_inv_freq_.data<float>(), inv_freq.data(),
                                      sizeof(float) * inv_freq.size()));
  }
  if (kv_grad_sum_) {
    // A slot per key/value head of the model for one head's k and v weight gradients.
    const int64_t per_head = 2 * options_.config.head_size() * C;
    ASSIGN_OR_RETURN(kv_sum_buffer_, kernels::Tensor::Zeros({options_.config.kv() * per_head},
                                                            DType::kFloat32, allocator_));
  }
  // Two pools: the chunks without the head share one (they have the same layers under either
  // schedule), sized by the most of their micro-batches in flight at once; the head's chunk has its
  // own, whose slots also hold the logits and the loss's statistics. A slot's input (residual[0])
  // comes from a pool of its own, taken when the input arrives, which can be before the forward.
  int most_layers = 0;
  for (const placement::StageRange& chunk : chunks)
    most_layers = std::max(most_layers, chunk.size());
  const auto make_slots = [&](int count, bool head, std::vector<std::unique_ptr<Slot>>& pool) {
    pool.clear();
    for (int i = 0; i < count; ++i) {
      auto slot = std::make_unique<Slot>();
      Slot& s = *slot;
      RETURN_IF_ERROR(allocate(s.buffer, [&](Carver& c) {
        s.residual.assign(most_layers + 1, nullptr);
        for (size_t i = 1; i < s.residual.size(); ++i) s.residual[i] = c.Take(N * C);
        s.blocks.assign(most_layers, BlockActivations{});
        for (BlockActivations& b : s.blocks)
          CarveKeptBlockActivations(c, dims, mode, recomputed_, b);
        if (!head) return;
        s.head.norm = c.Take(N * C);
        s.head.mean = options_.config.norm == NormKind::kLayerNorm ? c.Take(N) : nullptr;
        s.head.rstd = c.Take(N);
        s.head.logits = c.Take(N * Vs);
        s.loss.losses = c.Take(N);
        s.loss.lse = c.Take(N);
        s.loss.local_max = c.Take(N);
        s.loss.global_max = c.Take(N);
        s.loss.sumexp = c.Take(N);
        s.loss.target_logit = c.Take(N);
      }));
      ASSIGN_OR_RETURN(s.ids, kernels::Tensor::Zeros({2 * N}, DType::kInt32, activation_allocator));
      s.tokens = s.ids.data<int32_t>();
      s.targets = s.tokens + N;
      pool.push_back(std::move(slot));
    }
    return absl::OkStatus();
  };
  const bool last = layout_.place().last_stage;
  RETURN_IF_ERROR(make_slots(schedule_->MaxInFlightWithoutHead(stage), false, body_slots_));
  RETURN_IF_ERROR(
      make_slots(last ? schedule_->MaxInFlight(stage, nchunks - 1) : 0, true, head_slots_));
  const auto make_inputs = [&](int count, kernels::Tensor& buffer, std::vector<float*>& inputs) {
    return allocate(buffer, [&](Carver& c) {
      inputs.clear();
      for (int i = 0; i < count; ++i) inputs.push_back(c.Take(N * C));
    });
  };
  RETURN_IF_ERROR(
      make_inputs(schedule_->MaxInputsWithoutHead(stage), body_input_buffer_, body_inputs_));
  RETURN_IF_ERROR(make_inputs(last ? schedule_->MaxInputs(stage, nchunks - 1) : 0,
                              head_input_buffer_, head_inputs_));
  RETURN_IF_ERROR(allocate(backward_buffer_, [&](Carver& c) {
    dresidual_.assign(most_layers + 1, nullptr);
    for (float*& r : dresidual_) r = c.Take(N * C);
    CarveBlockGradScratch(c, dims, scratch_, /*replicated_kv=*/static_cast<bool>(kv_grad_sum_));
    if (!last) return;
    dlnf_ = c.Take(N * C);
    dlogits_ = c.Take(N * Vs);
    dlosses_ = c.Take(N);
  }));
  ASSIGN_OR_RETURN(totals_, kernels::Tensor::Zeros({2}, DType::kFloat64, allocator_));
  const int held = schedule_->MaxEarlyGradients(stage);
  RETURN_IF_ERROR(allocate(held_buffer_, [&](Carver& c) {
    held_buffers_.clear();
    for (int i = 0; i < held; ++i) held_buffers_.push_back(c.Take(N * C));
  }));
  ResetInFlight();
  return absl::OkStatus();
}

void ShardedGpt::ResetInFlight() {
  const size_t nchunks = layout_.place().chunks.size();
  slot_of_.assign(nchunks, std::vector<Slot*>(micro_batches_, nullptr));
  // Taken from the back: the first slot first, as 1F1B's round robin did.
  free_body_slots_.clear();
  for (auto it = body_slots_.rbegin(); it != body_slots_.rend(); ++it) {
    free_body_slots_.push_back(it->get());
  }
  free_head_slots_.clear();
  for (auto it = head_slots_.rbegin(); it != head_slots_.rend(); ++it) {
    free_head_slots_.push_back(it->get());
  }
  free_body_inputs_.assign(body_inputs_.rbegin(), body_inputs_.rend());
  free_head_inputs_.assign(head_inputs_.rbegin(), head_inputs_.rend());
  input_of_.assign(nchunks, std::vector<float*>(micro_batches_, nullptr));
  free_held_ = held_buffers_;
  held_.assign(nchunks, std::vector<float*>(micro_batches_, nullptr));
}

bool ShardedGpt::HoldsEmbedding(int chunk) const {
  return layout_.place().first_stage && chunk == 0;
}

bool ShardedGpt::HoldsHead(int chunk) const {
  return layout_.place().last_stage && chunk == static_cast<int>(layout_.place().chunks.size()) - 1;
}

// The schedule's analysis counted the slots and inputs in flight, so a pool is never empty here.
float* ShardedGpt::InputFor(int micro_batch, int chunk) {
  float*& input = input_of_[chunk][micro_batch];
  if (input == nullptr) {
    std::vector<float*>& free = HoldsHead(chunk) ? free_head_inputs_ : free_body_inputs_;
    input = free.back();
    free.pop_back();
  }
  return input;
}

ShardedGpt::Slot& ShardedGpt::SlotFor(int micro_batch, int chunk) {
  Slot*& slot = slot_of_[chunk][micro_batch];
  if (slot == nullptr) {
    std::vector<Slot*>& free = HoldsHead(chunk) ? free_head_slots_ : free_body_slots_;
    slot = free.back();
    free.pop_back();
    slot->chunk = chunk;
    slot->residual[0] = InputFor(micro_batch, chunk);
  }
  return *slot;
}

void ShardedGpt::ReleaseSlot(int micro_batch, int chunk) {
  const bool head = HoldsHead(chunk);
  (head ? free_head_slots_ : free_body_slots_).push_back(slot_of_[chunk][micro_batch]);
  slot_of_[chunk][micro_batch] = nullptr;
  (head ? free_head_inputs_ : free_body_inputs_).push_back(input_of_[chunk][micro_batch]);
  input_of_[chunk][micro_batch] = nullptr;
}

ShardedMemory ShardedGpt::memory() const {
  int64_t activations = static_cast<int64_t>(
      backward_buffer_.nbytes() + recompute_buffer_.nbytes() + held_buffer_.nbytes() +
      body_input_buffer_.nbytes() + head_input_buffer_.nbytes());
  for (const auto* pool : {&body_slots_, &head_slots_}) {
    for (const auto& slot : *pool) activations += static_cast<int64_t>(slot->buffer.nbytes());
  }
  return ShardedMemory{data_parallel_->param_bytes(), data_parallel_->grad_bytes(),
                       data_parallel_->optimizer_bytes(), activations};
}

int64_t ShardedGpt::shared_bytes() const {
  return shared_memory_ ? static_cast<int64_t>(shared_memory_->stats().bytes_in_use) : 0;
}

BlockDims ShardedGpt::MicroBatchDims() const {
  BlockDims dims = BlockDims::Of(options_.config, static_cast<int>(micro_batch_), options_.seq_len,
                                 layout_.heads(), layout_.kv_heads(), layout_.ff());
  if (rope_inv_freq_.defined()) dims.rope_inv_freq = rope_inv_freq_.data<float>();
  return dims;
}

int ShardedGpt::HeadUnit() const {
  return layout_.head_unit() >= 0 ? layout_.head_unit() : layout_.wte_unit();
}

EmbeddingWeights ShardedGpt::EmbeddingWeightsOf(const float* wte, const float* wpe) const {
  return EmbeddingWeights{wte, wpe, layout_.vocab_begin(), layout_.vocab_end()};
}

HeadWeights ShardedGpt::HeadWeightsOf(const float* lnf, const float* head) const {
  const bool has_bias = options_.config.norm == NormKind::kLayerNorm;
  return HeadWeights{.norm_w = lnf,
                     .norm_b = has_bias ? lnf + options_.config.d_model : nullptr,
                     .norm = options_.config.norm,
                     .head = head,
                     .vocab_begin = layout_.vocab_begin(),
                     .vocab_end = layout_.vocab_end(),
                     .eps = static_cast<float>(options_.config.norm_eps)};
}

// ---- parameter values ----

absl::Status ShardedGpt::InitGpt2(uint64_t seed) {
  // Exactly FillGpt2Init's values (ModelParams::Gpt2Init), element by global index.
  for (const ShardTensor& t : layout_.tensors()) {
    const TensorInit init = TensorInit::Of(t.name, t.init, options_.config.layers);
    std::vector<float> values(static_cast<size_t>(t.numel));
    ForEachBoxElement(t.global_shape, t.box_offsets, t.box_shape, [&](int64_t local, int64_t flat) {
      values[local] = init.Value(seed, static_cast<uint64_t>(flat));
    });
    RETURN_IF_ERROR(StoreTensor(t, values));
  }
  return data_parallel_->ClearOptimizerState();
}

template <typename Fn>
void ShardedGpt::ForEachSavedRange(checkpoint::StateKind kind, Share share, Fn&& fn) const {
  // DiLoCo's sites train models of their own between syncs: what one holds is not another's, and
  // only the saved partition is one model's state.
  const bool held = share == Share::kHeld && !data_parallel_->IndependentReplicas();
  for (const ShardTensor& t : layout_.tensors()) {
    if (t.tied_copy || (t.tp_replica && !held)) continue;
    const auto [ob, oe] =
        held ? data_parallel_->LoadRange(kind, t.unit) : data_parallel_->SavedRange(kind, t.unit);
    const int64_t begin = std::max(ob, t.offset), end = std::min(oe, t.offset + t.numel);
    if (begin < end) fn(t, begin - t.offset, end - t.offset);
  }
}

namespace {

// A per-site kind's tensor has a leading dimension of sites; this rank's values are at [site].
std::vector<int64_t> WithSite(const SavedState& state, const std::vector<int64_t>& dims,
                              int64_t value) {
  if (!checkpoint::IsPerSite(state.kind)) return dims;
  std::vector<int64_t> out = {value};
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

}  // namespace

absl::Status ShardedGpt::LoadState(const BoxReader& read, bool with_moments,
                                   const TensorShapeReader& shape_of) {
  RETURN_IF_ERROR(data_parallel_->ClearOptimizerState());
  // Elements [begin, end) of tensor `t`'s box of the global tensor `name` (at `site` of a per-site
  // kind), read box by box: the boxes of a flat range follow one another in its order.
  const auto read_host = [&](const std::string& name, const SavedState& state, const ShardTensor& t,
                             int64_t begin, int64_t end) -> absl::StatusOr<std::vector<float>> {
    std::vector<float> out;
    out.reserve(static_cast<size_t>(end - begin));
    for (const checkpoint::Box& box : checkpoint::SplitFlatRange(t.box_shape, begin, end)) {
      std::vector<int64_t> offsets = box.offsets;
      for (size_t d = 0; d < offsets.size(); ++d) offsets[d] += t.box_offsets[d];
      absl::StatusOr<std::vector<float>> values =
          read(name, WithSite(state, offsets, state.site), WithSite(state, box.shape, 1));
      if (!values.ok()) return Annotate(values.status(), "loading " + name);
      const int64_t numel = *checkpoint::NumElements(box.shape);
      if (static_cast<int64_t>(values->size()) != numel) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loading ", name, ": got ", values->size(), " values for a box of ", numel));
      }
      out.insert(out.end(), values->begin(), values->end());
    }
    return out;
  };
  const auto read_range = [&](const std::string& name, const SavedState& state,
                              const ShardTensor& t, int64_t begin, int64_t end,
                              float* out) -> absl::Status {
    ASSIGN_OR_RETURN(const std::vector<float> values, read_host(name, state, t, begin, end));
    return backend_.ToDevice(out, values.data(), sizeof(float) * values.size());
  };
  // Error feedback written with another number of sites: the sum over every stored site of the
  // `spread_from` kinds, divided by this plan's sites. False when the checkpoint has none of them.
  const auto spread = [&](const SavedState& state, const ShardTensor& t, int64_t begin, int64_t end,
                          float* out) -> absl::StatusOr<bool> {
    if (!shape_of || state.spread_from.empty()) return false;
    std::vector<float> sum(static_cast<size_t>(end - begin), 0.0f);
    bool any = false;
    for (const checkpoint::StateKind kind : state.spread_from) {
      const std::string name = checkpoint::StateTensorName(kind, t.name);
      const std::optional<std::vector<int64_t>> shape = shape_of(name);
      if (!shape.has_value() || shape->empty()) continue;
      for (int64_t site = 0; site < (*shape)[0]; ++site) {
        const SavedState stored{.kind = kind, .site = static_cast<int>(site)};
        ASSIGN_OR_RETURN(const std::vector<float> values, read_host(name, stored, t, begin, end));
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += values[i];
        any = true;
      }
    }
    if (!any) return false;
    for (float& v : sum) v /= static_cast<float>(state.sites);
    RETURN_IF_ERROR(backend_.ToDevice(out, sum.data(), sizeof(float) * sum.size()));
    return true;
  };
  // Whether the checkpoint holds `state`'s tensor of `t`, with this rank's site.
  const auto present = [&](const SavedState& state, const ShardTensor& t) {
    if (!shape_of) return true;
    const std::optional<std::vector<int64_t>> shape =
        shape_of(checkpoint::StateTensorName(state.kind, t.name));
    if (!shape.has_value()) return false;
    return !checkpoint::IsPerSite(state.kind) || (!shape->empty() && state.site < (*shape)[0]);
  };
  for (const SavedState& state : data_parallel_->SavedStates()) {
    if (state.resume_only && !with_moments) continue;
    // What this rank keeps of each tensor: whole, or the part it owns.
    for (const ShardTensor& t : layout_.tensors()) {
      const auto [ub, ue] = data_parallel_->LoadRange(state.kind, t.unit);
      const int64_t begin = std::max(ub, t.offset), end = std::min(ue, t.offset + t.numel);
      if (begin >= end) continue;
      float* into = data_parallel_->StateAt(state.kind, t, begin - t.offset);
      if (present(state, t)) {
        RETURN_IF_ERROR(read_range(checkpoint::StateTensorName(state.kind, t.name), state, t,
                                   begin - t.offset, end - t.offset, into));
        continue;
      }
      ASSIGN_OR_RETURN(const bool spread_out,
                       spread(state, t, begin - t.offset, end - t.offset, into));
      if (spread_out) continue;
      if (!checkpoint::IsStrategyState(state.kind)) {
        return absl::NotFoundError(absl::StrCat("loading ",
                                                checkpoint::StateTensorName(state.kind, t.name),
                                                ": the checkpoint has no such tensor"));
      }
      if (state.fallback.has_value()) {
        const SavedState from{.kind = *state.fallback};
        RETURN_IF_ERROR(read_range(checkpoint::StateTensorName(from.kind, t.name), from, t,
                                   begin - t.offset, end - t.offset, into));
      } else if (state.zeros_if_missing) {
        RETURN_IF_ERROR(backend_.Fill(into, end - begin, 0.0f));
      }
    }
    // Said once per kind, for the strategy's bookkeeping (DiLoCo's anchor).
    bool all_present = true;
    for (const ShardTensor& t : layout_.tensors()) all_present = all_present && present(state, t);
    if (all_present) data_parallel_->StateLoaded(state.kind);
  }
  return absl::OkStatus();
}

std::vector<StatePiece> ShardedGpt::StatePieces(Share share) const {
  std::vector<StatePiece> pieces;
  for (const SavedState& state : data_parallel_->SavedStates()) {
    ForEachSavedRange(state.kind, share, [&](const ShardTensor& t, int64_t begin, int64_t end) {
      for (checkpoint::Box& box : checkpoint::SplitFlatRange(t.box_shape, begin, end)) {
        for (size_t d = 0; d < box.offsets.size(); ++d) box.offsets[d] += t.box_offsets[d];
        const int64_t numel = static_cast<int64_t>(*checkpoint::NumElements(box.shape));
        box.offsets = WithSite(state, box.offsets, state.site);
        box.shape = WithSite(state, box.shape, 1);
        pieces.push_back(StatePiece{state.kind, t.name,
                                    WithSite(state, t.global_shape, state.sites), std::move(box),
                                    numel});
      }
    });
  }
  return pieces;
}

absl::Status ShardedGpt::CopyState(std::span<float> out, Share share) const {
  size_t at = 0;
  absl::Status status;
  for (const SavedState& state : data_parallel_->SavedStates()) {
    ForEachSavedRange(state.kind, share, [&](const ShardTensor& t, int64_t begin, int64_t end) {
      const size_t n = static_cast<size_t>(end - begin);
      if (at + n > out.size()) {
        status = absl::InvalidArgumentError(
            absl::StrCat("CopyState: a buffer of ", out.size(), " floats is too small"));
        return;
      }
      if (status.ok()) {
        status = backend_.ToHost(out.data() + at, data_parallel_->StateAt(state.kind, t, begin),
                                 sizeof(float) * n);
      }
      at += n;
    });
  }
  RETURN_IF_ERROR(status);
  if (at != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyState: the state has ", at, " floats, the buffer ", out.size()));
  }
  return absl::OkStatus();
}

absl::Status ShardedGpt::StoreTensor(const ShardTensor& t, std::span<const float> values) {
  constexpr auto kParam = checkpoint::StateKind::kParam;
  if (!data_parallel_->KeepsOwnedOnly(kParam)) {
    return backend_.ToDevice(data_parallel_->StateAt(kParam, t, 0), values.data(),
                             values.size_bytes());
  }
  // Only the part of the unit this rank owns: one run of the owned shard.
  const int64_t ob = data_parallel_->OwnedBegin(t.unit), oe = data_parallel_->OwnedEnd(t.unit);
  const int64_t begin = std::max(ob, t.offset), end = std::min(oe, t.offset + t.numel);
  if (begin >= end) return absl::OkStatus();
  return backend_.ToDevice(data_parallel_->StateAt(kParam, t, begin - t.offset),
                           values.data() + (begin - t.offset),
                           sizeof(float) * static_cast<size_t>(end - begin));
}

absl::StatusOr<std::vector<std::vector<float>>> ShardedGpt::TensorValues() {
  std::vector<std::vector<float>> values;
  values.reserve(layout_.tensors().size());
  for (size_t u = 0; u < layout_.units().size(); ++u) {
    ASSIGN_OR_RETURN(float* base, data_parallel_->UnitParams(static_cast<int>(u)));
    for (const ShardTensor& t : layout_.tensors()) {
      if (t.unit != static_cast<int>(u)) continue;
      std::vector<float>& value = values.emplace_back(static_cast<size_t>(t.numel));
      RETURN_IF_ERROR(backend_.ToHost(value.data(), base + t.offset, sizeof(float) * value.size()));
    }
    data_parallel_->ReleaseParams(static_cast<int>(u));
  }
  return values;
}

absl::Status ShardedGpt::SumSharedKeyValueGrads(float* data, int64_t n) {
  // Each rank writes its heads' slot, zeros elsewhere, so that the group's sum adds exactly the
  // ranks that share a head (vLLM's rule puts tp / kv_heads consecutive ranks on one head).
  const int64_t slot = options_.coords.tp / layout_.kv_replicas();
  float* all = kv_sum_buffer_.data<float>();
  if (n * options_.config.kv() != kv_sum_buffer_.numel()) {
    return absl::InternalError(absl::StrCat("key/value gradient of ", n, " floats for a buffer of ",
                                            kv_sum_buffer_.numel()));
  }
  RETURN_IF_ERROR(backend_.Fill(all, kv_sum_buffer_.numel(), 0.0f));
  RETURN_IF_ERROR(backend_.Copy(all + slot * n, data, n));
  RETURN_IF_ERROR(TpAllReduce(all, kv_sum_buffer_.numel()));
  return backend_.Copy(data, all + slot * n, n);
}

absl::Status ShardedGpt::TpAllReduce(float* data, int64_t n, comm::ReduceOp op) {
  if (groups_.tp == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(backend_.Synchronize());  // the communicator reads what the backend queued
  const auto start = Clock::now();
  absl::Status status = groups_.tp->AllReduce(data, static_cast<size_t>(n), DType::kFloat32, op);
  tp_seconds_ += Since(start);
  return Annotate(status, "tensor-parallel all-reduce");
}

// ---- forward and backward of one micro-batch on this stage ----

absl::Status ShardedGpt::Forward(Slot& slot, const std::vector<int32_t>& tokens,
                                 const std::vector<int32_t>& targets, double& loss_sum) {
  const ShardPlace& place = layout_.place();
  const int b = static_cast<int>(micro_batch_);
  const int T = options_.seq_len;
  const int N = b * T;
  const int C = options_.config.d_model;
  const size_t id_bytes = sizeof(int32_t) * static_cast<size_t>(N);
  if (HoldsEmbedding(slot.chunk)) {
    RETURN_IF_ERROR(backend_.ToDevice(slot.tokens, tokens.data(), id_bytes));
  }
  if (HoldsHead(slot.chunk)) {
    RETURN_IF_ERROR(backend_.ToDevice(slot.targets, targets.data(), id_bytes));
  }
  const placement::StageRange range = place.chunks[slot.chunk];
  const int L = range.size();
  if (HoldsEmbedding(slot.chunk)) {
    ASSIGN_OR_RETURN(float* wte, data_parallel_->UnitParams(layout_.wte_unit()));
    float* wpe = nullptr;  // none with rotary positions
    if (layout_.wpe_unit() >= 0) {
      ASSIGN_OR_RETURN(wpe, data_parallel_->UnitParams(layout_.wpe_unit()));
    }
    RETURN_IF_ERROR(EmbeddingForward(backend_, EmbeddingWeightsOf(wte, wpe), slot.tokens, nullptr,
                                     N, T, C, slot.residual[0], tp_all_reduce_));
    if (layout_.wpe_unit() >= 0) data_parallel_->ReleaseParams(layout_.wpe_unit());
    data_parallel_->ReleaseParams(layout_.wte_unit());
  }
  for (int l = range.first; l < range.last; ++l) {
    const int i = l - range.first;
    const int u = layout_.layer_unit(l);
    ASSIGN_OR_RETURN(float* p, data_parallel_->UnitParams(u));
    RETURN_IF_ERROR(
        Annotate(BlockForward(backend_, MicroBatchDims(), layout_.Block(p), slot.residual[i],
                              slot.residual[i + 1], slot.blocks[i], tp_all_reduce_),
                 absl::StrCat("layer ", l)));
    data_parallel_->ReleaseParams(u);
  }
  if (!HoldsHead(slot.chunk)) return absl::OkStatus();

  const int head = HeadUnit();
  ASSIGN_OR_RETURN(float* lnf, data_parallel_->UnitParams(layout_.lnf_unit()));
  ASSIGN_OR_RETURN(float* head_w, data_parallel_->UnitParams(head));
  const HeadWeights weights = HeadWeightsOf(lnf, head_w);
  RETURN_IF_ERROR(HeadForward(backend_, weights, slot.residual[L], N, C, slot.head));
  data_parallel_->ReleaseParams(head);
  data_parallel_->ReleaseParams(layout_.lnf_unit());
  RETURN_IF_ERROR(VocabParallelCrossEntropy(backend_, weights, slot.head.logits, slot.targets, N,
                                            slot.loss, tp_all_reduce_, tp_all_reduce_max_));
  losses_.resize(static_cast<size_t>(N));
  RETURN_IF_ERROR(
      backend_.ToHost(losses_.data(), slot.loss.losses, sizeof(float) * losses_.size()));
  for (float loss : losses_) loss_sum += loss;
  return absl::OkStatus();
}

absl::Status ShardedGpt::Backward(Slot& slot, const float* dy, bool last_micro_batch) {
  const ShardPlace& place = layout_.place();
  const int b = static_cast<int>(micro_batch_);
  const int T = options_.seq_len;
  const int N = b * T;
  const int C = options_.config.d_model;
  const int64_t NC = int64_t{N} * C;
  const placement::StageRange range = place.chunks[slot.chunk];
  const int L = range.size();
  if (HoldsHead(slot.chunk)) {
    // The loss is the mean over the global batch: every position's gradient is 1/(batch·T), and
    // the data-parallel sum of the ranks' gradients is the gradient of that mean. An independent
    // replica's (DiLoCo's) is the mean over its own share of the batch.
    const int64_t samples = data_parallel_->IndependentReplicas()
                                ? options_.global_batch / options_.parallel.dp
                                : options_.global_batch;
    const float scale = 1.0f / static_cast<float>(samples * static_cast<int64_t>(T));
    RETURN_IF_ERROR(backend_.Fill(dlosses_, N, scale));
    const int head = HeadUnit();
    ASSIGN_OR_RETURN(float* lnf, data_parallel_->UnitParams(layout_.lnf_unit()));
    ASSIGN_OR_RETURN(float* head_w, data_parallel_->UnitParams(head));
    ASSIGN_OR_RETURN(float* head_g, data_parallel_->UnitGrads(head));
    const HeadWeights weights = HeadWeightsOf(lnf, head_w);
    RETURN_IF_ERROR(HeadBackward(backend_, weights, head_g, dlnf_, dlogits_, dlosses_, slot.targets,
                                 N, C, slot.head, slot.loss));
    data_parallel_->ReleaseParams(head);
    // A tied head on a one-stage pipeline writes into "wte", which the embedding's backward
    // still adds to below.
    if (layout_.head_unit() >= 0)
      RETURN_IF_ERROR(data_parallel_->GradsReady(head, last_micro_batch));
    ASSIGN_OR_RETURN(float* lnf_g, data_parallel_->UnitGrads(layout_.lnf_unit()));
    float* lnf_bias_g = weights.norm_b != nullptr ? lnf_g + C : nullptr;
    RETURN_IF_ERROR(FinalNormBackward(backend_, weights, lnf_g, lnf_bias_g, dlnf_, slot.residual[L],
                                      dresidual_[L], N, C, slot.head, tp_all_reduce_));
    data_parallel_->ReleaseParams(layout_.lnf_unit());
    RETURN_IF_ERROR(data_parallel_->GradsReady(layout_.lnf_unit(), last_micro_batch));
    dy = dresidual_[L];
  }
  for (int l = range.last - 1; l >= range.first; --l) {
    const int i = l - range.first;
    const int u = layout_.layer_unit(l);
    ASSIGN_OR_RETURN(float* p, data_parallel_->UnitParams(u));
    ASSIGN_OR_RETURN(float* g, data_parallel_->UnitGrads(u));
    const BlockParams params = layout_.Block(p);
    // Full recomputation writes the block's output again where the forward did: the next block's
    // backward, which read it, is done.
    RETURN_IF_ERROR(Annotate(
        RecomputeBlock(backend_, options_.parallel.recompute, MicroBatchDims(), params,
                       slot.residual[i], slot.residual[i + 1], slot.blocks[i], tp_all_reduce_),
        absl::StrCat("layer ", l, " recomputation")));
    RETURN_IF_ERROR(backend_.Fill(dresidual_[i], NC, 0.0f));
    RETURN_IF_ERROR(
        Annotate(BlockBackward(backend_, MicroBatchDims(), params, layout_.Block(g),
                               slot.residual[i], i + 1 == L ? dy : dresidual_[i + 1], dresidual_[i],
                               slot.blocks[i], scratch_, tp_all_reduce_, kv_grad_sum_),
                 absl::StrCat("layer ", l, " backward")));
    data_parallel_->ReleaseParams(u);
    RETURN_IF_ERROR(data_parallel_->GradsReady(u, last_micro_batch));
  }
  if (HoldsEmbedding(slot.chunk)) {
    // Each table's gradient goes to the strategy as soon as it is done.
    const EmbeddingWeights weights = EmbeddingWeightsOf(nullptr, nullptr);
    ASSIGN_OR_RETURN(float* wte_g, data_parallel_->UnitGrads(layout_.wte_unit()));
    RETURN_IF_ERROR(
        EmbeddingBackward(backend_, weights, wte_g, nullptr, dresidual_[0], slot.tokens, N, T, C));
    RETURN_IF_ERROR(data_parallel_->GradsReady(layout_.wte_unit(), last_micro_batch));
    if (layout_.wpe_unit() >= 0) {
      ASSIGN_OR_RETURN(float* wpe_g, data_parallel_->UnitGrads(layout_.wpe_unit()));
      RETURN_IF_ERROR(EmbeddingBackward(backend_, weights, nullptr, wpe_g, dresidual_[0],
                                        slot.tokens, N, T, C));
      RETURN_IF_ERROR(data_parallel_->GradsReady(layout_.wpe_unit(), last_micro_batch));
    }
  }
  return absl::OkStatus();
}

// ---- the step ----

absl::Status ShardedGpt::SumTiedEmbeddings() {
  const ShardPlace& place = layout_.place();
  if (!options_.config.tied_embeddings || options_.parallel.pp == 1) return absl::OkStatus();
  if (!place.first_stage && !place.last_stage) return absl::OkStatus();
  const int u = place.first_stage ? layout_.wte_unit() : layout_.head_unit();
  const int peer = place.first_stage ? options_.parallel.pp - 1 : 0;
  // The reduced gradient this rank holds: both stages' "wte" units have the same size, so what the
  // strategy keeps of them (the whole unit, or the owned shard) lines up.
  const std::span<float> grads = data_parallel_->ReducedUnitGrads(u);
  float* g = grads.data();
  const int64_t n = static_cast<int64_t>(grads.size());
  ASSIGN_OR_RETURN(kernels::Tensor theirs,
                   kernels::Tensor::Empty({n}, DType::kFloat32, allocator_));
  RETURN_IF_ERROR(backend_.Synchronize());  // the reductions' last additions
  const auto start = Clock::now();
  absl::Status status = groups_.pp->SendRecv(g, static_cast<size_t>(n), peer,
                                             theirs.data<float>(), static_cast<size_t>(n), peer,
                                             DType::kFloat32);
  pp_seconds_ += Since(start);
  RETURN_IF_ERROR(Annotate(status, "summing the tied embedding gradients of the first and last "
                                   "pipeline stage"));
  return backend_.Accumulate(g, theirs.data<float>(), n);
}

absl::StatusOr<double> ShardedGpt::OwnedSumOfSquares() const {
  std::vector<std::span<const float>> owned;
  for (const ShardTensor& t : layout_.tensors()) {
    // Each element of the model counted once in the world: one tensor-parallel rank speaks for
    // replicas, the first stage for the tied copy, and each data-parallel rank for what it owns.
    if (t.tp_replica || t.tied_copy) continue;
    const int u = t.unit;
    const int64_t ob = data_parallel_->OwnedBegin(u), oe = data_parallel_->OwnedEnd(u);
    const int64_t begin = std::max(ob, t.offset), end = std::min(oe, t.offset + t.numel);
    if (begin >= end) continue;
    owned.emplace_back(data_parallel_->ReducedGradAt(t, begin - t.offset),
                       static_cast<size_t>(end - begin));
  }
  return backend_.SumOfSquares(owned);
}

absl::Status ShardedGpt::Transfer(const placement::PipeAction& action) {
  using placement::PipeOp;
  using placement::PipePayload;
  const int64_t NC = micro_batch_ * options_.seq_len * int64_t{options_.config.d_model};
  const std::vector<placement::StageRange>& chunks = layout_.place().chunks;
  const float* send = nullptr;
  float* recv = nullptr;
  const placement::PipeMessage& out = action.send;
  const placement::PipeMessage& in = action.recv;
  if (action.op == PipeOp::kSend || action.op == PipeOp::kSendRecv) {
    // An activation leaves from its slot, a gradient from the backward's buffer, where the
    // backward that computed it left it (the schedule sends it before the next backward).
    send = out.payload == PipePayload::kActivation
               ? SlotFor(out.micro_batch, out.chunk).residual[chunks[out.chunk].size()]
               : dresidual_[0];
  }
  if (action.op == PipeOp::kRecv || action.op == PipeOp::kSendRecv) {
    if (in.payload == PipePayload::kActivation) {
      recv = InputFor(in.micro_batch, in.chunk);
    } else if (action.held) {
      float*& held = held_[in.chunk][in.micro_batch];
      held = free_held_.back();
      free_held_.pop_back();
      recv = held;
    } else {
      recv = dresidual_[chunks[in.chunk].size()];
    }
  }
  if (send != nullptr) RETURN_IF_ERROR(backend_.Synchronize());  // the communicator reads it
  // Time spent here is the bubble: waiting for a neighbouring stage.
  const auto start = Clock::now();
  comm::Communicator* pp = groups_.pp;
  absl::Status status;
  if (send != nullptr && recv != nullptr) {
    status = pp->SendRecv(send, NC, out.peer, recv, NC, in.peer, DType::kFloat32);
  } else if (send != nullptr) {
    status = pp->Send(send, NC, DType::kFloat32, out.peer);
  } else {
    status = pp->Recv(recv, NC, DType::kFloat32, in.peer);
  }
  pp_seconds_ += Since(start);
  return Annotate(status, absl::StrCat("pipeline ", placement::DebugString(action), " (stage ",
                                       options_.coords.pp, " of ", options_.parallel.pp, ")"));
}

absl::StatusOr<StepStats> ShardedGpt::TrainStep(const MicroBatchSource& source, int64_t step,
                                                float learning_rate) {
  const auto step_start = Clock::now();
  tp_seconds_ = pp_seconds_ = dp_wait_seconds_ = 0;
  data_parallel_->TakeWaitSeconds();  // what waited outside a step is not this step's
  // A step that failed half-way left micro-batches in flight.
  ResetInFlight();
  const ShardPlace& place = layout_.place();
  const int m = micro_batches_;
  const int T = options_.seq_len;
  RETURN_IF_ERROR(data_parallel_->BeginStep(step));
  RETURN_IF_ERROR(data_parallel_->ZeroGrads());

  std::vector<int32_t> tokens, targets;
  double loss_sum = 0.0;  // on the stage holding the head
  auto forward = [&](int i, int chunk) -> absl::Status {
    // Only the ends of the model read data: the embedding the tokens, the head the targets.
    if (HoldsEmbedding(chunk) || HoldsHead(chunk)) {
      const int64_t first_sample =
          placement::FirstSample(options_.parallel, options_.global_batch, options_.coords.dp, i);
      RETURN_IF_ERROR(source(first_sample, micro_batch_, tokens, targets));
      if (static_cast<int64_t>(tokens.size()) != micro_batch_ * T ||
          tokens.size() != targets.size()) {
        return absl::InvalidArgumentError(absl::StrCat("micro-batch ", i, " has ", tokens.size(),
                                                       " tokens and ", targets.size(),
                                                       " targets, expected ", micro_batch_ * T));
      }
    }
    if (HoldsEmbedding(chunk)) {
      RETURN_IF_ERROR(Annotate(
          cpu::ValidateTokens(tokens.data(), static_cast<int64_t>(tokens.size()),
                              options_.config.vocab),
          absl::StrCat("micro-batch ", i, " tokens")));
    }
    if (HoldsHead(chunk)) {
      // The vocab-parallel loss would read a target past the vocabulary as another rank's column.
      for (size_t n = 0; n < targets.size(); ++n) {
        if (targets[n] >= options_.config.vocab) {
          return absl::InvalidArgumentError(absl::StrCat(
              "micro-batch ", i, " targets: target ", targets[n], " at position ", n,
              " is outside the vocabulary [0, ", options_.config.vocab, ") (negative: ignored)"));
        }
      }
    }
    return Forward(SlotFor(i, chunk), tokens, targets, loss_sum);
  };

  // The stage's list from the schedule (1F1B, or interleaved over chunks).
  for (const placement::PipeAction& a : schedule_->Actions(options_.coords.pp)) {
    switch (a.op) {
      case placement::PipeOp::kForward:
        RETURN_IF_ERROR(forward(a.micro_batch, a.chunk));
        break;
      case placement::PipeOp::kBackward: {
        float*& held = held_[a.chunk][a.micro_batch];
        const float* dy = held != nullptr ? held : dresidual_[place.chunks[a.chunk].size()];
        RETURN_IF_ERROR(Backward(SlotFor(a.micro_batch, a.chunk), dy, a.micro_batch == m - 1));
        if (held != nullptr) free_held_.push_back(held);
        held = nullptr;
        ReleaseSlot(a.micro_batch, a.chunk);
        break;
      }
      default:
        RETURN_IF_ERROR(Transfer(a));
    }
  }

  // Gradients: data-parallel reductions finish, tied copies are summed, then one norm.
  RETURN_IF_ERROR(data_parallel_->FinishReductions());
  RETURN_IF_ERROR(SumTiedEmbeddings());
  ASSIGN_OR_RETURN(const double sum_of_squares, OwnedSumOfSquares());
  // Only the last stage has losses, and its tensor-parallel ranks all hold the same ones.
  double totals[2] = {sum_of_squares,
                      place.last_stage && options_.coords.tp == 0 ? loss_sum : 0.0};
  // Under DiLoCo each replica is a model of its own: its norm and its loss, over its ranks only.
  const bool own_replica = data_parallel_->IndependentReplicas();
  comm::Communicator* norm_group = own_replica ? groups_.replica : groups_.world;
  if (norm_group != nullptr) {
    // Through the backend's memory, where the world's communicator reads.
    double* sums = totals_.data<double>();
    RETURN_IF_ERROR(backend_.ToDevice(sums, totals, sizeof(totals)));
    const auto wait_start = Clock::now();
    absl::Status status = norm_group->AllReduce(sums, 2, DType::kFloat64, comm::ReduceOp::kSum);
    dp_wait_seconds_ += Since(wait_start);
    RETURN_IF_ERROR(Annotate(status, own_replica
                                         ? "the gradient norm's all-reduce over the replica"
                                         : "the gradient norm's all-reduce over the world"));
    RETURN_IF_ERROR(backend_.ToHost(totals, sums, sizeof(totals)));
  }
  StepStats stats;
  const int64_t samples =
      own_replica ? options_.global_batch / options_.parallel.dp : options_.global_batch;
  stats.loss = static_cast<float>(totals[1] / static_cast<double>(samples * T));
  stats.grad_norm = std::sqrt(totals[0]);
  if (!std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
  } else {
    const double max_norm = options_.adamw.max_grad_norm;
    // PyTorch's clip_grad_norm_, as cpu::ClipGradients.
    const double scale = max_norm > 0 ? std::min(1.0, max_norm / (stats.grad_norm + 1e-6)) : 1.0;
    kernels::cpu::AdamWConfig adamw = options_.adamw.adamw;
    adamw.learning_rate = learning_rate;
    RETURN_IF_ERROR(data_parallel_->Update(scale, step, adamw));
  }
  stats.seconds = Since(step_start);
  dp_wait_seconds_ += data_parallel_->TakeWaitSeconds();
  stats.comm_seconds = tp_seconds_ + dp_wait_seconds_;
  stats.bubble_seconds = pp_seconds_;
  stats.compute_seconds = std::max(0.0, stats.seconds - stats.comm_seconds - stats.bubble_seconds);
  return stats;
}

}  // namespace shardline::model
