// Carving many buffers out of one allocation, so that the allocator's accounting shows a group of
// activations as one number: run a carve function once with a null base to count the floats,
// allocate that many, then run it again on the allocation.
#pragma once

#include <cstdint>

#include "worker/model/gpt_block.h"

namespace shardline::model {

// Hands out consecutive ranges of a buffer; with base == nullptr it only counts.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* Take(int64_t n) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += n;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

// One block's forward activations for `dims` (the heads and MLP columns held here).
inline void CarveBlockActivations(Carver& c, const BlockDims& d, BlockActivations& b) {
  const int64_t N = d.N();
  const bool mean = d.norm == NormKind::kLayerNorm;  // RMSNorm keeps its rstd only
  b.ln1 = c.Take(N * d.C);
  b.ln1_mean = mean ? c.Take(N) : nullptr;
  b.ln1_rstd = c.Take(N);
  b.qkv = c.Take(N * d.QkvWidth());
  b.atty = c.Take(N * d.Attn());
  b.att_lse = c.Take(N * d.NH);
  b.resid_mid = c.Take(N * d.C);
  b.ln2 = c.Take(N * d.C);
  b.ln2_mean = mean ? c.Take(N) : nullptr;
  b.ln2_rstd = c.Take(N);
  b.fch = c.Take(N * d.MlpWidth());
  b.fch_gelu = c.Take(N * d.F);
}

// What one block keeps from its forward to its backward under `mode`, carved from `c` (a
// micro-batch's slot); what it does not keep points into `recomputed`, one block's buffers
// (CarveRecomputeScratch) that every block of the stage shares and RecomputeBlock refills just
// before each backward. kNone keeps everything (CarveBlockActivations); kSelective keeps what the
// matrix multiplies produced (q/k/v, the residual after attention, the MLP's pre-activation) and
// the norms' statistics and attention's log-sum-exp (a few floats per row); kFull keeps
// nothing here: the block's input is the slot's residual, from which RecomputeBlock reruns it.
inline void CarveKeptBlockActivations(Carver& c, const BlockDims& d, placement::RecomputeMode mode,
                                      const BlockActivations& recomputed, BlockActivations& b) {
  if (mode == placement::RecomputeMode::kNone) {
    CarveBlockActivations(c, d, b);
    return;
  }
  b = recomputed;
  if (mode == placement::RecomputeMode::kFull) return;
  const int64_t N = d.N();
  const bool mean = d.norm == NormKind::kLayerNorm;
  b.ln1_mean = mean ? c.Take(N) : nullptr;
  b.ln1_rstd = c.Take(N);
  b.qkv = c.Take(N * d.QkvWidth());
  b.att_lse = c.Take(N * d.NH);
  b.resid_mid = c.Take(N * d.C);
  b.ln2_mean = mean ? c.Take(N) : nullptr;
  b.ln2_rstd = c.Take(N);
  b.fch = c.Take(N * d.MlpWidth());
}

// The one block's buffers that CarveKeptBlockActivations points the unkept activations at:
// nothing for kNone, the norms' outputs, the attention output and the MLP activation for
// kSelective, a whole block for kFull.
inline void CarveRecomputeScratch(Carver& c, const BlockDims& d, placement::RecomputeMode mode,
                                  BlockActivations& r) {
  r = BlockActivations{};
  if (mode == placement::RecomputeMode::kNone) return;
  if (mode == placement::RecomputeMode::kFull) {
    CarveBlockActivations(c, d, r);
    return;
  }
  const int64_t N = d.N();
  r.ln1 = c.Take(N * d.C);
  r.atty = c.Take(N * d.Attn());
  r.ln2 = c.Take(N * d.C);
  r.fch_gelu = c.Take(N * d.F);
}

// The scratch one block's backward uses, shared by every block; `replicated_kv`: the rank's
// key/value heads are replicated over tensor-parallel ranks (BlockGradScratch::dqkv_weight).
inline void CarveBlockGradScratch(Carver& c, const BlockDims& d, BlockGradScratch& s,
                                  bool replicated_kv = false) {
  const int64_t N = d.N();
  s.dresid_mid = c.Take(N * d.C);
  s.dln = c.Take(N * d.C);
  s.dfch_gelu = c.Take(N * d.F);
  s.dfch = c.Take(N * d.MlpWidth());
  s.datty = c.Take(N * d.Attn());
  s.dqkv = c.Take(N * d.QkvWidth());
  s.dqkv_weight = replicated_kv ? c.Take(int64_t{d.QkvWidth()} * d.C) : nullptr;
}

}  // namespace shardline::model
