#include "placement/planner.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "placement/byte_size.h"
#include "placement/string_view_compat.h"

namespace shardline::placement {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Timed candidates refined exactly (mapping, split, memory) before the best is chosen. The
// screening already splits the layers exactly, so the refinement changes little; a few dozen
// leave room for the alternatives and for screening's estimate of the data-parallel overlap.
constexpr size_t kRefine = 48;


// ---- nodes, sorted and indexed for range queries ----

// What the planner needs of one node, in the order nodes are used: fastest first, then the most
// memory, then spec order (a plan that does not need every device leaves the slowest idle).
struct NodeView {
  int index = 0;  // into ClusterSpec::nodes
  int devices = 0;
  double flops = 0;  // achievable per device
  double half_dim = -1;  // its measured fall-off for thin layers; < 0: none (MeasuredHalfDim)
  double peak_flops = 0;
  int64_t capacity = 0;  // bytes per device left for the model
  double memory_bandwidth = 0;
  double intra_bandwidth = 0, intra_latency = 0;
  double inter_bandwidth = 0, inter_latency = 0;
};

double LinkBandwidth(const LinkSpec& link, const CostModelOptions& o) {
  return link.measured_bandwidth > 0 ? link.measured_bandwidth : link.bandwidth * o.link_efficiency;
}

int64_t UsableMemory(const NodeSpec& n, const CostModelOptions& o) {
  const int64_t reserve =
      static_cast<int64_t>(o.fragmentation_reserve * static_cast<double>(n.device_memory));
  return n.device_memory - n.runtime_memory - reserve;
}

// Minimum (or maximum) over index ranges in O(1), after O(n log n) set-up.
template <typename T, bool kMax = false>
class RangeExtreme {
 public:
  RangeExtreme() = default;
  explicit RangeExtreme(const std::vector<T>& values) {
    const size_t n = values.size();
    table_.push_back(values);
    for (size_t w = 1; 2 * w <= n; w *= 2) {
      const std::vector<T>& prev = table_.back();
      std::vector<T> next(n - 2 * w + 1);
      for (size_t i = 0; i < next.size(); ++i) next[i] = Pick(prev[i], prev[i + w]);
      table_.push_back(std::move(next));
    }
  }
  // Over [lo, hi], lo <= hi.
  T Query(int lo, int hi) const {
    const int len = hi - lo + 1;
    const int level = 31 - __builtin_clz(static_cast<unsigned>(len));
    return Pick(table_[level][lo], table_[level][hi - (1 << level) + 1]);
  }

 private:
  static T Pick(T a, T b) { return kMax ? std::max(a, b) : std::min(a, b); }
  std::vector<std::vector<T>> table_;
};

// The nodes that can hold tensor-parallel groups of `tp` devices, each holding devices / tp of
// them ("slots"); slot j of the plan is the j-th group in node order.
struct SlotMap {
  int tp = 0;
  std::vector<const NodeView*> nodes;  // with at least one slot, in use order
  std::vector<int> first_slot;         // per node in `nodes`; plus the total at the end
  std::vector<int> node_of_slot;
  RangeExtreme<double> flops, memory_bandwidth, intra_bandwidth, inter_bandwidth;
  RangeExtreme<double, true> half_dim, intra_latency, inter_latency;
  RangeExtreme<int64_t> capacity;

  int slots() const { return first_slot.back(); }
};

SlotMap MakeSlotMap(const std::vector<NodeView>& sorted, int tp) {
  SlotMap m;
  m.tp = tp;
  std::vector<double> flops, half_dim, membw, intra_bw, inter_bw, intra_lat, inter_lat;
  std::vector<int64_t> capacity;
  int slot = 0;
  for (const NodeView& n : sorted) {
    const int groups = n.devices / tp;
    if (groups == 0) continue;
    m.nodes.push_back(&n);
    m.first_slot.push_back(slot);
    for (int g = 0; g < groups; ++g) m.node_of_slot.push_back(static_cast<int>(m.nodes.size()) - 1);
    slot += groups;
    flops.push_back(n.flops);
    half_dim.push_back(n.half_dim);
    membw.push_back(n.memory_bandwidth);
    intra_bw.push_back(n.intra_bandwidth);
    inter_bw.push_back(n.inter_bandwidth);
    intra_lat.push_back(n.intra_latency);
    inter_lat.push_back(n.inter_latency);
    capacity.push_back(n.capacity);
  }
  m.first_slot.push_back(slot);
  if (!m.nodes.empty()) {
    m.flops = RangeExtreme<double>(flops);
    m.half_dim = RangeExtreme<double, true>(half_dim);
    m.memory_bandwidth = RangeExtreme<double>(membw);
    m.intra_bandwidth = RangeExtreme<double>(intra_bw);
    m.inter_bandwidth = RangeExtreme<double>(inter_bw);
    m.intra_latency = RangeExtreme<double, true>(intra_lat);
    m.inter_latency = RangeExtreme<double, true>(inter_lat);
    m.capacity = RangeExtreme<int64_t>(capacity);
  }
  return m;
}

// The two rank → device orders (planner.h): where the tensor-parallel group of (stage p,
// data-parallel index d) goes.
enum class Order { kDpInner, kPpInner };
constexpr Order kOrders[] = {Order::kDpInner, Order::kPpInner};

std::string_view OrderName(Order o) { return o == Order::kDpInner ? "dp-inner" : "pp-inner"; }

int SlotOf(Order o, int pp, int dp, int p, int d) {
  return o == Order::kDpInner ? p * dp + d : d * pp + p;
}

// What each stage's devices offer under one (tp, pp, dp, order).
struct StageSite {
  StageHardware hw;
  int64_t capacity = 0;  // the smallest usable memory among the stage's devices
};

// Stage by stage: the range of nodes its groups lie on (a superset for pp-inner, where a stage's
// groups stride by pp slots), the slowest and smallest of them, and whether its data-parallel
// group and its link to the next stage stay inside one node.
std::vector<StageSite> SitesOf(const SlotMap& m, Order order, int pp, int dp) {
  std::vector<StageSite> sites(pp);
  std::vector<char> p2p_crosses(pp, 0);
  if (order == Order::kPpInner) {
    // The pair (d·pp + p, d·pp + p + 1) crosses a node exactly when a node starts at slot
    // d·pp + p + 1: walk the node starts inside the used slots.
    const int used = pp * dp;
    for (size_t k = 1; k < m.first_slot.size() - 1 && m.first_slot[k] < used; ++k) {
      const int p = m.first_slot[k] % pp - 1;
      if (p >= 0) p2p_crosses[p] = 1;
    }
  }
  for (int p = 0; p < pp; ++p) {
    const int lo = m.node_of_slot[SlotOf(order, pp, dp, p, 0)];
    const int hi = m.node_of_slot[SlotOf(order, pp, dp, p, dp - 1)];
    StageSite& site = sites[p];
    StageHardware& hw = site.hw;
    hw.flops = m.flops.Query(lo, hi);
    hw.half_dim = m.half_dim.Query(lo, hi);
    hw.memory_bandwidth = m.memory_bandwidth.Query(lo, hi);
    hw.tp_bandwidth = m.intra_bandwidth.Query(lo, hi);
    hw.tp_latency_s = m.intra_latency.Query(lo, hi);
    if (lo == hi) {
      hw.dp_bandwidth = hw.tp_bandwidth;
      hw.dp_latency_s = hw.tp_latency_s;
    } else {
      hw.dp_bandwidth = m.inter_bandwidth.Query(lo, hi);
      hw.dp_latency_s = m.inter_latency.Query(lo, hi);
    }
    site.capacity = m.capacity.Query(lo, hi);
    if (p + 1 < pp) {
      int a, b;
      bool crosses;
      if (order == Order::kDpInner) {
        // Pairs (p·dp + d, (p+1)·dp + d): all inside one node iff the two stages' slots are.
        a = m.node_of_slot[p * dp];
        b = m.node_of_slot[(p + 2) * dp - 1];
        crosses = a != b;
      } else {
        a = m.node_of_slot[p];
        b = m.node_of_slot[(dp - 1) * pp + p + 1];
        crosses = p2p_crosses[p] != 0;
      }
      hw.p2p_bandwidth = crosses ? m.inter_bandwidth.Query(a, b) : m.intra_bandwidth.Query(a, b);
      hw.p2p_latency_s = crosses ? m.inter_latency.Query(a, b) : m.intra_latency.Query(a, b);
    }
  }
  for (int p = 1; p < pp; ++p) {
    sites[p].hw.prev_p2p_bandwidth = sites[p - 1].hw.p2p_bandwidth;
    sites[p].hw.prev_p2p_latency_s = sites[p - 1].hw.p2p_latency_s;
  }
  return sites;
}

// ---- the layer → stage split ----

// The most layers stage s can hold in `capacity` bytes (0 when not even its fixed part fits).
// Under the interleaved schedule (t.chunks > 1) every stage holds exactly `even` layers (the
// split is always even): `even` when they fit, else 0.
int64_t MaxLayersByMemory(const StageMemoryTerms& t, int64_t capacity, int even) {
  if (t.chunks > 1) return t.At(even).total() <= capacity ? even : 0;
  const int64_t fixed = t.fixed.total();
  const int64_t per = t.per_layer.total();
  if (fixed + per > capacity) return 0;
  return per > 0 ? (capacity - fixed) / per : INT_MAX;
}

// Dynamic programming over stages: best[s][k] is the smallest possible slowest-stage time when
// the first k layers go to stages 0..s−1, each taking at least one layer and no more than its
// memory allows. A stage's time grows with its layers and best[s−1][k − n] shrinks, so the
// minimising n is found by bisection: O(pp · L · log L). Returns the split, or empty when none
// fits.
std::vector<int> SplitLayers(const std::vector<StageCostTerms>& cost,
                             const std::vector<int64_t>& max_layers, int layers) {
  const int pp = static_cast<int>(cost.size());
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(layers + 1, kInf));
  std::vector<std::vector<int>> choice(pp + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= pp; ++s) {
    const StageCostTerms& c = cost[s - 1];
    const int64_t cap = std::min<int64_t>(max_layers[s - 1], layers);
    // Stages after this one need a layer each.
    for (int k = s; k <= layers - (pp - s); ++k) {
      const int hi_n = static_cast<int>(std::min<int64_t>(cap, k - (s - 1)));
      if (hi_n < 1) continue;
      // Smallest n in [1, hi_n] whose own time reaches best[s−1][k−n]; the optimum is there or
      // one before.
      int lo = 1, hi = hi_n;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (c.At(mid) >= best[s - 1][k - mid])
          hi = mid;
        else
          lo = mid + 1;
      }
      for (int n = std::max(1, lo - 1); n <= std::min(hi_n, lo); ++n) {
        const double v = std::max(best[s - 1][k - n], c.At(n));
        if (v < best[s][k]) {
          best[s][k] = v;
          choice[s][k] = n;
        }
      }
    }
  }
  if (best[pp][layers] == kInf) return {};
  std::vector<int> split(pp);
  for (int s = pp, k = layers; s >= 1; --s) {
    split[s - 1] = choice[s][k];
    k -= choice[s][k];
  }
  return split;
}

// The same optimum by bisection on the slowest-stage time — Σ_s min(⌊(T − a_s)/b_s⌋, cap_s) ≥ L
// decides whether T is reachable — in O(pp) per step: the screening's split. Returns the split
// and sets `slowest`, or empty when no split fits.
std::vector<int> FastSplit(const std::vector<StageCostTerms>& cost,
                           const std::vector<int64_t>& max_layers, int layers) {
  const int pp = static_cast<int>(cost.size());
  int64_t room = 0;
  double lo = 0, hi = 0;
  for (int s = 0; s < pp; ++s) {
    const int64_t cap = std::min<int64_t>(max_layers[s], layers - (pp - 1));
    if (cap < 1) return {};
    room += cap;
    lo = std::max(lo, cost[s].At(1));
    hi = std::max(hi, cost[s].At(cap));
  }
  if (room < layers) return {};
  const auto take = [&](int s, double t) -> int64_t {
    const double per = cost[s].per_layer();
    const int64_t cap = std::min<int64_t>(max_layers[s], layers - (pp - 1));
    if (per <= 0) return cap;
    const double n = std::floor((t - cost[s].fixed()) / per * (1 + 1e-12));
    return std::clamp<int64_t>(static_cast<int64_t>(std::max(n, 0.0)), 0, cap);
  };
  const auto reachable = [&](double t) {
    int64_t total = 0;
    for (int s = 0; s < pp; ++s) {
      const int64_t n = take(s, t);
      if (n < 1) return false;
      total += n;
      if (total >= layers) return true;
    }
    return false;
  };
  // The fractional optimum is a good lower start; 40 halvings take the bracket to ~1e-12.
  if (!reachable(lo)) {
    for (int i = 0; i < 40 && hi - lo > 1e-9 * hi; ++i) {
      const double mid = (lo + hi) / 2;
      if (reachable(mid))
        hi = mid;
      else
        lo = mid;
    }
  } else {
    hi = lo;
  }
  // Fill stages up to their share of `hi`, then give back what exceeds `layers` from the end
  // (taking layers off a stage never makes it slower).
  std::vector<int> split(pp);
  int64_t total = 0;
  for (int s = 0; s < pp; ++s) {
    split[s] = static_cast<int>(take(s, hi));
    total += split[s];
  }
  for (int s = pp - 1; s >= 0 && total > layers; --s) {
    const int64_t give = std::min<int64_t>(split[s] - 1, total - layers);
    split[s] -= static_cast<int>(give);
    total -= give;
  }
  return split;
}

// ---- candidates and rejections ----

struct Candidate {
  int tp = 1, pp = 1, dp = 1, zero = 0;
  int64_t micro_batch = 1;
  int virtual_stages = 1;  // 1: 1F1B; ≥ 2: interleaved
  RecomputeMode recompute = RecomputeMode::kNone;
  Order order = Order::kDpInner;
  double time = kInf;  // screening's step time

  // The layout without its stage split (the refinement chooses that).
  ParallelSpec Parallel() const {
    ParallelSpec par;
    par.tp = tp;
    par.pp = pp;
    par.dp = dp;
    par.zero = zero;
    par.micro_batch = micro_batch;
    par.schedule =
        virtual_stages > 1 ? PipelineScheduleKind::kInterleaved : PipelineScheduleKind::k1F1B;
    par.virtual_stages = virtual_stages;
    par.recompute = recompute;
    return par;
  }
};

// "tp=1 pp=4 dp=8 zero=1 micro_batch=2", then " interleaved=2" and " recompute=selective" when
// they are not 1F1B and none.
std::string Describe(const ParallelSpec& p) {
  return absl::StrCat("tp=", p.tp, " pp=", p.pp, " dp=", p.dp, " zero=", p.zero,
                      " micro_batch=", p.micro_batch,
                      p.schedule == PipelineScheduleKind::kInterleaved
                          ? absl::StrCat(" interleaved=", p.virtual_stages)
                          : std::string(),
                      p.recompute != RecomputeMode::kNone
                          ? absl::StrCat(" recompute=", AbslView(RecomputeModeName(p.recompute)))
                          : std::string());
}

std::string Describe(const Candidate& c) { return Describe(c.Parallel()); }

enum Reason {
  kScheduleIndivisible,
  kTpIndivisible,
  kTpVocab,
  kTooManyDevices,
  kDeviceCount,
  kNodeFit,
  kOutOfMemory,
  kSlower,
  kSlowerUnbuilt,
  kZeroAlone,
  kReasons,
};

constexpr std::string_view kReasonText[kReasons] = {
    "the interleaved schedule does not fit (pp·virtual_stages must divide the layers and pp the "
    "micro-batches)",
    "tp does not divide heads, kv_heads and d_ff",
    "tp is more than the vocabulary",
    "needs more devices than the cluster has",
    "uses another device count than the request fixes",
    "tensor-parallel groups do not fit in the nodes",
    "out of memory",
    "fits, but cannot be among the fastest (a lower bound of its step time is slower)",
    "interleaved, cannot be among the fastest (a lower bound of its step time is slower; its "
    "schedule and memory were not worked out)",
    "ZeRO ≥ 1 without data parallelism (the same as ZeRO 0)",
};

struct Rejections {
  int64_t count[kReasons] = {};
  std::string example[kReasons];

  // `example` is only built for the first of a reason (a lambda, so that the common path does not
  // format strings).
  template <typename F>
  void Add(Reason r, int64_t n, F&& example_fn) {
    if (n <= 0) return;
    if (count[r] == 0) example[r] = example_fn();
    count[r] += n;
  }
};

// The closest miss among candidates that fit nowhere: its name, and the stage and bytes of the
// worst stage under an even split.
struct Miss {
  double short_bytes = kInf;
  Candidate candidate;
  int stage = 0;
  int64_t need = 0;
  int64_t capacity = 0;
};

// ---- the search ----

struct Search {
  const PlanRequest& request;
  const model::ModelConfig& model;
  const TrainSetup& train;
  const CostModelOptions& options;
  std::vector<NodeView> nodes;            // sorted
  std::vector<int> dps;                   // divisors of the global batch, ascending
  std::vector<std::vector<int64_t>> mbs;  // per dps entry: the micro-batch sizes allowed
  std::vector<int> zeros;
  std::vector<RecomputeMode> recomputes;
  std::vector<int> chunk_counts;  // virtual_stages to try: 1 is 1F1B
  int64_t devices = 0;
  Rejections rejected;
  Miss miss;
  std::vector<Candidate> timed;
  // The kRefine best screened times (a max-heap): what a candidate must beat to be timed.
  std::priority_queue<double> fastest;
  int64_t candidates = 0;
  int64_t feasible = 0;

  size_t refine = kRefine;  // at least the alternatives asked for, plus the best

  // The schedules' slots, by (pp, virtual_stages, micro-batches): an interleaved schedule is
  // built and checked once per shape, not per candidate. nullopt: the shape cannot be scheduled.
  mutable std::map<std::tuple<int, int, int64_t>, std::optional<std::vector<StageSlots>>> slots;
  const std::vector<StageSlots>* SlotsOf(const ParallelSpec& par, int64_t micro_batches) const {
    const auto key = std::make_tuple(par.pp, par.virtual_stages, micro_batches);
    auto it = slots.find(key);
    if (it == slots.end()) {
      absl::StatusOr<std::vector<StageSlots>> made = ScheduleSlots(par, micro_batches);
      it =
          slots.emplace(key, made.ok() ? std::make_optional(*std::move(made)) : std::nullopt).first;
    }
    return it->second ? &*it->second : nullptr;
  }

  double Cutoff() const { return fastest.size() < refine ? kInf : fastest.top(); }
  void Timed(const Candidate& c) {
    timed.push_back(c);
    fastest.push(c.time);
    if (fastest.size() > refine) fastest.pop();
  }

  explicit Search(const PlanRequest& r)
      : request(r), model(r.model), train(r.train), options(r.cost) {}
};

// Memory terms of every stage for one candidate (the fullest tensor-parallel rank: the largest
// vocabulary shard). False when the schedule cannot be built for it. Under 1F1B middle stages
// differ only in their activation slots (min(pp − s, micro-batches)), and activations are linear
// in the slots, so one middle stage is computed and the others scaled from it; the interleaved
// schedule's stages are each their own.
bool StageTerms(const Search& s, const ParallelSpec& par, std::vector<StageMemoryTerms>& out) {
  const int64_t micro_batches = s.train.global_batch / (int64_t{par.dp} * par.micro_batch);
  const std::vector<StageSlots>* slots = s.SlotsOf(par, micro_batches);
  if (slots == nullptr) return false;
  out.resize(par.pp);
  const int64_t vocab_rows = VocabShardRows(s.model.vocab, par.tp, -1);
  if (par.schedule == PipelineScheduleKind::kInterleaved) {
    for (int p = 0; p < par.pp; ++p) {
      out[p] = StageMemory(s.model, s.train, par, p, vocab_rows, (*slots)[p]);
    }
    return true;
  }
  out[0] = StageMemory(s.model, s.train, par, 0, vocab_rows, (*slots)[0]);
  if (par.pp == 1) return true;
  out[par.pp - 1] =
      StageMemory(s.model, s.train, par, par.pp - 1, vocab_rows, (*slots)[par.pp - 1]);
  if (par.pp == 2) return true;
  const StageMemoryTerms middle = StageMemory(s.model, s.train, par, 1, vocab_rows, (*slots)[1]);
  const int64_t slots1 = std::min<int64_t>(par.pp - 1, micro_batches);
  const int64_t fixed_per_slot = middle.fixed.activations / slots1;
  const int64_t layer_per_slot = middle.per_layer.activations / slots1;
  for (int p = 1; p + 1 < par.pp; ++p) {
    out[p] = middle;
    const int64_t slots = std::min<int64_t>(par.pp - p, micro_batches);
    out[p].fixed.activations = fixed_per_slot * slots;
    out[p].per_layer.activations = layer_per_slot * slots;
  }
  return true;
}

bool SameSites(const std::vector<StageSite>& a, const std::vector<StageSite>& b) {
  for (size_t p = 0; p < a.size(); ++p) {
    const StageHardware& x = a[p].hw;
    const StageHardware& y = b[p].hw;
    if (a[p].capacity != b[p].capacity || x.flops != y.flops ||
        x.half_dim != y.half_dim || x.memory_bandwidth != y.memory_bandwidth ||
        x.tp_bandwidth != y.tp_bandwidth ||
        x.tp_latency_s != y.tp_latency_s || x.dp_bandwidth != y.dp_bandwidth ||
        x.dp_latency_s != y.dp_latency_s || x.p2p_bandwidth != y.p2p_bandwidth ||
        x.p2p_latency_s != y.p2p_latency_s) {
      return false;
    }
  }
  return true;
}

// The step time no split can beat: the slowest stage takes at least the fractional optimum T*
// (Σ_s (T* − a_s)/b_s = L), and the first micro-batch crosses every stage. Interleaved, the fill
// is a 1/v of that: only m·T* is sure.
double StepLowerBound(const std::vector<StageCostTerms>& cost, int layers, double micro_batches,
                      bool interleaved) {
  double inv = 0, ratio = 0, fixed = 0, min_per = kInf;
  for (const StageCostTerms& c : cost) {
    const double per = c.per_layer();
    inv += 1 / per;
    ratio += c.fixed() / per;
    fixed += c.fixed();
    min_per = std::min(min_per, per);
  }
  const double t_star = (layers + ratio) / inv;
  if (interleaved) return micro_batches * t_star;
  return (micro_batches - 1) * t_star + fixed + layers * min_per;
}

// One (tp, pp, dp): both orders, every zero, schedule, recompute and micro-batch.
void SearchLayout(Search& s, const SlotMap& map, int tp, int pp, int dp, size_t dp_index) {
  const int layers = static_cast<int>(s.model.layers);
  std::vector<StageSite> sites[2];
  for (const Order o : kOrders) sites[static_cast<int>(o)] = SitesOf(map, o, pp, dp);
  // Homogeneous nodes often make both orders the same (pp = 1, dp = 1, or both inside a node).
  const bool one_order = SameSites(sites[0], sites[1]);
  std::vector<StageMemoryTerms> mem;
  std::vector<int64_t> max_layers(pp);
  std::vector<StageCostTerms> cost(pp);
  std::vector<StageHardware> hw(pp);
  const std::vector<int64_t>& mbs = s.mbs[dp_index];
  const int64_t per_zero =
      static_cast<int64_t>(mbs.size() * s.recomputes.size() * s.chunk_counts.size());
  const bool zero_zero_allowed = std::find(s.zeros.begin(), s.zeros.end(), 0) != s.zeros.end();
  for (const int zero : s.zeros) {
    if (dp == 1 && zero > 0 && zero_zero_allowed) {
      // ZeRO shards over the data-parallel group; over a group of one it is ZeRO 0 again.
      s.candidates += per_zero;
      s.rejected.Add(kZeroAlone, per_zero, [&] {
        return absl::StrCat("tp=", tp, " pp=", pp, " dp=1 zero=", zero, " is tp=", tp, " pp=", pp,
                            " dp=1 zero=0");
      });
      continue;
    }
    for (const int chunks : s.chunk_counts) {
      const bool interleaved = chunks > 1;
      if (interleaved && (pp < 2 || layers % (int64_t{pp} * chunks) != 0)) {
        // With one stage there is nothing to interleave; otherwise the chunks must be equal.
        const int64_t n = static_cast<int64_t>(mbs.size() * s.recomputes.size());
        s.candidates += n;
        s.rejected.Add(kScheduleIndivisible, n, [&] {
          return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp, " interleaved=", chunks, ": ",
                              pp < 2 ? "one stage"
                                     : absl::StrCat("layers ", layers, " % (pp·virtual_stages = ",
                                                    pp * chunks, ") = ", layers % (pp * chunks)));
        });
        continue;
      }
      for (const RecomputeMode recompute : s.recomputes) {
        for (size_t i = 0; i < mbs.size(); ++i) {
          ++s.candidates;
          Candidate base;
          base.tp = tp;
          base.pp = pp;
          base.dp = dp;
          base.zero = zero;
          base.micro_batch = mbs[i];
          base.virtual_stages = chunks;
          base.recompute = recompute;
          const ParallelSpec par = base.Parallel();
          const int64_t micro_batch_count = s.train.global_batch / (int64_t{dp} * mbs[i]);
          const double micro_batches = static_cast<double>(micro_batch_count);
          if (interleaved && micro_batch_count % pp != 0) {
            s.rejected.Add(kScheduleIndivisible, 1, [&] {
              return absl::StrCat(Describe(par), ": ", micro_batch_count,
                                  " micro-batches are not a multiple of pp ", pp);
            });
            continue;
          }
          if (interleaved) {
            // Building an interleaved schedule (for its memory) costs more than timing it: a
            // candidate that cannot enter the fastest few whatever its memory is not built.
            double bound = kInf;
            for (const Order o : kOrders) {
              if (o == Order::kPpInner && one_order) break;
              const std::vector<StageSite>& site = sites[static_cast<int>(o)];
              for (int p = 0; p < pp; ++p) {
                cost[p] = StageCost(s.model, s.train, par, p, site[p].hw, s.options);
              }
              bound = std::min(bound, StepLowerBound(cost, layers, micro_batches, true));
            }
            if (bound >= s.Cutoff()) {
              s.rejected.Add(kSlowerUnbuilt, 1, [&] {
                return absl::StrCat(Describe(par), ": at least ", absl::StrFormat("%.3g", bound),
                                    " s per step, the ", s.refine, " fastest take at most ",
                                    absl::StrFormat("%.3g", s.Cutoff()), " s");
              });
              continue;
            }
          }
          if (!StageTerms(s, par, mem)) {
            s.rejected.Add(kScheduleIndivisible, 1, [&] {
              return absl::StrCat(Describe(par), ": the schedule cannot be built");
            });
            continue;
          }
          Candidate best;
          best.time = kInf;
          bool fits = false;
          double bound = kInf;
          for (const Order o : kOrders) {
            if (o == Order::kPpInner && one_order) break;
            const std::vector<StageSite>& site = sites[static_cast<int>(o)];
            for (int p = 0; p < pp; ++p) {
              max_layers[p] = MaxLayersByMemory(mem[p], site[p].capacity, layers / pp);
            }
            // Memory first: the cheap exact bound (does any split fit?).
            int64_t room = 0;
            bool each = true;
            for (int p = 0; p < pp; ++p) {
              each = each && max_layers[p] >= 1;
              room += std::min<int64_t>(max_layers[p], layers);
            }
            if (!each || room < layers) continue;
            fits = true;
            for (int p = 0; p < pp; ++p) {
              hw[p] = site[p].hw;
              cost[p] = StageCost(s.model, s.train, par, p, hw[p], s.options);
            }
            // Then the time bound: a candidate that cannot enter the fastest few is not split.
            const double lower = StepLowerBound(cost, layers, micro_batches, interleaved);
            bound = std::min(bound, lower);
            if (lower >= s.Cutoff()) continue;
            const std::vector<int> split = FastSplit(cost, max_layers, layers);
            if (split.empty()) continue;
            const StepTime t =
                StepTimeOfStages(s.model, s.train, par, hw, cost, split, s.options, &mem);
            if (t.total < best.time) {
              best = base;
              best.order = o;
              best.time = t.total;
            }
          }
          if (fits) {
            if (best.time < kInf) {
              ++s.feasible;
              s.Timed(best);
            } else {
              s.rejected.Add(kSlower, 1, [&] {
                return absl::StrCat(Describe(par), ": at least ", absl::StrFormat("%.3g", bound),
                                    " s per step, the ", s.refine, " fastest take at most ",
                                    absl::StrFormat("%.3g", s.Cutoff()), " s");
              });
            }
            continue;
          }
          // Out of memory in both orders; under 1F1B larger micro-batches only need more
          // (activations grow with the micro-batch, and slots·micro_batch never shrinks), so count
          // them too. The interleaved schedule's slots are not monotone so: each is looked at.
          const int64_t rest = interleaved ? 1 : static_cast<int64_t>(mbs.size() - i);
          s.candidates += rest - 1;
          // How far off: the even split's worst stage on the dp-inner sites.
          const std::vector<StageRange> even = BalancedStages(layers, pp);
          const std::vector<StageSite>& site = sites[0];
          double worst = -kInf;
          int worst_stage = 0;
          for (int p = 0; p < pp; ++p) {
            const double over = static_cast<double>(mem[p].At(even[p].size()).total()) -
                                static_cast<double>(site[p].capacity);
            if (over > worst) {
              worst = over;
              worst_stage = p;
            }
          }
          const Candidate& c = base;
          const int64_t need = mem[worst_stage].At(even[worst_stage].size()).total();
          if (worst < s.miss.short_bytes) {
            s.miss = Miss{worst, c, worst_stage, need, site[worst_stage].capacity};
          }
          s.rejected.Add(kOutOfMemory, rest, [&] {
            return absl::StrCat(
                Describe(c), ": stage ", worst_stage, " needs ",
                FormatApproxByteSize(static_cast<double>(need)), " per device, ",
                FormatApproxByteSize(static_cast<double>(site[worst_stage].capacity)), " free");
          });
          if (!interleaved) break;
        }
      }
    }
  }
}

// The closest miss made exact: the smallest extra memory per device that would let some layer
// split fit (bisection on the extra bytes; each step asks whether any split fits), and the stage
// that needs it under that split.
Miss ExactMiss(const Search& s, const SlotMap& map, const Miss& estimate) {
  const Candidate& c = estimate.candidate;
  const int layers = static_cast<int>(s.model.layers);
  const ParallelSpec par = c.Parallel();
  const std::vector<StageSite> sites = SitesOf(map, Order::kDpInner, c.pp, c.dp);
  std::vector<StageMemoryTerms> mem;
  if (!StageTerms(s, par, mem)) return estimate;
  std::vector<int64_t> max_layers(c.pp);
  const auto fits = [&](int64_t extra) {
    int64_t room = 0;
    for (int p = 0; p < c.pp; ++p) {
      max_layers[p] = std::min<int64_t>(
          MaxLayersByMemory(mem[p], sites[p].capacity + extra, layers / c.pp), layers - (c.pp - 1));
      if (max_layers[p] < 1) return false;
      room += max_layers[p];
    }
    return room >= layers;
  };
  int64_t lo = 0, hi = std::max<int64_t>(1, static_cast<int64_t>(estimate.short_bytes));
  while (!fits(hi)) hi *= 2;
  while (lo + 1 < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid))
      hi = mid;
    else
      lo = mid;
  }
  fits(hi);
  // The split at that size: fill stages from the first, each up to what fits, one layer left for
  // every later stage; the worst stage is the one closest to (or past) its capacity.
  Miss out = estimate;
  int remaining = layers;
  double worst = -kInf;
  for (int p = 0; p < c.pp; ++p) {
    const int n =
        p + 1 == c.pp
            ? remaining
            : static_cast<int>(std::min<int64_t>(max_layers[p], remaining - (c.pp - 1 - p)));
    remaining -= n;
    const int64_t need = mem[p].At(n).total();
    const double over = static_cast<double>(need - sites[p].capacity);
    if (over > worst) {
      worst = over;
      out.stage = p;
      out.need = need;
      out.capacity = sites[p].capacity;
      out.short_bytes = over;
    }
  }
  return out;
}

// ---- the chosen plans ----

// The exact plan of a screened candidate: its split by dynamic programming, its memory per stage,
// its time and its rank → device map. Fails (nullopt-like: empty stage_layers) if it does not fit.
bool Refine(const Search& s, const SlotMap& map, const Candidate& c, PlannedLayout& out) {
  const int layers = static_cast<int>(s.model.layers);
  ParallelSpec par = c.Parallel();
  const std::vector<StageSite> sites = SitesOf(map, c.order, c.pp, c.dp);
  std::vector<StageMemoryTerms> mem;
  if (!StageTerms(s, par, mem)) return false;
  std::vector<int64_t> max_layers(c.pp);
  std::vector<StageCostTerms> cost(c.pp);
  std::vector<StageHardware> hw(c.pp);
  for (int p = 0; p < c.pp; ++p) {
    max_layers[p] = MaxLayersByMemory(mem[p], sites[p].capacity, layers / c.pp);
    hw[p] = sites[p].hw;
    cost[p] = StageCost(s.model, s.train, par, p, hw[p], s.options);
  }
  const std::vector<int>& fixed_split = s.request.constraints.stage_layers;
  std::vector<int> split;
  if (fixed_split.empty()) {
    split = SplitLayers(cost, max_layers, layers);
  } else {
    split = fixed_split;
    for (int p = 0; p < c.pp; ++p) {
      if (split[p] > max_layers[p]) return false;
    }
  }
  if (split.empty()) return false;
  // The interleaved schedule's split is always even (max_layers allowed nothing else) and is not
  // written out: ChunksOf refuses a given one.
  if (par.schedule != PipelineScheduleKind::kInterleaved) par.stage_layers = split;
  // The planner's promise: every plan passes the layout rules and fits every device.
  if (!ValidateParallel(s.model, s.train.global_batch, par, par.world()).ok()) return false;
  out = PlannedLayout{};
  out.parallel = par;
  out.stage_layers = split;
  out.micro_batches = s.train.global_batch / (int64_t{c.dp} * c.micro_batch);
  out.mapping = std::string(OrderName(c.order));
  double worst_ratio = -1;
  for (int p = 0; p < c.pp; ++p) {
    const MemoryBreakdown m = mem[p].At(split[p]);
    if (m.total() > sites[p].capacity) return false;
    out.stage_memory.push_back(m);
    const double ratio = static_cast<double>(m.total()) / static_cast<double>(sites[p].capacity);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      out.memory = m;
      out.peak_stage = p;
      out.memory_capacity = sites[p].capacity;
    }
  }
  out.time = StepTimeOfStages(s.model, s.train, par, hw, cost, split, s.options);
  const double tokens = static_cast<double>(s.train.global_batch * s.train.seq_len);
  const int world = par.world();
  out.tokens_per_s = tokens / out.time.total;
  out.tokens_per_s_per_device = out.tokens_per_s / world;
  out.model_flops_per_step = DeriveModel(s.model, s.train.seq_len).flops_per_token * tokens;
  // Rank → device, and the peak FLOP/s of the devices in use for MFU.
  out.devices.resize(world);
  double peak = 0;
  const ClusterSpec& cluster = s.request.cluster;
  for (int p = 0; p < c.pp; ++p) {
    for (int d = 0; d < c.dp; ++d) {
      const int slot = SlotOf(c.order, c.pp, c.dp, p, d);
      const int node = map.node_of_slot[slot];
      const int group = slot - map.first_slot[node];
      const NodeView& view = *map.nodes[node];
      for (int t = 0; t < c.tp; ++t) {
        const int rank = t + c.tp * (d + c.dp * p);
        out.devices[rank] = DevicePlace{view.index, cluster.nodes[view.index].id, group * c.tp + t};
      }
      peak += view.peak_flops * c.tp;
    }
  }
  out.mfu = out.model_flops_per_step / out.time.total / peak;
  return true;
}

absl::Status CheckRequest(const PlanRequest& r) {
  RETURN_IF_ERROR(ValidateClusterSpec(r.cluster));
  const model::ModelConfig& m = r.model;
  if (m.layers < 1 || m.heads < 1 || m.d_model < 1 || m.vocab < 1 || m.max_seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: layers, heads, d_model, vocab and max_seq_len must be at least 1, got layers ",
        m.layers, ", heads ", m.heads, ", d_model ", m.d_model, ", vocab ", m.vocab,
        ", max_seq_len ", m.max_seq_len));
  }
  // The split's dynamic programme is O(pp · layers) in memory: bounded as ParseModel bounds it.
  if (m.layers > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("model: layers ", m.layers, " is too many"));
  }
  if (m.d_model % m.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: d_model ", m.d_model, " is not divisible by heads ", m.heads));
  }
  if (m.kv() > m.heads || m.heads % m.kv() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: heads ", m.heads, " is not divisible by kv_heads ", m.kv()));
  }
  const TrainSetup& t = r.train;
  if (t.global_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train: global_batch must be at least 1, got ", t.global_batch));
  }
  if (t.seq_len < 1 || t.seq_len > m.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train: seq_len must be in [1, model.max_seq_len ", m.max_seq_len, "], got ", t.seq_len));
  }
  if (t.min_micro_batch < 1 || (t.max_micro_batch != 0 && t.max_micro_batch < t.min_micro_batch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train: the micro-batch range [", t.min_micro_batch, ", ", t.max_micro_batch,
                     "] is empty (min must be at least 1, max 0 for no bound or at least min)"));
  }
  const PlanConstraints& c = r.constraints;
  if (c.devices < 0 || c.tp < 0 || c.pp < 0 || c.dp < 0 || c.micro_batch < 0 || c.zero < -1 ||
      c.zero > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraints: devices, tp, pp, dp and micro_batch must be ≥ 0 (0: free) and zero in "
        "-1..3, got devices ",
        c.devices, " tp ", c.tp, " pp ", c.pp, " dp ", c.dp, " micro_batch ", c.micro_batch,
        " zero ", c.zero));
  }
  if (c.devices > r.cluster.devices()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraints: devices ", c.devices, " is more than the cluster's ", r.cluster.devices()));
  }
  if (c.recompute_modes.empty()) {
    return absl::InvalidArgumentError(
        "constraints: recompute_modes lists no mode; allow at least none");
  }
  if (c.virtual_stages.empty()) {
    return absl::InvalidArgumentError(
        "constraints: virtual_stages lists no schedule; 1 is 1F1B, 2 and more interleaved");
  }
  for (const int v : c.virtual_stages) {
    // Counts the layers do not divide are candidates the search rejects, with its reason.
    if (v < 1 || v > 1024) {
      return absl::InvalidArgumentError(absl::StrCat("constraints: virtual_stages lists ", v,
                                                     "; chunks per stage are 1 (1F1B) to 1024"));
    }
  }
  for (const int z : c.zero_stages) {
    if (z < 0 || z > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("constraints: zero_stages lists ", z, "; ZeRO stages are 0..3"));
    }
  }
  if (!c.stage_layers.empty()) {
    int64_t sum = 0;
    bool positive = true;
    for (const int n : c.stage_layers) {
      sum += n;
      positive = positive && n >= 1;
    }
    if (c.pp != static_cast<int>(c.stage_layers.size()) || !positive || sum != m.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constraints: stage_layers [", absl::StrJoin(c.stage_layers, ", "),
          "] must fix pp (", c.pp, ") entries of at least 1 layer summing to the model's ",
          m.layers, " layers"));
    }
  }
  return absl::OkStatus();
}

std::string TimeText(double s) {
  if (s >= 1) return absl::StrFormat("%.2f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.1f ms", s * 1e3);
  return absl::StrFormat("%.0f µs", s * 1e6);
}

std::string CountText(double n) {
  if (n >= 1e12) return absl::StrFormat("%.2fT", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.1fB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.1fM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

std::string LayoutLine(const PlannedLayout& l) {
  return absl::StrCat(Describe(l.parallel), " (", l.micro_batches, " micro-batches, ", l.mapping,
                      ")");
}

nlohmann::json MemoryJson(const MemoryBreakdown& m) {
  return {{"params", m.params},       {"grads", m.grads},
          {"optimizer", m.optimizer}, {"activations", m.activations},
          {"backward", m.backward},   {"comm_buffers", m.comm_buffers},
          {"total", m.total()}};
}

nlohmann::json LayoutJson(const PlannedLayout& l, bool with_devices) {
  nlohmann::json j;
  j["tp"] = l.parallel.tp;
  j["pp"] = l.parallel.pp;
  j["dp"] = l.parallel.dp;
  j["zero"] = l.parallel.zero;
  j["micro_batch"] = l.parallel.micro_batch;
  j["micro_batches"] = l.micro_batches;
  j["stage_layers"] = l.stage_layers;
  j["schedule"] = std::string(PipelineScheduleName(l.parallel.schedule));
  j["virtual_stages"] = l.parallel.virtual_stages;
  j["recompute"] = std::string(RecomputeModeName(l.parallel.recompute));
  j["mapping"] = l.mapping;
  j["world"] = l.parallel.world();
  j["memory"] = MemoryJson(l.memory);
  j["memory_capacity"] = l.memory_capacity;
  j["peak_stage"] = l.peak_stage;
  nlohmann::json stages = nlohmann::json::array();
  for (const MemoryBreakdown& m : l.stage_memory) stages.push_back(MemoryJson(m));
  j["stage_memory"] = stages;
  j["time"] = {{"compute", l.time.compute}, {"tp", l.time.tp}, {"pp", l.time.pp},
               {"bubble", l.time.bubble},   {"dp", l.time.dp}, {"optimizer", l.time.optimizer},
               {"total", l.time.total}};
  j["tokens_per_s"] = l.tokens_per_s;
  j["tokens_per_s_per_device"] = l.tokens_per_s_per_device;
  j["model_flops_per_step"] = l.model_flops_per_step;
  j["mfu"] = l.mfu;
  if (with_devices) {
    nlohmann::json devices = nlohmann::json::array();
    for (size_t r = 0; r < l.devices.size(); ++r) {
      devices.push_back({{"rank", r},
                         {"node", l.devices[r].node},
                         {"node_id", l.devices[r].node_id},
                         {"device", l.devices[r].device}});
    }
    j["devices"] = devices;
  }
  return j;
}

}  // namespace

absl::StatusOr<PlanReport> Plan(const PlanRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckRequest(request));
  Search s(request);
  const model::ModelConfig& model = request.model;
  const TrainSetup& train = request.train;
  const PlanConstraints& cons = request.constraints;
  const ClusterSpec& cluster = request.cluster;
  s.devices = cons.devices > 0 ? cons.devices : cluster.devices();
  s.refine = std::max<size_t>(kRefine, static_cast<size_t>(std::max(0, request.alternatives)) + 1);

  // Nodes in use order.
  int max_node_devices = 0;
  for (size_t i = 0; i < cluster.nodes.size(); ++i) {
    const NodeSpec& n = cluster.nodes[i];
    NodeView v;
    v.index = static_cast<int>(i);
    v.devices = n.devices;
    v.flops = AchievableFlops(n, train.precision, request.cost);
    v.half_dim = MeasuredHalfDim(n, train.precision);
    v.peak_flops = n.PeakFlops(train.precision) > 0 ? n.PeakFlops(train.precision)
                                                    : n.MeasuredFlops(train.precision);
    v.capacity = UsableMemory(n, request.cost);
    v.memory_bandwidth = n.memory_bandwidth;
    v.intra_bandwidth = LinkBandwidth(n.intra_node, request.cost);
    v.intra_latency = n.intra_node.latency_s;
    v.inter_bandwidth = LinkBandwidth(n.inter_node, request.cost);
    v.inter_latency = n.inter_node.latency_s;
    s.nodes.push_back(v);
    max_node_devices = std::max(max_node_devices, n.devices);
  }
  std::stable_sort(s.nodes.begin(), s.nodes.end(), [](const NodeView& a, const NodeView& b) {
    if (a.flops != b.flops) return a.flops > b.flops;
    return a.capacity > b.capacity;
  });
  if (cons.tp > max_node_devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("constraints: tp ", cons.tp, " is more than the largest node's ",
                     max_node_devices, " devices: tensor-parallel groups stay inside one node"));
  }

  // The domain: dp divides the global batch, the micro-batch divides batch/dp within the range.
  const int64_t B = train.global_batch;
  const int64_t mb_lo =
      std::max<int64_t>(train.min_micro_batch, cons.micro_batch > 0 ? cons.micro_batch : 1);
  const int64_t mb_hi_bound = train.max_micro_batch > 0 ? train.max_micro_batch : B;
  const int64_t mb_hi =
      cons.micro_batch > 0 ? std::min(mb_hi_bound, cons.micro_batch) : mb_hi_bound;
  for (int64_t dp = 1; dp <= std::min<int64_t>(B, s.devices); ++dp) {
    if (B % dp != 0 || (cons.dp > 0 && dp != cons.dp)) continue;
    std::vector<int64_t> mbs;
    const int64_t per_rank = B / dp;
    for (int64_t mb = mb_lo; mb <= std::min(mb_hi, per_rank); ++mb) {
      if (per_rank % mb == 0) mbs.push_back(mb);
    }
    if (mbs.empty()) continue;
    s.dps.push_back(static_cast<int>(dp));
    s.mbs.push_back(std::move(mbs));
  }
  if (cons.zero >= 0) {
    s.zeros = {cons.zero};
  } else {
    s.zeros = cons.zero_stages;
    std::sort(s.zeros.begin(), s.zeros.end());
    s.zeros.erase(std::unique(s.zeros.begin(), s.zeros.end()), s.zeros.end());
  }
  s.recomputes = cons.recompute_modes;
  std::sort(s.recomputes.begin(), s.recomputes.end());
  s.recomputes.erase(std::unique(s.recomputes.begin(), s.recomputes.end()), s.recomputes.end());
  s.chunk_counts = cons.virtual_stages;
  std::sort(s.chunk_counts.begin(), s.chunk_counts.end());
  s.chunk_counts.erase(std::unique(s.chunk_counts.begin(), s.chunk_counts.end()),
                       s.chunk_counts.end());
  if (s.dps.empty() || s.zeros.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no layout to choose from: ",
        s.zeros.empty() ? "constraints allow no ZeRO stage"
                        : absl::StrCat("no data-parallel degree",
                                       cons.dp > 0 ? absl::StrCat(" (fixed to ", cons.dp, ")") : "",
                                       " up to ", s.devices, " divides the global batch ", B,
                                       " with a micro-batch in [", mb_lo, ", ", mb_hi, "]")));
  }
  const int64_t per_mb =
      static_cast<int64_t>(s.zeros.size() * s.recomputes.size() * s.chunk_counts.size());
  int64_t per_pp = 0;  // candidates of one (tp, pp) over every dp
  for (const auto& mbs : s.mbs) per_pp += static_cast<int64_t>(mbs.size()) * per_mb;

  const int layers = static_cast<int>(model.layers);
  const int pp_lo = cons.pp > 0 ? cons.pp : 1;
  const int pp_hi = cons.pp > 0 ? cons.pp : layers;
  if (pp_lo > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("constraints: pp ", cons.pp, " is more than the model's ", layers, " layers"));
  }
  // Every (tp, pp, dp) the rules allow, then the search over them, largest worlds first: they are
  // usually the fastest, so the bound that skips hopeless candidates tightens early.
  struct Triple {
    int tp, pp, dp;
    size_t dp_index, map;
    int64_t world;
  };
  std::vector<Triple> triples;
  std::vector<SlotMap> maps;
  for (int tp = cons.tp > 0 ? cons.tp : 1; tp <= (cons.tp > 0 ? cons.tp : max_node_devices); ++tp) {
    const int64_t tp_candidates = per_pp * (pp_hi - pp_lo + 1);
    if (model.heads % tp != 0 || model.kv() % tp != 0 || model.ff() % tp != 0) {
      s.candidates += tp_candidates;
      s.rejected.Add(kTpIndivisible, tp_candidates, [&] {
        const int64_t bad = model.heads % tp != 0  ? model.heads
                            : model.kv() % tp != 0 ? model.kv()
                                                   : model.ff();
        const char* what = model.heads % tp != 0  ? "heads"
                           : model.kv() % tp != 0 ? "kv_heads"
                                                  : "d_ff";
        return absl::StrCat("tp=", tp, ": ", what, " ", bad, " % ", tp, " = ", bad % tp);
      });
      continue;
    }
    if (tp > model.vocab) {
      s.candidates += tp_candidates;
      s.rejected.Add(kTpVocab, tp_candidates,
                     [&] { return absl::StrCat("tp=", tp, ": vocab ", model.vocab); });
      continue;
    }
    maps.push_back(MakeSlotMap(s.nodes, tp));
    const SlotMap& map = maps.back();
    for (int pp = pp_lo; pp <= pp_hi; ++pp) {
      for (size_t i = 0; i < s.dps.size(); ++i) {
        const int dp = s.dps[i];
        const int64_t n = static_cast<int64_t>(s.mbs[i].size()) * per_mb;
        const int64_t world = int64_t{tp} * pp * dp;
        if (world > s.devices) {
          // Larger dp only need more: count them all.
          int64_t rest = 0;
          for (size_t j = i; j < s.dps.size(); ++j)
            rest += static_cast<int64_t>(s.mbs[j].size()) * per_mb;
          s.candidates += rest;
          s.rejected.Add(kTooManyDevices, rest, [&] {
            return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp, " needs ", world, " devices, ",
                                cons.devices > 0 ? "the request allows " : "the cluster has ",
                                s.devices);
          });
          break;
        }
        if (cons.devices > 0 && world != cons.devices) {
          s.candidates += n;
          s.rejected.Add(kDeviceCount, n, [&] {
            return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp, " uses ", world,
                                " devices, the request fixes ", cons.devices);
          });
          continue;
        }
        if (int64_t{pp} * dp > map.slots()) {
          s.candidates += n;
          s.rejected.Add(kNodeFit, n, [&] {
            return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp, " needs ", pp * dp,
                                " tensor-parallel groups of ", tp,
                                " devices, each inside one node; the nodes hold ", map.slots());
          });
          continue;
        }
        triples.push_back(Triple{tp, pp, dp, i, maps.size() - 1, world});
      }
    }
  }
  std::stable_sort(triples.begin(), triples.end(),
                   [](const Triple& a, const Triple& b) { return a.world > b.world; });
  // No plan computes faster than its model FLOPs over its devices at the fastest device's rate.
  double fastest_device = 0;
  for (const NodeView& n : s.nodes) fastest_device = std::max(fastest_device, n.flops);
  const double step_flops = DeriveModel(model, train.seq_len).flops_per_token *
                            static_cast<double>(train.global_batch * train.seq_len);
  for (const Triple& t : triples) {
    const double bound = step_flops / (static_cast<double>(t.world) * fastest_device);
    if (bound >= s.Cutoff()) {
      const int64_t n = static_cast<int64_t>(s.mbs[t.dp_index].size()) * per_mb;
      s.candidates += n;
      s.rejected.Add(kSlower, n, [&] {
        return absl::StrCat("tp=", t.tp, " pp=", t.pp, " dp=", t.dp, ": its ", t.world,
                            " devices need at least ", absl::StrFormat("%.3g", bound),
                            " s per step for the FLOPs alone, the ", s.refine,
                            " fastest take at most ", absl::StrFormat("%.3g", s.Cutoff()), " s");
      });
      continue;
    }
    SearchLayout(s, maps[t.map], t.tp, t.pp, t.dp, t.dp_index);
  }

  PlanReport report;
  report.model = DeriveModel(model, train.seq_len);
  report.train = train;
  report.cluster_name = cluster.name;
  report.cluster_devices = cluster.devices();
  report.candidates = s.candidates;
  report.feasible = s.feasible;
  for (int r = 0; r < kReasons; ++r) {
    if (s.rejected.count[r] > 0) {
      report.rejected.push_back(
          Rejection{std::string(kReasonText[r]), s.rejected.count[r], s.rejected.example[r]});
    }
  }
  std::stable_sort(report.rejected.begin(), report.rejected.end(),
                   [](const Rejection& a, const Rejection& b) { return a.count > b.count; });

  if (s.timed.empty()) {
    if (s.miss.short_bytes < kInf) {
      const SlotMap* map = nullptr;
      for (const SlotMap& candidate_map : maps) {
        if (candidate_map.tp == s.miss.candidate.tp) map = &candidate_map;
      }
      const Miss m = map != nullptr ? ExactMiss(s, *map, s.miss) : s.miss;
      return absl::ResourceExhaustedError(absl::StrCat(
          "no layout fits in memory (", s.candidates, " candidates): the closest, ",
          Describe(m.candidate), ", needs ", FormatApproxByteSize(static_cast<double>(m.need)),
          " per device on stage ", m.stage, " where ", FormatApproxByteSize(static_cast<double>(m.capacity)),
          " is free: ", FormatApproxByteSize(static_cast<double>(m.need - m.capacity)), " short"));
    }
    std::vector<std::string> reasons;
    for (const Rejection& r : report.rejected) {
      reasons.push_back(absl::StrCat(r.reason, " (", r.count, ", e.g. ", r.example, ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "no layout meets the rules (", s.candidates,
        " candidates): ", reasons.empty() ? "none to look at" : absl::StrJoin(reasons, "; ")));
  }

  // Refine the best screened candidates, fastest first.
  const size_t keep = std::min(s.timed.size(), s.refine);
  std::partial_sort(s.timed.begin(), s.timed.begin() + keep, s.timed.end(),
                    [](const Candidate& a, const Candidate& b) { return a.time < b.time; });
  std::vector<PlannedLayout> plans;
  for (size_t i = 0; i < keep; ++i) {
    const Candidate& c = s.timed[i];
    const SlotMap* map = nullptr;
    for (const SlotMap& m : maps) {
      if (m.tp == c.tp) map = &m;
    }
    PlannedLayout layout;
    if (map != nullptr && Refine(s, *map, c, layout)) plans.push_back(std::move(layout));
  }
  if (plans.empty()) {
    if (!cons.stage_layers.empty()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the fixed stage split [", absl::StrJoin(cons.stage_layers, ", "),
                       "] does not fit in memory on any layout the constraints allow"));
    }
    return absl::InternalError("the planner's screening and refinement disagree: no plan refined");
  }
  std::stable_sort(plans.begin(), plans.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.time.total != b.time.total) return a.time.total < b.time.total;
    return a.memory.total() < b.memory.total();
  });
  report.best = std::move(plans[0]);
  for (size_t i = 1;
       i < plans.size() && static_cast<int>(report.alternatives.size()) < request.alternatives;
       ++i) {
    report.alternatives.push_back(std::move(plans[i]));
  }
  report.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string FormatPlan(const PlanReport& r, bool explain) {
  const PlannedLayout& b = r.best;
  const ParallelSpec& p = b.parallel;
  std::string out;
  absl::StrAppend(&out, "model: ", CountText(static_cast<double>(r.model.params)), " parameters, ",
                  CountText(r.model.flops_per_token), " training FLOPs per token\n");
  absl::StrAppend(&out, "set-up: global batch ", r.train.global_batch, " × ", r.train.seq_len,
                  " tokens, ", AbslView(PrecisionName(r.train.precision)), "\n");
  absl::StrAppend(&out, "cluster: ", r.cluster_name, ", ", r.cluster_devices, " devices\n");
  absl::StrAppend(&out, "plan: ", LayoutLine(b), " on ", p.world(), " devices\n");
  absl::StrAppend(&out, "  stages: [", absl::StrJoin(b.stage_layers, ", "), "] layers",
                  p.schedule == PipelineScheduleKind::kInterleaved
                      ? absl::StrCat(", ", p.virtual_stages, " chunks each (interleaved 1F1B)")
                      : std::string(),
                  "\n");
  const MemoryBreakdown& m = b.memory;
  absl::StrAppend(
      &out, "  memory per device: ", FormatApproxByteSize(static_cast<double>(m.total())), " of ",
      FormatApproxByteSize(static_cast<double>(b.memory_capacity)), " usable (stage ", b.peak_stage, "): params ",
      FormatApproxByteSize(static_cast<double>(m.params)), ", grads ", FormatApproxByteSize(static_cast<double>(m.grads)),
      ", optimizer ", FormatApproxByteSize(static_cast<double>(m.optimizer)), ", activations ",
      FormatApproxByteSize(static_cast<double>(m.activations)), ", backward ", FormatApproxByteSize(static_cast<double>(m.backward)),
      ", comm buffers ", FormatApproxByteSize(static_cast<double>(m.comm_buffers)), "\n");
  const StepTime& t = b.time;
  absl::StrAppend(&out, "  step time: ", TimeText(t.total), " = compute ", TimeText(t.compute),
                  " + tp ", TimeText(t.tp), " + pp ", TimeText(t.pp), " + bubble ",
                  TimeText(t.bubble), " + dp ", TimeText(t.dp), " + optimizer ",
                  TimeText(t.optimizer), "\n");
  absl::StrAppend(&out, "  throughput: ", absl::StrFormat("%.0f", b.tokens_per_s), " tokens/s, ",
                  absl::StrFormat("%.1f", b.tokens_per_s_per_device), " tokens/s per device, MFU ",
                  absl::StrFormat("%.1f%%", 100 * b.mfu), "\n");
  if (!explain) return out;
  if (!r.alternatives.empty()) {
    absl::StrAppend(&out, "next best:\n");
    for (const PlannedLayout& a : r.alternatives) {
      absl::StrAppend(&out, "  ", LayoutLine(a), ": step ", TimeText(a.time.total), " (",
                      absl::StrFormat("%+.1f%%", 100 * (a.time.total / t.total - 1)), "), ",
                      FormatApproxByteSize(static_cast<double>(a.memory.total())), " per device, MFU ",
                      absl::StrFormat("%.1f%%", 100 * a.mfu), "\n");
    }
  }
  absl::StrAppend(&out, "searched ", r.candidates, " candidates, ", r.feasible,
                  " fit in memory and were timed\n");
  for (const Rejection& x : r.rejected) {
    absl::StrAppend(&out, "  rejected, ", x.reason, ": ", x.count, " (e.g. ", x.example, ")\n");
  }
  absl::StrAppend(&out, "rank → device (", b.mapping, "):\n");
  // One line per tensor-parallel group, at most 8 groups shown.
  const int groups = p.pp * p.dp;
  for (int g = 0; g < groups && g < 8; ++g) {
    const DevicePlace& first = b.devices[g * p.tp];
    const DevicePlace& last = b.devices[g * p.tp + p.tp - 1];
    if (p.tp == 1) {
      absl::StrAppend(&out, "  rank ", g, " (stage ", g / p.dp, ", dp ", g % p.dp, ") → ",
                      first.node_id, " device ", first.device, "\n");
    } else {
      absl::StrAppend(&out, "  ranks ", g * p.tp, "-", g * p.tp + p.tp - 1, " (stage ", g / p.dp,
                      ", dp ", g % p.dp, ") → ", first.node_id, " devices ", first.device, "-",
                      last.device, "\n");
    }
  }
  if (groups > 8) absl::StrAppend(&out, "  ... ", groups - 8, " more groups\n");
  absl::StrAppend(&out, "planned in ", TimeText(r.planning_seconds), "\n");
  return out;
}

nlohmann::json PlanToJson(const PlanReport& r) {
  nlohmann::json j;
  j["model"] = {{"params", r.model.params},
                {"layer_params", r.model.layer_params},
                {"embedding_params", r.model.embedding_params},
                {"head_params", r.model.head_params},
                {"flops_per_token", r.model.flops_per_token}};
  j["train"] = {{"global_batch", r.train.global_batch},
                {"seq_len", r.train.seq_len},
                {"min_micro_batch", r.train.min_micro_batch},
                {"max_micro_batch", r.train.max_micro_batch},
                {"precision", std::string(PrecisionName(r.train.precision))}};
  j["cluster"] = {{"name", r.cluster_name}, {"devices", r.cluster_devices}};
  j["best"] = LayoutJson(r.best, /*with_devices=*/true);
  nlohmann::json alternatives = nlohmann::json::array();
  for (const PlannedLayout& a : r.alternatives) alternatives.push_back(LayoutJson(a, false));
  j["alternatives"] = alternatives;
  nlohmann::json rejected = nlohmann::json::array();
  for (const Rejection& x : r.rejected) {
    rejected.push_back({{"reason", x.reason}, {"count", x.count}, {"example", x.example}});
  }
  j["rejected"] = rejected;
  j["candidates"] = r.candidates;
  j["feasible"] = r.feasible;
  j["planning_seconds"] = r.planning_seconds;
  return j;
}

}  // namespace shardline::placement
