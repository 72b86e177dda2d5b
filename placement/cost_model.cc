#include "placement/cost_model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"

namespace shardline::placement {
namespace {

// ---- constants, each with its source ----

// Bytes per element. fp32 everywhere on the CPU path (ShardedGpt allocates every tensor as
// DType::kFloat32). The GPU path is mixed precision: bf16 weights, gradients and activations with
// an fp32 master copy and fp32 Adam moments — ZeRO (Rajbhandari et al. 2020, §3.1) counts
// 2 + 2 + 12 bytes per parameter for it. Statistics (layer-norm mean and rstd, attention
// log-sum-exp, per-token losses) and the logits the loss reads are fp32 in both, as Megatron-LM's
// vocab-parallel cross-entropy upcasts the logits to fp32.
constexpr int64_t kFp32Bytes = 4;
constexpr int64_t kBf16Bytes = 2;
constexpr int64_t kStatBytes = 4;
constexpr int64_t kTokenIdBytes = 4;  // int32 token and target ids

int64_t ActBytes(Precision p) { return p == Precision::kFp32 ? kFp32Bytes : kBf16Bytes; }
int64_t ParamBytes(Precision p) { return p == Precision::kFp32 ? kFp32Bytes : kBf16Bytes; }
int64_t GradBytes(Precision p) { return p == Precision::kFp32 ? kFp32Bytes : kBf16Bytes; }
// AdamW's m and v, plus the fp32 master weights under mixed precision.
int64_t OptimizerBytes(Precision p) {
  return p == Precision::kFp32 ? 2 * kFp32Bytes : 3 * kFp32Bytes;
}

// Ring collectives (NCCL, Gloo): an all-reduce moves 2(d−1)/d of the message through every
// device's link, a reduce-scatter or all-gather (d−1)/d (Patarasuk & Yuan 2009; NCCL's
// PERFORMANCE.md "bus bandwidth"). Latency: NCCL switches to trees at scale, whose start-up grows
// with log2 d rather than d (NCCL's tuning model, src/graph/tuning.cc), so a collective pays
// 2·ceil(log2 d) link latencies (one way up, one down): CollectiveLatencySteps, below.
double AllReduceSeconds(double bytes, int d, double bandwidth, double latency) {
  if (d <= 1 || bytes <= 0) return 0;
  return 2.0 * (d - 1) / d * bytes / bandwidth + CollectiveLatencySteps(d) * latency;
}

double ScatterOrGatherSeconds(double bytes, int d, double bandwidth, double latency) {
  if (d <= 1 || bytes <= 0) return 0;
  return static_cast<double>(d - 1) / d * bytes / bandwidth +
         CollectiveLatencySteps(d) / 2 * latency;
}

double PointToPointSeconds(double bytes, double bandwidth, double latency) {
  if (bandwidth <= 0) return 0;
  return latency + bytes / bandwidth;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shape numbers every formula below uses, for one tensor-parallel rank.
struct Dims {
  int64_t C = 0;    // d_model
  int64_t Cs = 0;   // query width held here: heads/tp · head_size
  int64_t KVs = 0;  // key/value width held here: kv_heads/tp · head_size (one head at least)
  int64_t Fs = 0;   // MLP columns held here
  int64_t NH = 0;   // heads held here
  bool swiglu = false;  // three MLP matrices (gate, up, down) instead of two
  bool rms = false;     // RMSNorm keeps one statistic per token, LayerNorm two
  // Key/value heads shared by tensor-parallel ranks (tp > kv_heads): the backward's q/k/v weight
  // gradient scratch ((Cs + 2·KVs)·C) and the sum buffer of every key/value head's k and v rows
  // (2·kv_heads·head_size·C), both fixed per rank.
  int64_t shared_kv_scratch = 0;
  int64_t shared_kv_sum = 0;
  // From the model's tensor table, on this rank: one block's parameters, of which those in weight
  // matrices (what the FLOPs count), the position table (none with rotary positions) and the final
  // norm's gain and bias.
  int64_t block_params = 0;
  int64_t block_matrix_params = 0;
  int64_t wpe = 0;
  int64_t final_norm = 0;
};

Dims WalkDims(const model::ModelConfig& m, int tp) {
  Dims d;
  d.C = m.d_model;
  const int64_t head_size = m.head_size();
  d.Cs = m.heads / tp * head_size;
  d.KVs = std::max<int64_t>(1, m.kv() / tp) * head_size;
  if (tp > m.kv()) {
    d.shared_kv_scratch = (d.Cs + 2 * d.KVs) * m.d_model;
    d.shared_kv_sum = 2 * m.kv() * head_size * m.d_model;
  }
  d.Fs = m.ff() / tp;
  d.NH = m.heads / tp;
  d.swiglu = m.mlp == model::MlpKind::kSwiGlu;
  d.rms = m.norm == model::NormKind::kRmsNorm;
  for (const model::TensorRow& row : model::BlockRows(m)) {
    const int64_t n = model::TpBox(row, m, tp, 0).numel();
    d.block_params += n;
    if (row.shape.size() >= 2) d.block_matrix_params += n;
  }
  for (const model::TensorRow& row : model::EmbeddingRows(m)) {
    if (row.role == model::TensorRole::kPositionEmbedding) d.wpe = row.numel();
  }
  for (const model::TensorRow& row : model::HeadRows(m)) {
    if (row.role != model::TensorRole::kLmHead) d.final_norm += row.numel();
  }
  return d;
}

// The planner prices thousands of candidates of one model over a few tp values; walking the table
// (rows with names) each time made planning GPT-3-175B 10× slower, so the walks are remembered.
Dims DimsOf(const model::ModelConfig& m, int tp) {
  thread_local std::vector<std::tuple<model::ModelConfig, int, Dims>> known;
  for (const auto& [config, t, dims] : known) {
    if (t == tp && config == m) return dims;
  }
  if (known.size() >= 64) known.clear();
  known.emplace_back(m, tp, WalkDims(m, tp));
  return std::get<2>(known.back());
}

// Layer norms' statistics kept per token: mean and rstd for LayerNorm, rstd for RMSNorm.
int64_t NormStats(const Dims& d) { return d.rms ? 1 : 2; }

// The activation bytes one layer keeps per token for its backward (ShardedGpt's
// BlockActivations, minus the residual input, which the slot's residual list holds).
int64_t LayerActivationsPerToken(const Dims& d, Precision p) {
  const int64_t e = ActBytes(p);
  const int64_t qkv = d.Cs + 2 * d.KVs;
  // GELU: fch (its input) and fch_gelu; SwiGLU: gate, up and silu(gate)·up.
  const int64_t mlp = d.swiglu ? 3 * d.Fs : 2 * d.Fs;
  return e * (d.C /*ln1*/ + qkv + d.Cs /*atty*/ + d.C /*resid_mid*/ + d.C /*ln2*/ + mlp) +
         kStatBytes * (2 * NormStats(d) + d.NH /*att_lse*/);
}

// What selective recomputation drops of a layer's activations per token, in elements: both
// norms' outputs (ln1, ln2: C each), the attention output (atty: Cs) and the MLP's activation
// output (GELU: fch_gelu; SwiGLU: silu(gate)·up: Fs). Each is rebuilt in the backward from what is
// kept (the residual input and resid_mid with the norms' statistics, q/k/v with att_lse, the MLP's
// pre-activations); the recompute scratch holds one layer's worth.
int64_t SelectiveDroppedPerToken(const Dims& d) { return 2 * d.C + d.Cs + d.Fs; }

// The activation bytes one layer keeps per token for its backward under `mode`, the residual
// input not counted.
int64_t KeptActivationsPerToken(const Dims& d, Precision p, RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::kSelective:
      return LayerActivationsPerToken(d, p) - ActBytes(p) * SelectiveDroppedPerToken(d);
    case RecomputeMode::kFull:
      return 0;
    case RecomputeMode::kNone:
      break;
  }
  return LayerActivationsPerToken(d, p);
}

// The scratch the recomputation rebuilds one layer into, per token: selective the dropped
// tensors, full the whole layer's activations.
int64_t RecomputeScratchPerToken(const Dims& d, Precision p, RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::kSelective:
      return ActBytes(p) * SelectiveDroppedPerToken(d);
    case RecomputeMode::kFull:
      return LayerActivationsPerToken(d, p);
    case RecomputeMode::kNone:
      break;
  }
  return 0;
}

// The backward's working buffer per token: the gradient of one layer's activations
// (ShardedGpt's BlockGradScratch: dresid_mid, dln, the MLP's and attention's gradients).
int64_t LayerScratchPerToken(const Dims& d, Precision p) {
  const int64_t qkv = d.Cs + 2 * d.KVs;
  const int64_t mlp = d.swiglu ? 3 * d.Fs : 2 * d.Fs;
  return ActBytes(p) * (2 * d.C + mlp + d.Cs + qkv);
}

// The units of one stage, in elements on this rank, for the transient-buffer walk.
struct TransientUnits {
  int64_t layer = 0;
  int64_t wte = 0, wpe = 0;   // first stage (wpe 0 with rotary positions)
  int64_t lnf = 0, head = 0;  // last stage; head 0 when the tied head reads "wte" on this rank
  bool first = false, last = false;
  bool tied_single_stage = false;  // the head writes into wte's gradient, held until the end
};

// The peak bytes of ShardedGpt's transient buffers on one rank, walking a micro-batch's backward
// unit by unit (and the next forward's first gather) as sharded_gpt.cc runs it:
//   ZeRO 2/3: UnitGrads allocates the unit's gradient scratch (S·dp, S = ceil(unit/dp));
//     GradsReady hands it to a reduce-scatter task on the communication thread, which allocates
//     the reduced shard (S) when dp > 1 and frees both when done.
//   ZeRO 3: UnitParams allocates the gathered unit (S·dp) and then waits for the communication
//     thread (Drain), so every task submitted before it is done; ReleaseParams frees it.
//   ZeRO 2 never waits in the backward, so the communication thread may fall behind by its whole
//     queue: two tasks queued and one running (CommThread(2); Submit blocks past that). We count
//     that worst case, which is what CPU actors reach (Gloo's reduce-scatters are slower than the
//     backward of a layer); only the running task has allocated its reduced shard.
//   ZeRO 1/2 after the update: GatherUpdatedParams runs one unit's all-gather at a time, its
//     buffers (S + S·dp) allocated inside the running task.
//   A tied head on a one-stage pipeline writes into wte's scratch, which stays allocated until
//     the embedding's backward hands it over.
// `layers` is the stage's, or 4 for any more: by then the queue is full and the walk repeats.
int64_t TransientPeak(const TransientUnits& u, int zero, int64_t dp, Precision p, int layers) {
  const int64_t pb = ParamBytes(p), gb = GradBytes(p);
  const auto shard = [&](int64_t n) { return CeilDiv(n, dp); };
  int64_t peak = 0;
  if (zero == 1 || zero == 2) {
    if (dp > 1) {
      for (const int64_t n : {u.layer, u.wte, u.wpe, u.lnf, u.head}) {
        if (n > 0) peak = std::max(peak, pb * (shard(n) + shard(n) * dp));
      }
    }
  }
  if (zero < 2) return peak;
  // One backward: live buffers on the compute thread, and the tasks in flight.
  int64_t live = 0, held = 0;
  // The tasks in flight, oldest (running) first: their scratch bytes and reduced-shard bytes.
  std::vector<std::pair<int64_t, int64_t>> pending;
  const auto in_flight = [&] {
    int64_t sum = pending.empty() ? 0 : pending.front().second;
    for (const auto& task : pending) sum += task.first;
    return sum;
  };
  const auto note = [&] { peak = std::max(peak, live + held + in_flight()); };
  const auto gather = [&](int64_t n) {  // UnitParams: allocate, then wait for the thread
    live += pb * shard(n) * dp;
    note();
    pending.clear();
  };
  const auto release = [&](int64_t n) { live -= pb * shard(n) * dp; };
  const auto scratch = [&](int64_t n) {  // UnitGrads
    live += gb * shard(n) * dp;
    note();
  };
  const auto ready = [&](int64_t n) {  // GradsReady: the scratch moves into a task
    live -= gb * shard(n) * dp;
    if (pending.size() == 3) pending.erase(pending.begin());  // Submit waits for the running one
    pending.push_back({gb * shard(n) * dp, dp > 1 ? gb * shard(n) : 0});
    note();
  };
  const auto unit_backward = [&](int64_t n) {
    if (zero >= 3) gather(n);
    scratch(n);
    if (zero >= 3) release(n);
    ready(n);
  };
  if (u.last) {
    if (u.tied_single_stage) {
      // The head is wte: gathered, its scratch kept until the embedding's backward.
      if (zero >= 3) gather(u.wte);
      scratch(u.wte);
      live -= gb * shard(u.wte) * dp;
      held = gb * shard(u.wte) * dp;
      if (zero >= 3) release(u.wte);
    } else {
      unit_backward(u.head);
    }
    unit_backward(u.lnf);
  }
  for (int l = 0; l < layers; ++l) unit_backward(u.layer);
  if (u.first) {
    // The embeddings' gradients need no weights: no gather, no wait.
    if (u.tied_single_stage) {
      held = 0;
      live += gb * shard(u.wte) * dp;
      ready(u.wte);
    } else {
      scratch(u.wte);
      ready(u.wte);
    }
    if (u.wpe > 0) {
      scratch(u.wpe);
      ready(u.wpe);
    }
  }
  // The next micro-batch's forward gathers its first unit while these tasks may be in flight.
  if (zero >= 3) gather(u.first ? u.wte : u.layer);
  return peak;
}

}  // namespace

double CollectiveLatencySteps(int ranks) {
  // ceil(log2 ranks) without libm: the bit width of ranks − 1.
  return ranks <= 1 ? 0.0 : 2.0 * (32 - __builtin_clz(static_cast<unsigned>(ranks - 1)));
}

TrainSetup TrainSetupFor(const TrainSpec& spec, Precision precision) {
  TrainSetup setup;
  setup.global_batch = spec.batch;
  setup.seq_len = spec.seq_len;
  setup.precision = precision;
  return setup;
}

ModelStats DeriveModel(const model::ModelConfig& model, int64_t seq_len) {
  ModelStats s;
  const Dims d = DimsOf(model, 1);
  const int64_t C = model.d_model, V = model.vocab;
  s.layer_params = d.block_params;
  s.embedding_params = V * C + d.wpe;
  s.head_params = d.final_norm + (model.tied_embeddings ? 0 : V * C);
  s.params = model.layers * s.layer_params + s.embedding_params + s.head_params;
  s.layer_forward_flops_per_token = model::BlockForwardFlopsPerToken(model, seq_len);
  s.head_forward_flops_per_token = 2.0 * static_cast<double>(C) * static_cast<double>(V);
  // Backward is twice the forward (a gradient for the input and one for the weights).
  s.flops_per_token = 3.0 * (static_cast<double>(model.layers) * s.layer_forward_flops_per_token +
                             s.head_forward_flops_per_token);
  return s;
}

int64_t LayerActivationBytes(const model::ModelConfig& model, int64_t seq_len, int64_t micro_batch,
                             int tp, Precision precision, RecomputeMode recompute) {
  const Dims d = DimsOf(model, tp);
  const int64_t tokens = micro_batch * seq_len;
  return tokens * (ActBytes(precision) * d.C /*the residual input*/ +
                   KeptActivationsPerToken(d, precision, recompute));
}

absl::StatusOr<std::vector<StageSlots>> ScheduleSlots(const ParallelSpec& par,
                                                      int64_t micro_batches) {
  std::vector<StageSlots> out(par.pp);
  if (par.schedule == PipelineScheduleKind::k1F1B) {
    if (par.pp < 1 || micro_batches < 1) {
      return absl::InvalidArgumentError(absl::StrCat("no 1F1B schedule for pp ", par.pp, " and ",
                                                     micro_batches, " micro-batches"));
    }
    // 1F1B: stage s has at most pp − s forwards waiting for their backward (ShardedGpt::Allocate);
    // the last stage's one chunk holds the head.
    for (int s = 0; s < par.pp; ++s) {
      const int64_t slots = std::min<int64_t>(par.pp - s, micro_batches);
      (s + 1 == par.pp ? out[s].head_slots : out[s].body_slots) = slots;
      out[s].inputs = slots;  // each arrives right before its forward
    }
    return out;
  }
  if (micro_batches > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(micro_batches, " micro-batches is too many"));
  }
  ASSIGN_OR_RETURN(const PipelineSchedule schedule,
                   PipelineSchedule::Of(par, static_cast<int>(micro_batches)));
  for (int s = 0; s < par.pp; ++s) {
    out[s].chunks = schedule.virtual_stages();
    const int head_chunk = schedule.virtual_stages() - 1;
    out[s].body_slots = schedule.MaxInFlightWithoutHead(s);
    out[s].inputs = schedule.MaxInputsWithoutHead(s);
    if (s + 1 == par.pp) {
      out[s].head_slots = schedule.MaxInFlight(s, head_chunk);
      out[s].inputs += schedule.MaxInputs(s, head_chunk);
    }
    out[s].early_gradients = schedule.MaxEarlyGradients(s);
  }
  return out;
}

int64_t VocabShardRows(int64_t vocab, int tp, int tp_index) {
  if (tp_index >= 0) return vocab * (tp_index + 1) / tp - vocab * tp_index / tp;
  return CeilDiv(vocab, tp);  // floor-cut shards differ by at most one row; the largest is ceil
}

MemoryBreakdown StageMemoryTerms::At(int64_t layers) const {
  MemoryBreakdown m;
  m.params = fixed.params + layers * per_layer.params;
  m.grads = fixed.grads + layers * per_layer.grads;
  m.optimizer = fixed.optimizer + layers * per_layer.optimizer;
  const int64_t chunk_layers = layers / std::max(chunks, 1);
  m.activations = fixed.activations + chunk_layers * per_layer.activations;
  m.backward = fixed.backward + chunk_layers * per_layer.backward;
  m.comm_buffers = layers >= 1 && layers <= 3 ? comm_buffers_few[layers - 1] : fixed.comm_buffers;
  return m;
}

StageMemoryTerms StageMemory(const model::ModelConfig& model, const TrainSetup& setup,
                             const ParallelSpec& par, int stage, int64_t vocab_rows,
                             const StageSlots& kept) {
  const Dims d = DimsOf(model, par.tp);
  const Precision p = setup.precision;
  const int64_t e = ActBytes(p);
  const bool first = stage == 0;
  const bool last = stage == par.pp - 1;
  const int64_t dp = par.dp;
  const int64_t mb = par.micro_batch;
  const int64_t N = mb * setup.seq_len;  // tokens of one micro-batch
  const RecomputeMode recompute = par.recompute;
  // The slots of both pools (StageSlots), each for one chunk.
  const int64_t slots = kept.body_slots + kept.head_slots;
  const int64_t head_slots = kept.head_slots;

  StageMemoryTerms t;
  t.chunks = std::max(1, kept.chunks);
  // Weights, gradients, optimizer state: unit by unit (a layer, an embedding table), each sharded
  // over the data-parallel group in ceil(size / dp) pieces when ZeRO shards it (ShardedGpt pads the
  // shards so every rank sends the same count).
  const auto add_unit = [&](MemoryBreakdown& m, int64_t size) {
    (&m == &t.per_layer ? t.layer_param_count : t.fixed_param_count) += size;
    const int64_t shard = CeilDiv(size, dp);
    m.params += ParamBytes(p) * (par.zero >= 3 ? shard : size);
    m.grads += GradBytes(p) * (par.zero >= 2 ? shard : size);
    m.optimizer += OptimizerBytes(p) * (par.zero >= 1 ? shard : size);
  };
  const int64_t layer_unit = d.block_params;
  add_unit(t.per_layer, layer_unit);
  if (first) {
    add_unit(t.fixed, vocab_rows * d.C);                       // wte
    if (d.wpe > 0) add_unit(t.fixed, d.wpe);                   // wpe (replicated over tp)
  }
  if (last) {
    add_unit(t.fixed, d.final_norm);
    // An untied head, or the last stage's copy of the tied wte rows when wte lives elsewhere.
    if (!model.tied_embeddings || !first) {
      add_unit(t.fixed, vocab_rows * d.C);
    }
  }

  // Activations: `slots` micro-batch slots (ShardedGpt::Slot), each for a chunk. Per layer of a
  // chunk: its output on the residual stream and what the recomputation mode keeps of what its
  // backward reads.
  const int64_t per_layer_slot = N * (e * d.C + KeptActivationsPerToken(d, p, recompute));
  t.per_layer.activations = slots * per_layer_slot;
  // The chunks' inputs (the first of a residual list's layers + 1 entries), in a pool of their own
  // (an input may arrive before its forward takes a slot); in the head's slots (the last stage's
  // last chunk's) the final norm's output and statistics, this rank's logits (fp32) and the loss's
  // per-token numbers: losses, lse, local_max, global_max, sumexp, target_logit.
  t.fixed.activations = kept.inputs * N * e * d.C;
  // Each slot's tokens and targets (int32), in the memory of the device that reads them.
  t.fixed.activations += slots * N * 2 * kTokenIdBytes;

  if (last) {
    t.fixed.activations +=
        head_slots * N *
        (e * d.C + kStatBytes * NormStats(d) + kFp32Bytes * vocab_rows + kStatBytes * 6);
  }

  // The backward's shared buffer (one micro-batch at a time), sized for the stage's largest
  // chunk: the residual stream's gradients (chunk layers + 1 entries) and one layer's gradient
  // scratch; on the last stage the gradients of the final norm, the logits (fp32) and the losses.
  // Recomputation adds the one layer it rebuilds (RecomputeScratchPerToken), and the schedule its
  // gradients received before their backward can run, (N, C) each.
  t.per_layer.backward = N * e * d.C;
  t.fixed.backward = N * (e * d.C + LayerScratchPerToken(d, p));
  t.fixed.backward += N * RecomputeScratchPerToken(d, p, recompute);
  t.fixed.backward += kept.early_gradients * N * e * d.C;
  if (last) t.fixed.backward += N * (e * d.C + kFp32Bytes * vocab_rows + kStatBytes);
  // The norm's and the loss's sums (two doubles) for the world's all-reduce, in device memory:
  // one per rank, whatever the slots (the planner scales the activations with them).
  t.fixed.backward += 2 * 8;
  t.fixed.backward += e * d.shared_kv_scratch + kFp32Bytes * d.shared_kv_sum;

  // Transient buffers of the data-parallel reduction (TransientPeak).
  TransientUnits units;
  units.layer = layer_unit;
  units.first = first;
  units.last = last;
  units.tied_single_stage = first && last && model.tied_embeddings;
  if (first) {
    units.wte = vocab_rows * d.C;
    units.wpe = d.wpe;
  }
  if (last) {
    units.lnf = d.final_norm;
    units.head = (!model.tied_embeddings || !first) ? vocab_rows * d.C : 0;
  }
  // The tied embeddings' gradient exchange between the first and last stage (SumTiedEmbeddings):
  // one buffer of the wte unit (its shard under ZeRO 2/3), when nothing else is in flight.
  int64_t tied = 0;
  if (model.tied_embeddings && par.pp > 1 && (first || last)) {
    const int64_t rows = vocab_rows * d.C;
    tied = GradBytes(p) * (par.zero >= 2 ? CeilDiv(rows, dp) : rows);
  }
  t.fixed.comm_buffers = std::max(tied, TransientPeak(units, par.zero, dp, p, /*layers=*/4));
  for (int n = 1; n <= 3; ++n) {
    t.comm_buffers_few[n - 1] = std::max(tied, TransientPeak(units, par.zero, dp, p, n));
  }
  return t;
}

absl::StatusOr<std::vector<MemoryBreakdown>> PredictMemoryPerRank(const model::ModelConfig& model,
                                                                  const TrainSetup& setup,
                                                                  const ParallelSpec& parallel) {
  RETURN_IF_ERROR(ValidateParallel(model, setup.global_batch, parallel, parallel.world()));
  if (setup.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be at least 1, got ", setup.seq_len));
  }
  ASSIGN_OR_RETURN(const std::vector<StageRange> stages,
                   StagesOf(parallel, static_cast<int>(model.layers)));
  ASSIGN_OR_RETURN(const RankGrid grid, RankGrid::Create(parallel.tp, parallel.pp, parallel.dp));
  ParallelSpec resolved = parallel;
  resolved.micro_batch = MicroBatchSize(parallel, setup.global_batch);
  // The schedule once for every rank: an interleaved one is built and checked.
  ASSIGN_OR_RETURN(
      const std::vector<StageSlots> slots,
      ScheduleSlots(resolved, setup.global_batch / (resolved.dp * resolved.micro_batch)));
  std::vector<MemoryBreakdown> out;
  out.reserve(parallel.world());
  for (int r = 0; r < parallel.world(); ++r) {
    const RankCoords c = grid.Coords(r);
    const StageMemoryTerms terms = StageMemory(
        model, setup, resolved, c.pp, VocabShardRows(model.vocab, parallel.tp, c.tp), slots[c.pp]);
    out.push_back(terms.At(stages[c.pp].size()));
  }
  return out;
}

absl::StatusOr<MemoryBreakdown> PredictRankMemory(const model::ModelConfig& model,
                                                  const TrainSetup& setup,
                                                  const ParallelSpec& parallel, int rank) {
  if (rank < 0 || rank >= parallel.world()) {
    RETURN_IF_ERROR(ValidateParallel(model, setup.global_batch, parallel, parallel.world()));
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the layout's ", parallel.world(), " ranks"));
  }
  ASSIGN_OR_RETURN(const std::vector<MemoryBreakdown> all,
                   PredictMemoryPerRank(model, setup, parallel));
  return all[rank];
}

CostModelOptions CostModelOptions::Defaults() {
  CostModelOptions o;
  // Without calibration: Megatron-LM reaches 52% of the A100's bf16 peak end to end for a 1T GPT
  // on 3072 GPUs, bubble and communication included (Narayanan et al. 2021, Table 1: 163 of 312
  // TFLOP/s), and 56% with selective recomputation (Korthikanti et al. 2022, Table 5). Our model
  // charges the bubble and the communication separately, so the kernels alone run faster: 0.65.
  o.default_flops_fraction = 0.65;
  // A 128 × 128 output tile is the unit cuBLAS/CUTLASS schedule tensor-core GEMMs in (CUTLASS's
  // default threadblock shape), so a dimension of d keeps d/(d+128) of the machine busy — a
  // heuristic for thin GEMMs (small d_model/tp or few tokens per micro-batch), not a measurement.
  o.gemm_half_dim = 128;
  // nccl-tests all_reduce on a DGX A100 reaches ~230-240 GB/s bus bandwidth of NVLink3's 300 GB/s
  // per direction, and ~20-23 of HDR InfiniBand's 25 GB/s (NVIDIA, nccl-tests PERFORMANCE.md and
  // DGX A100 reference results): ~0.8 of nominal.
  o.link_efficiency = 0.8;
  // Memory fragmentation: the ZeRO paper (§3.2, "memory fragmentation") reports OOMs with over 30%
  // of memory free in extreme cases, from interleaved short- and long-lived tensors; ShardedGpt
  // carves its activations from one buffer per micro-batch, and PyTorch users plan for a few
  // percent. 5% is our margin, not a measurement.
  o.fragmentation_reserve = 0.05;
  // The data-parallel reduction runs on its own thread (stream) while the backward continues;
  // some of it contends for the same memory bandwidth and SMs. 0.9 of the overlap window is
  // hidden (an assumption; calibrate against measured step time).
  o.dp_overlap = 0.9;
  return o;
}

double AchievableFlops(const NodeSpec& node, Precision precision, const CostModelOptions& options) {
  const double measured = node.MeasuredFlops(precision);
  if (measured > 0) return measured;  // a whole layer's rate: nothing to discount
  return node.PeakFlops(precision) * options.default_flops_fraction;
}

double MeasuredHalfDim(const NodeSpec& node, Precision precision) {
  if (node.MeasuredFlops(precision) > 0 && node.measured_half_dim >= 0) {
    return node.measured_half_dim;
  }
  return -1;
}

StageCostTerms StageCost(const model::ModelConfig& model, const TrainSetup& setup,
                         const ParallelSpec& par, int stage, const StageHardware& hw,
                         const CostModelOptions& options) {
  const Dims d = DimsOf(model, par.tp);
  const Precision p = setup.precision;
  const double e = static_cast<double>(ActBytes(p));
  const double T = static_cast<double>(setup.seq_len);
  const double N = static_cast<double>(par.micro_batch) * T;
  const double C = static_cast<double>(d.C);
  const int tp = par.tp;
  const bool first = stage == 0;
  const bool last = stage == par.pp - 1;

  // Thin layers run below the wide-layer rate, r·x/(x + h). Without calibration h is the GPU
  // GEMM-tile heuristic and x the smallest GEMM dimension: the micro-batch's tokens or the width
  // one rank holds (tensor parallelism thins the tiles). A measured fall-off is a function of the
  // whole layer's width, the variable calibration varied: on CPUs it is the share of kernels
  // linear in the width (GELU, layer norms, softmax) against the GEMMs, and tensor parallelism
  // splits both alike (measured: a tp=2 rank of a d_model-256 layer ran 1.3× faster than a
  // d_model-128 layer of the same FLOPs), so there x is d_model.
  const bool measured_fall_off = hw.half_dim >= 0;
  const double width = static_cast<double>(measured_fall_off ? d.C : d.Cs);
  const double thin = std::min(N, width);
  const double half_dim = measured_fall_off ? hw.half_dim : options.gemm_half_dim;
  const double rate = hw.flops * thin / (thin + half_dim);

  const double matmul_weights = static_cast<double>(d.block_matrix_params);
  // Forward: 2 FLOPs per weight per token, and attention 4·T·Cs per token on this rank's heads.
  const double attention_forward = N * 4.0 * T * static_cast<double>(d.Cs);
  const double layer_forward = N * 2.0 * matmul_weights + attention_forward;
  const bool full = par.recompute == RecomputeMode::kFull;
  // Backward twice the forward; full recomputation runs the forward once more.
  const double passes = full ? 4.0 : 3.0;

  StageCostTerms c;
  c.layer_compute = passes * layer_forward / rate;
  if (par.recompute == RecomputeMode::kSelective) {
    // Selective recomputation reruns what it dropped (SelectiveDroppedPerToken): the attention's
    // QKᵀ and AV, priced as FLOPs at the layer's rate (no causal halving, as the forward's), and
    // the norms, GELU and the attention output's write, which do a handful of operations per
    // element and are bound by memory: each reads its input and writes its output (norms: C in
    // and out, twice; GELU: Fs; attention: q/k/v in, Cs out). Korthikanti et al. 2022 (§5)
    // measure selective recomputation at a few percent of a step for GPT-3-sized layers, where
    // full recomputation costs about a third: here the attention's 4·T·Cs against the layer's
    // forward is its FLOP share, the memory term what the FLOP count misses.
    c.layer_compute += attention_forward / rate;
    if (hw.memory_bandwidth > 0) {
      const double qkv = static_cast<double>(d.Cs + 2 * d.KVs);
      const double elements =
          4.0 * C + 2.0 * static_cast<double>(d.Fs) + qkv + static_cast<double>(d.Cs);
      c.layer_compute += N * elements * e / hw.memory_bandwidth;
    }
  }
  // Megatron's layers: two all-reduces of the (N, C) activations in the forward (after the
  // row-parallel attention output and MLP down-projection), two in the backward (the
  // column-parallel inputs' gradients), two more in a fully recomputed forward. Selective
  // recomputation rebuilds only what sits between them and all-reduces nothing.
  const double activation_bytes = N * C * e;
  const double tp_all_reduce =
      AllReduceSeconds(activation_bytes, tp, hw.tp_bandwidth, hw.tp_latency_s);
  c.layer_tp = (full ? 6.0 : 4.0) * tp_all_reduce;
  if (first) {
    // The vocab-parallel embedding: one all-reduce of its output; the lookup itself is memory
    // traffic, not FLOPs.
    c.fixed_tp += tp_all_reduce;
  }
  if (last) {
    // The head's GEMM over this rank's vocabulary rows, forward and backward (never recomputed),
    // the head input's gradient all-reduce and the cross-entropy's three per-token all-reduces
    // (max, sum of exponentials, target logit) of fp32 scalars.
    const double vocab_rows = static_cast<double>(VocabShardRows(model.vocab, tp, -1));
    c.fixed_compute += 3.0 * N * 2.0 * C * vocab_rows / rate;
    c.fixed_tp += tp_all_reduce +
                  3.0 * AllReduceSeconds(N * kStatBytes, tp, hw.tp_bandwidth, hw.tp_latency_s);
  }
  // Pipeline: each micro-batch's activation goes to the next stage and its gradient back to the
  // previous one, (N, C) each; the sends block (1F1B as Megatron-LM runs it without overlap).
  // Interleaved, every chunk sends: v times each, but for the wrap from the last stage's chunk c
  // to the first stage's chunk c + 1 (and its gradient back), v − 1 times. That link is not in
  // StageHardware: it is priced as the stage's own other link.
  const double v = par.schedule == PipelineScheduleKind::kInterleaved ? par.virtual_stages : 1;
  const double to_next = PointToPointSeconds(activation_bytes, hw.p2p_bandwidth, hw.p2p_latency_s);
  const double to_prev =
      PointToPointSeconds(activation_bytes, hw.prev_p2p_bandwidth, hw.prev_p2p_latency_s);
  if (!last) c.p2p += v * to_next;
  if (!first) c.p2p += v * to_prev;
  if (v > 1 && first) c.p2p += (v - 1) * to_next;
  if (v > 1 && last) c.p2p += (v - 1) * to_prev;
  return c;
}

StepTime PredictStepTime(const model::ModelConfig& model, const TrainSetup& setup,
                         const ParallelSpec& parallel, const std::vector<StageHardware>& hw,
                         const CostModelOptions& options) {
  ParallelSpec par = parallel;
  par.micro_batch = MicroBatchSize(parallel, setup.global_batch);
  const absl::StatusOr<std::vector<StageRange>> stages =
      StagesOf(par, static_cast<int>(model.layers));
  if (!stages.ok() || static_cast<int>(hw.size()) != par.pp) return StepTime{};
  std::vector<StageCostTerms> terms(par.pp);
  std::vector<int> layers(par.pp);
  for (int s = 0; s < par.pp; ++s) {
    terms[s] = StageCost(model, setup, par, s, hw[s], options);
    layers[s] = (*stages)[s].size();
  }
  return StepTimeOfStages(model, setup, par, hw, terms, layers, options);
}

StepTime StepTimeOfStages(const model::ModelConfig& model, const TrainSetup& setup,
                          const ParallelSpec& par, const std::vector<StageHardware>& hw,
                          const std::vector<StageCostTerms>& terms, const std::vector<int>& layers,
                          const CostModelOptions& options,
                          const std::vector<StageMemoryTerms>* memory) {
  StepTime out;
  const double m = static_cast<double>(setup.global_batch / (par.dp * par.micro_batch));
  const Precision p = setup.precision;
  const int dp = par.dp;
  // The backward's share of a micro-batch's compute (2 of 3 passes; 3 of 4 recomputing fully;
  // selective recomputation's few percent move it by less than a percent and are left out).
  const double backward_share = par.recompute == RecomputeMode::kFull ? 0.75 : 2.0 / 3.0;
  const double chunks =
      par.schedule == PipelineScheduleKind::kInterleaved ? std::max(par.virtual_stages, 1) : 1;

  double sum = 0;
  int bottleneck = 0;
  double slowest = -1;
  for (int s = 0; s < par.pp; ++s) {
    const double t = terms[s].At(layers[s]);
    sum += t;
    if (t > slowest) {
      slowest = t;
      bottleneck = s;
    }
  }
  // 1F1B: the first micro-batch crosses every stage (fill and drain), the others follow at the
  // pace of the slowest stage: Σ t_s + (m − 1)·max t_s (Narayanan et al. 2021 §2.2's bubble of
  // (p − 1)/m for equal stages). Interleaved, the fill and drain cross the stages chunk by chunk,
  // each a 1/v of the stage: the bubble is (Σ t_s − max t_s)/v, §2.2's (p − 1)/(v·m)
  // (PipelineSchedule::SimulatedBubble agrees: tests/unit/placement_cost_model_test.cc).
  const StageCostTerms& b = terms[bottleneck];
  const double nb = layers[bottleneck];
  out.compute = m * (b.fixed_compute + nb * b.layer_compute);
  out.tp = m * (b.fixed_tp + nb * b.layer_tp);
  out.pp = m * b.p2p;
  out.bubble = (sum - slowest) / chunks;

  // Data parallelism, stage by stage: what is left of the stage's reduction after the overlap,
  // and after the slack the stage has (it finished its last backward before stage 0 did, which
  // ends the pipeline).
  double slack = 0;
  for (int s = 0; s < par.pp; ++s) {
    const double n = layers[s];
    // Only the parameter counts are read here, which do not depend on the schedule's slots.
    const StageMemoryTerms mem =
        memory != nullptr
            ? (*memory)[s]
            : StageMemory(model, setup, par, s, VocabShardRows(model.vocab, par.tp, -1),
                          StageSlots{1, 1, 0, 1, 0});
    // Parameters of this rank, whole (ZeRO shards what it keeps, not what it reduces).
    const double params =
        static_cast<double>(mem.fixed_param_count) + n * static_cast<double>(mem.layer_param_count);
    const double pbytes = params * static_cast<double>(ParamBytes(p));
    const double gbytes = params * static_cast<double>(GradBytes(p));
    const double bw = hw[s].dp_bandwidth, lat = hw[s].dp_latency_s;
    // One collective per unit (ShardedGpt reduces layer by layer): latencies add up.
    const double units = n + (s == 0 ? 2 : 0) + (s == par.pp - 1 ? 2 : 0);
    const double unit_latency = (units - 1) * CollectiveLatencySteps(dp) * lat;
    const double compute_mb = terms[s].fixed_compute + n * terms[s].layer_compute;
    const double backward_mb = backward_share * compute_mb;
    double overlapped = 0, exposed = 0, window = 0;
    if (dp > 1) {
      switch (par.zero) {
        case 0:
        case 1:
          // Whole gradients all-reduced after the last micro-batch, overlapping its backward.
          overlapped = AllReduceSeconds(gbytes, dp, bw, lat) + unit_latency;
          window = backward_mb;
          break;
        case 2:
          // Every micro-batch's gradient reduce-scattered as its backward produces it.
          overlapped = m * (ScatterOrGatherSeconds(gbytes, dp, bw, lat) + unit_latency / 2);
          window = m * backward_mb;
          break;
        default: {
          // Every micro-batch gathers the weights for its forward and its backward, and
          // reduce-scatters its gradient. On GPUs the gathers are prefetched and overlap the
          // previous unit's compute (DeepSpeed's ZeRO-3); ShardedGpt (the fp32 CPU path) waits
          // for each gather before the unit runs, and a gather first drains the communication
          // queue, so the backward's reduce-scatters wait for it too: nothing is hidden.
          const double gathers =
              m * (2 * ScatterOrGatherSeconds(pbytes, dp, bw, lat) + unit_latency);
          const double scatters =
              m * (ScatterOrGatherSeconds(gbytes, dp, bw, lat) + unit_latency / 2);
          if (p == Precision::kFp32) {
            exposed = gathers + scatters;
          } else {
            overlapped = gathers + scatters;
            window = m * compute_mb;
          }
          break;
        }
      }
      // ZeRO 1/2 gather the updated weights after the optimizer step: nothing left to overlap.
      if (par.zero == 1 || par.zero == 2) {
        exposed = ScatterOrGatherSeconds(pbytes, dp, bw, lat) + unit_latency / 2;
      }
    }
    // On CPU actors (the fp32 path) the communication thread and Gloo's threads run on the cores
    // the kernels use: an overlapped reduction still takes its time from the step (measured:
    // data-parallel ranks computed 1.1-1.4× longer than their share of a single rank's step).
    const double overlap = p == Precision::kFp32 ? 0.0 : options.dp_overlap;
    const double hidden = overlap * (window + slack);
    out.dp = std::max(out.dp, std::max(0.0, overlapped - hidden) + exposed);
    // Stage s + 1 ends its backward one stage-backward earlier than stage s.
    slack += backward_share * terms[s].fixed_compute + backward_share * n * terms[s].layer_compute +
             terms[s].p2p / 2;
    const double owned = par.zero >= 1 ? std::ceil(params / dp) : params;
    out.optimizer =
        std::max(out.optimizer, owned * kOptimizerBytesPerParam / hw[s].memory_bandwidth);
  }
  out.total = out.compute + out.tp + out.pp + out.bubble + out.dp + out.optimizer;
  return out;
}

}  // namespace shardline::placement
