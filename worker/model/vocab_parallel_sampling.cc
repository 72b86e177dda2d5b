#include "worker/model/vocab_parallel_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/vector_math.h"

namespace shardline::model {
namespace {

// kWhole draws over the whole vocabulary in id order; kNucleus over the nucleus of the whole
// vocabulary (top_p < 1); kTopK among the k best (then, with top_p < 1, their nucleus).
enum class Mode { kGreedy, kWhole, kNucleus, kTopK };

Mode ModeOf(const SamplingOptions& o, int vocab) {
  if (!(o.temperature > 0.0f)) return Mode::kGreedy;
  if (o.top_k > 0 && o.top_k < vocab) return Mode::kTopK;
  return o.top_p < 1.0f ? Mode::kNucleus : Mode::kWhole;
}

// This rank's candidates in SampleToken's order (by descending logit, ties by id), as local
// indices: the first `count` of them.
std::vector<int32_t> LocalBest(std::span<const float> l, int count) {
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  ids.resize(count);
  return ids;
}

// a before b in SampleToken's candidate order: higher logit, then lower id.
bool Before(double value_a, double id_a, double value_b, double id_b) {
  return value_a > value_b || (value_a == value_b && id_a < id_b);
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> SampleVocabParallel(std::span<const float> local_logits,
                                                         int vocab_begin, int vocab_end, int vocab,
                                                         std::span<const RowSampling> rows,
                                                         comm::Communicator* tp) {
  const int Vs = vocab_end - vocab_begin;
  const int R = static_cast<int>(rows.size());
  if (Vs < 1 || vocab_begin < 0 || vocab_end > vocab ||
      local_logits.size() != static_cast<size_t>(R) * Vs) {
    return absl::InvalidArgumentError(absl::StrCat("vocab-parallel sampling: ", local_logits.size(),
                                                   " logits for ", R, " rows of [", vocab_begin,
                                                   ", ", vocab_end, ") of ", vocab));
  }
  for (const RowSampling& row : rows) {
    if (row.options.top_k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("top_k must be >= 0, got ", row.options.top_k));
    }
    if (!(row.options.top_p > 0.0f && row.options.top_p <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("top_p must be in (0, 1], got ", row.options.top_p));
    }
  }
  std::vector<int32_t> tokens(R, 0);
  if (R == 0) return tokens;
  if (tp == nullptr || tp->size() == 1) {
    if (Vs != vocab) {
      return absl::InvalidArgumentError(absl::StrCat("vocab-parallel sampling: one rank holds [",
                                                     vocab_begin, ", ", vocab_end, ") of ", vocab,
                                                     " tokens"));
    }
    for (int r = 0; r < R; ++r) {
      ASSIGN_OR_RETURN(tokens[r], SampleToken(local_logits.subspan(int64_t{r} * Vs, Vs),
                                              rows[r].options, rows[r].draw));
    }
    return tokens;
  }
  const int P = tp->size();
  auto row_logits = [&](int r) { return local_logits.subspan(int64_t{r} * Vs, Vs); };

  // 1. Every row: this rank's best (value, global id), the first on ties.
  std::vector<float> best(2 * R), all_best(2 * R * P);
  for (int r = 0; r < R; ++r) {
    const std::span<const float> l = row_logits(r);
    const int i = static_cast<int>(kernels::cpu::ArgMax(l.data(), Vs));
    best[2 * r] = l[i];
    best[2 * r + 1] = static_cast<float>(vocab_begin + i);  // exact below 2^24
  }
  RETURN_IF_ERROR(
      Annotate(tp->AllGather(best.data(), all_best.data(), best.size(), DType::kFloat32),
               "vocab-parallel sampling: all-gather of each rank's best token"));
  std::vector<float> global_max(R);
  for (int r = 0; r < R; ++r) {
    int winner = 0;  // ranks hold ascending vocabulary ranges: the first best is the lowest id
    for (int p = 1; p < P; ++p) {
      if (all_best[2 * R * p + 2 * r] > all_best[2 * R * winner + 2 * r]) winner = p;
    }
    global_max[r] = all_best[2 * R * winner + 2 * r];
    tokens[r] = static_cast<int32_t>(all_best[2 * R * winner + 2 * r + 1]);
  }

  // 2. Sampled rows: each rank's share of the whole-vocabulary weights, or its k best.
  std::vector<double> mine;
  std::vector<int64_t> at(R, 0);  // where row r's numbers start in `mine` (the same on every rank)
  for (int r = 0; r < R; ++r) {
    const SamplingOptions& o = rows[r].options;
    at[r] = static_cast<int64_t>(mine.size());
    const std::span<const float> l = row_logits(r);
    switch (ModeOf(o, vocab)) {
      case Mode::kGreedy:
        break;
      case Mode::kWhole:
      case Mode::kNucleus: {
        double sum = 0.0;
        for (int v = 0; v < Vs; ++v) sum += SamplingWeight(l[v], global_max[r], o.temperature);
        mine.push_back(sum);
        break;
      }
      case Mode::kTopK: {
        const int k = o.top_k;
        const int here = std::min(k, Vs);
        const std::vector<int32_t> ids = LocalBest(l, here);
        for (int i = 0; i < k; ++i) {
          if (i < here) {
            mine.push_back(l[ids[i]]);
            mine.push_back(vocab_begin + ids[i]);
          } else {  // padding: after every real candidate
            mine.push_back(-std::numeric_limits<double>::infinity());
            mine.push_back(std::numeric_limits<double>::max());
          }
        }
        break;
      }
    }
  }
  if (mine.empty()) return tokens;  // all greedy
  const int64_t per_rank = static_cast<int64_t>(mine.size());
  std::vector<double> all(per_rank * P);
  RETURN_IF_ERROR(Annotate(tp->AllGather(mine.data(), all.data(), mine.size(), DType::kFloat64),
                           "vocab-parallel sampling: all-gather of the ranks' candidates"));

  // 3. Each sampled row's token. A whole-vocabulary draw lands in one rank's share: that rank
  // finds the token in its rows and a max-reduction tells the others (-1 from the rest).
  std::vector<int32_t> found(R, -1);
  bool any_whole = false;
  for (int r = 0; r < R; ++r) {
    const SamplingOptions& o = rows[r].options;
    const Mode mode = ModeOf(o, vocab);
    if (mode == Mode::kGreedy) continue;
    const double uniform = SamplingUniform(o.seed, rows[r].draw);
    if (mode == Mode::kTopK) {
      const int k = o.top_k;
      std::vector<std::pair<double, double>> candidates;  // (value, id)
      for (int p = 0; p < P; ++p) {
        const double* c = &all[per_rank * p + at[r]];
        for (int i = 0; i < k; ++i) candidates.emplace_back(c[2 * i], c[2 * i + 1]);
      }
      std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                        [](const auto& a, const auto& b) {
                          return Before(a.first, a.second, b.first, b.second);
                        });
      std::vector<float> values(k);
      for (int i = 0; i < k; ++i) values[i] = static_cast<float>(candidates[i].first);
      tokens[r] = static_cast<int32_t>(
          candidates[DrawAmongCandidates(values, o.temperature, o.top_p, -1.0, uniform)].second);
      continue;
    }
    if (mode == Mode::kNucleus) continue;  // step 4
    any_whole = true;
    double total = 0.0;
    for (int p = 0; p < P; ++p) total += all[per_rank * p + at[r]];
    const double u = uniform * total;
    double acc = 0.0;
    int owner = P - 1;  // u rounded past the last partial sum: the last rank's last token
    for (int p = 0; p < P; ++p) {
      const double share = all[per_rank * p + at[r]];
      if (u < acc + share) {
        owner = p;
        break;
      }
      acc += share;
    }
    if (owner != tp->rank()) continue;
    const std::span<const float> l = row_logits(r);
    found[r] = vocab_end - 1;
    for (int v = 0; v < Vs; ++v) {
      acc += SamplingWeight(l[v], global_max[r], o.temperature);
      if (u < acc) {
        found[r] = vocab_begin + v;
        break;
      }
    }
  }
  if (any_whole) {
    RETURN_IF_ERROR(
        Annotate(tp->AllReduce(found.data(), found.size(), DType::kInt32, comm::ReduceOp::kMax),
                 "vocab-parallel sampling: all-reduce of the drawn tokens"));
    for (int r = 0; r < R; ++r) {
      if (ModeOf(rows[r].options, vocab) == Mode::kWhole) tokens[r] = found[r];
    }
  }

  // 4. Nucleus rows. The nucleus is a prefix of the tokens by descending logit; its part on a
  // rank is a prefix of the rank's own order, and never longer than the rank's shortest prefix
  // that alone reaches top_p of the total (were it longer, the nucleus without its last token
  // would already reach top_p). So each rank offers that prefix, and every rank merges the offers
  // in the same order and draws as SampleToken does.
  std::vector<int> nucleus;
  for (int r = 0; r < R; ++r) {
    if (ModeOf(rows[r].options, vocab) == Mode::kNucleus) nucleus.push_back(r);
  }
  if (nucleus.empty()) return tokens;
  const size_t J = nucleus.size();
  std::vector<double> totals(J, 0.0);
  std::vector<std::vector<int32_t>> offers(J);
  std::vector<int32_t> lengths(J);
  for (size_t j = 0; j < J; ++j) {
    const int r = nucleus[j];
    const SamplingOptions& o = rows[r].options;
    for (int p = 0; p < P; ++p) totals[j] += all[per_rank * p + at[r]];
    const std::span<const float> l = row_logits(r);
    const std::vector<int32_t> order = LocalBest(l, Vs);
    const double target = double{o.top_p} * totals[j];
    double acc = 0.0;
    int count = 0;
    while (count < Vs && acc < target) {
      acc += SamplingWeight(l[order[count++]], global_max[r], o.temperature);
    }
    offers[j].assign(order.begin(), order.begin() + count);
    lengths[j] = count;
  }
  std::vector<int32_t> all_lengths(J * P);
  RETURN_IF_ERROR(Annotate(tp->AllGather(lengths.data(), all_lengths.data(), J, DType::kInt32),
                           "vocab-parallel sampling: all-gather of the nucleus offers' lengths"));
  std::vector<int64_t> start(J, 0);
  int64_t offer_floats = 0;
  for (size_t j = 0; j < J; ++j) {
    int64_t width = 0;
    for (int p = 0; p < P; ++p) width = std::max<int64_t>(width, all_lengths[J * p + j]);
    start[j] = offer_floats;
    offer_floats += 2 * width;
  }
  std::vector<float> offered(offer_floats, 0.0f), all_offered(offer_floats * P);
  for (size_t j = 0; j < J; ++j) {
    const std::span<const float> l = row_logits(nucleus[j]);
    for (size_t i = 0; i < offers[j].size(); ++i) {
      offered[start[j] + 2 * i] = l[offers[j][i]];
      offered[start[j] + 2 * i + 1] = static_cast<float>(vocab_begin + offers[j][i]);
    }
  }
  RETURN_IF_ERROR(
      Annotate(tp->AllGather(offered.data(), all_offered.data(), offered.size(), DType::kFloat32),
               "vocab-parallel sampling: all-gather of the nucleus offers"));
  for (size_t j = 0; j < J; ++j) {
    const int r = nucleus[j];
    const SamplingOptions& o = rows[r].options;
    std::vector<std::pair<float, float>> candidates;  // (value, id)
    for (int p = 0; p < P; ++p) {
      const float* c = &all_offered[offer_floats * p + start[j]];
      for (int32_t i = 0; i < all_lengths[J * p + j]; ++i) {
        candidates.emplace_back(c[2 * i], c[2 * i + 1]);
      }
    }
    std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      return Before(a.first, a.second, b.first, b.second);
    });
    std::vector<float> values(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) values[i] = candidates[i].first;
    const int pick = DrawAmongCandidates(values, o.temperature, o.top_p, totals[j],
                                         SamplingUniform(o.seed, rows[r].draw));
    tokens[r] = static_cast<int32_t>(candidates[pick].second);
  }
  return tokens;
}

}  // namespace shardline::model
