// Resume equivalence, the core of checkpoints on any plan: train 3 steps in plan A and save, then
// resume in plan B for 3 more; the losses of steps 4..6 and the final parameters and both AdamW
// moments equal an uninterrupted single-device run of 6 steps. Sharded runs are the ranks of
// TrainSharded as forked processes over real communicators (shared memory) (tests/support/forked_world.h);
// their shards are committed with the same StepAssembly and CommitStep as the coordinator's, and
// every final state is read back through the checkpoint reader. Single-device runs are
// `shardline train`'s loop (training::Train).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/commit.h"
#include "checkpoint/gpt2_hf_export.h"
#include "checkpoint/layout.h"
#include "checkpoint/verify.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"
#include "placement/checkpoint_state.h"
#include "placement/job_spec.h"
#include "tests/support/forked_world.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/sharded_trainer.h"
#include "worker/training/trainer.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kFirst = 3;  // steps in plan A
constexpr int kSteps = 6;  // in all

// Tolerances, fp32. Losses relative 1e-5 and parameters absolute 1e-5 (= lr/100), as the sharded
// equivalence tests (model_sharded_test.cc) hold them: sharding changes only the order of sums.
// The moments are compared relative to each tensor's largest value, 1e-4: a first moment is a sum
// of gradients, whose rounding noise is 1e-6 relative, and the second moment of an element whose
// gradient is near zero is noise of that size itself.
constexpr double kLossRelTol = 1e-5;
constexpr double kParamAbsTol = 1e-5;
constexpr double kMomentRelTol = 1e-4;

struct Plan {
  int tp = 1, pp = 1, dp = 1, zero = 0;
  int micro_batch = 2;
  std::vector<int> stages;  // empty: even
  bool interleaved = false;  // the interleaved schedule, 2 chunks per stage
  std::string recompute = "none";
  bool llama = false;  // the Llama of TrainSections instead of the GPT
  std::string data_parallel;  // the YAML `data_parallel:` section (a flow map), empty: none
  // AdamW with beta1 0, eps 1e4, lr 10 and no clipping or decay: lr·g/(|g| + eps), SGD with
  // learning rate 1e-3 to within |g|/eps, a linear update (for DiLoCo's reduction to plain data
  // parallelism, which holds only for a linear inner step).
  bool linear_adamw = false;
  // Gloo over TCP (every rank its own host, so that a compressed reduction compresses) instead of
  // shared memory.
  bool gloo = false;
  bool single() const { return tp * pp * dp == 1 && stages.empty(); }
  int world() const { return tp * pp * dp; }
  std::string Name() const {
    std::string name = llama ? "llama_" : "";
    if (single()) return name + "single";
    if (tp > 1) name += "tp" + std::to_string(tp);
    if (pp > 1) name += "pp" + std::to_string(pp);
    if (dp > 1) name += "dp" + std::to_string(dp) + "zero" + std::to_string(zero);
    for (int s : stages) name += "_" + std::to_string(s);
    if (interleaved) name += "_interleaved2";
    if (recompute != "none") name += "_recompute_" + recompute;
    if (!data_parallel.empty()) name += "_dp_options";
    return name;
  }
};

// The model, data, optimizer and schedule every run shares: vocab 257 is prime, so tensor
// parallelism splits the vocabulary unevenly. The Llama has 4 query heads over 2 key/value heads:
// tp 2 cuts them, tp 4 shares each over 2 ranks.
std::string TrainSections(int steps, const std::string& dir, bool llama) {
  return std::string(llama ? "model: {arch: llama, layers: 4, heads: 4, kv_heads: 2, d_model: 32, "
                             "d_ff: 64, max_seq_len: 16}\n"
                           : "model: {layers: 4, heads: 4, d_model: 32, max_seq_len: 16}\n") +
         "data: {synthetic: {seed: 3, bytes: 64KiB}}\n"
         "optimizer: {lr: 1.0e-3, weight_decay: 0.1, grad_clip: 1.0}\n"
         "steps: " +
         std::to_string(steps) +
         "\n"
         "batch: 12\n"
         "seq_len: 16\n"
         "seed: 7\n"
         "checkpoint: {dir: " +
         dir + ", interval: " + std::to_string(kFirst) +
         "}\n"
         "log_interval: 1\n";
}

placement::JobSpec JobOf(const Plan& plan, int steps, const std::string& dir) {
  std::string stages;
  for (int s : plan.stages) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
  const std::string yaml =
      "name: resume\nkind: train\ndevices: cpu\nmicro_batch: " + std::to_string(plan.micro_batch) +
      "\nparallel: {tp: " + std::to_string(plan.tp) + ", pp: " + std::to_string(plan.pp) +
      ", dp: " + std::to_string(plan.dp) + ", zero: " + std::to_string(plan.zero) +
      (stages.empty() ? "" : ", stages: [" + stages + "]") +
      (plan.interleaved ? ", schedule: interleaved, virtual_stages: 2" : "") +
      ", recompute: " + plan.recompute + "}\n" +
      (plan.data_parallel.empty() ? "" : "data_parallel: " + plan.data_parallel + "\n") +
      TrainSections(steps, dir, plan.llama);
  absl::StatusOr<placement::JobSpec> spec = placement::ParseJobSpec(yaml, plan.Name() + ".yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (spec.ok() && plan.linear_adamw) {
    // Past what a spec may say (eps ≤ 1), on purpose: see Plan::linear_adamw.
    placement::OptimizerSpec& o = spec->train.optimizer;
    o.beta1 = 0;
    o.eps = 1e4;
    o.lr = 10;
    o.grad_clip = 0;
    o.weight_decay = 0;
  }
  return *spec;
}

Json ToJson(const SavedStep& saved) {
  Json pieces = Json::array();
  for (const checkpoint::SavedPiece& p : saved.shard.pieces) {
    pieces.push_back({{"name", p.name}, {"tensor", p.tensor}, {"global_shape", p.global_shape},
                      {"offsets", p.offsets}, {"shape", p.shape}, {"xxh3", p.xxh3}});
  }
  return {{"step", saved.step}, {"rank", saved.shard.rank}, {"file", saved.shard.file},
          {"bytes", saved.shard.bytes}, {"xxh3", saved.shard.xxh3}, {"pieces", pieces},
          {"tokens", saved.data.tokens}, {"data_xxh3", saved.data.xxh3}};
}

SavedStep FromJson(const Json& json) {
  SavedStep saved;
  saved.step = json["step"];
  saved.shard.rank = json["rank"];
  saved.shard.file = json["file"];
  saved.shard.bytes = json["bytes"];
  saved.shard.xxh3 = json["xxh3"];
  for (const Json& p : json["pieces"]) {
    saved.shard.pieces.push_back({p["name"], p["tensor"], checkpoint::SafetensorsDType::kF32,
                                  p["global_shape"], p["offsets"], p["shape"], p["xxh3"]});
  }
  saved.data.tokens = json["tokens"];
  saved.data.xxh3 = json["data_xxh3"];
  return saved;
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path);
  std::vector<float> values;
  for (float v; in >> v;) values.push_back(v);
  return values;
}

void WriteFloats(const std::string& path, const std::vector<float>& values) {
  std::ofstream out(path);
  out.precision(9);
  for (float v : values) out << v << "\n";
}

// Runs `plan` for steps [from + 1, steps] with checkpoint.dir `dir`, resuming from `resume` (a
// manifest; empty: fresh, from `init_from` when given); commits its saves. Returns the losses it
// trained.
std::vector<float> RunPlan(const Plan& plan, int steps, const std::string& dir,
                           const std::string& resume, const std::string& init_from = "") {
  const std::string work = testing::MakeTempDir("shardline_resume_work");
  placement::JobSpec job = JobOf(plan, steps, dir);
  job.train.init_from = init_from;
  auto grid = placement::RankGrid::Create(plan.tp, plan.pp, plan.dp);
  if (plan.single()) {
    placement::TrainSpec spec = job.train;
    if (!resume.empty()) {
      spec.checkpoint.resume = checkpoint::ResumeMode::kPath;
      spec.checkpoint.resume_path = resume;
    }
    const testing::ForkedWorldResult result = testing::RunForkedWorld(
        *grid, work, [&](int, const placement::RankCoords&, const model::ShardedGroups&) {
          auto trained = Train(spec, {});
          if (!trained.ok()) {
            std::fprintf(stderr, "single: %s\n", std::string(trained.status().message()).c_str());
            return 1;
          }
          WriteFloats(work + "/losses", trained->losses);
          return 0;
        });
    EXPECT_TRUE(result.ok()) << plan.Name() << ": " << result.Describe();
  } else {
    const std::string store = work + "/store";
    fs::create_directories(store);
    const testing::ForkedWorldResult result = testing::RunForkedWorld(
        *grid, store,
        [&](int rank, const placement::RankCoords&, const model::ShardedGroups& groups) {
          ShardedTrainOptions options;
          options.spec = job;
          options.rank = rank;
          options.groups = groups;
          options.resume_manifest = resume;
          options.on_saved = [&](const SavedStep& saved) {
            std::ofstream(work + "/saved-" + std::to_string(saved.step) + "-" +
                          std::to_string(rank) + ".json")
                << ToJson(saved).dump();
            return absl::OkStatus();
          };
          auto trained = TrainSharded(options);
          if (!trained.ok()) {
            std::fprintf(stderr, "rank %d: %s\n", rank,
                         std::string(trained.status().message()).c_str());
            return 1;
          }
          if (rank == 0) WriteFloats(work + "/losses", trained->losses);
          return 0;
        },
        std::chrono::seconds(120),
        plan.gloo ? testing::ForkedBackend::kGloo : testing::ForkedBackend::kCpu);
    EXPECT_TRUE(result.ok()) << plan.Name() << ": " << result.Describe();
    // What the coordinator does once every rank has reported a step.
    for (int step = kFirst; step <= steps; step += kFirst) {
      checkpoint::StepAssembly assembly;
      checkpoint::DataIdentity data;
      for (int rank = 0; rank < plan.world(); ++rank) {
        std::ifstream in(work + "/saved-" + std::to_string(step) + "-" + std::to_string(rank) +
                         ".json");
        if (!in) continue;  // a step this run did not save (it resumed after it)
        const SavedStep saved = FromJson(Json::parse(in));
        data = saved.data;
        EXPECT_TRUE(assembly.Add(saved.shard).ok());
      }
      if (assembly.size() == 0) continue;
      placement::ParallelSpec parallel = job.parallel;
      absl::StatusOr<checkpoint::Manifest> manifest = assembly.Build(
          placement::CheckpointStepHeader(job.train, parallel, step, plan.world(), data));
      EXPECT_TRUE(manifest.ok()) << plan.Name() << " step " << step << ": " << manifest.status();
      if (manifest.ok()) {
        EXPECT_TRUE(checkpoint::CommitStep(checkpoint::DefaultFileSystem(), dir, *manifest).ok());
      }
    }
  }
  std::vector<float> losses = ReadFloats(work + "/losses");
  fs::remove_all(work);
  return losses;
}

// Every parameter and moment of the newest committed step of `dir`, by name.
std::map<std::string, std::vector<float>> StateOf(const std::string& dir) {
  std::map<std::string, std::vector<float>> state;
  absl::StatusOr<std::string> manifest = checkpoint::ResolveCheckpoint(dir);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  if (!manifest.ok()) return state;
  EXPECT_TRUE(checkpoint::VerifyStep(*manifest).ok());
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(*manifest);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return state;
  EXPECT_TRUE(source->has_optimizer_state());
  for (const auto& [name, tensor] : source->manifest()->tensors) {
    const std::vector<int64_t> zeros(tensor.global_shape.size(), 0);
    absl::StatusOr<std::vector<float>> values =
        ReadCheckpointBox(*source, name, zeros, tensor.global_shape);
    EXPECT_TRUE(values.ok()) << values.status();
    if (values.ok()) state[name] = std::move(*values);
  }
  return state;
}

struct Reference {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> state;
};

// The uninterrupted single-device run of every step, made once per process for each model.
const Reference& Uninterrupted(bool llama = false) {
  const auto run = [](bool llama) {
    const std::string dir = testing::MakeTempDir("shardline_resume_reference");
    Reference r;
    Plan single;
    single.llama = llama;
    r.losses = RunPlan(single, kSteps, dir, "");
    r.state = StateOf(dir);
    fs::remove_all(dir);
    return r;
  };
  static const Reference gpt = run(false);
  if (!llama) return gpt;
  static const Reference llama_reference = run(true);
  return llama_reference;
}

struct Pair {
  Plan a, b;
};

void PrintTo(const Pair& pair, std::ostream* os) { *os << pair.a.Name() << "_to_" << pair.b.Name(); }

class ResumeOnAnyPlanTest : public ::testing::TestWithParam<Pair> {};

TEST_P(ResumeOnAnyPlanTest, ResumedRunEqualsTheUninterruptedOne) {
  const Pair& pair = GetParam();
  const Reference& reference = Uninterrupted(pair.a.llama);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  const std::string root = testing::MakeTempDir("shardline_resume");
  const std::vector<float> first = RunPlan(pair.a, kFirst, root + "/a", "");
  ASSERT_EQ(first.size(), static_cast<size_t>(kFirst)) << pair.a.Name();
  const std::string saved = checkpoint::ManifestPath(root + "/a", kFirst);
  ASSERT_TRUE(checkpoint::VerifyStep(saved).ok());
  // Plan A ran as asked: its manifest records the schedule and the recomputation.
  absl::StatusOr<checkpoint::Manifest> manifest = checkpoint::ReadManifest(saved);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->plan.schedule, pair.a.interleaved ? "interleaved" : "1f1b");
  EXPECT_EQ(manifest->plan.virtual_stages, pair.a.interleaved ? 2 : 1);
  EXPECT_EQ(manifest->plan.recompute, pair.a.recompute);
  const std::vector<float> rest = RunPlan(pair.b, kSteps, root + "/b", saved);
  ASSERT_EQ(rest.size(), static_cast<size_t>(kSteps - kFirst)) << pair.b.Name();
  for (int i = 0; i < kFirst; ++i) {
    EXPECT_NEAR(first[i], reference.losses[i], kLossRelTol * std::abs(reference.losses[i]))
        << "step " << i + 1;
  }
  for (int i = kFirst; i < kSteps; ++i) {
    EXPECT_NEAR(rest[i - kFirst], reference.losses[i], kLossRelTol * std::abs(reference.losses[i]))
        << "step " << i + 1 << " (resumed)";
  }
  const auto state = StateOf(root + "/b");
  ASSERT_EQ(state.size(), reference.state.size());
  double worst_param = 0, worst_moment = 0;
  for (const auto& [name, want] : reference.state) {
    ASSERT_TRUE(state.contains(name)) << name;
    const std::vector<float>& got = state.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    const bool moment = checkpoint::ParseStateTensorName(name).kind != checkpoint::StateKind::kParam;
    double largest = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(want[i])));
      diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    if (moment) {
      const double relative = largest > 0 ? diff / largest : diff;
      worst_moment = std::max(worst_moment, relative);
      EXPECT_LE(relative, kMomentRelTol) << name;
    } else {
      worst_param = std::max(worst_param, diff);
      EXPECT_LE(diff, kParamAbsTol) << name;
    }
  }
  std::printf("%s -> %s: largest parameter difference %.3g, moment difference %.3g of its "
              "tensor's largest value\n",
              pair.a.Name().c_str(), pair.b.Name().c_str(), worst_param, worst_moment);
  fs::remove_all(root);
}

// The parameters of a step, in our names and shapes.
checkpoint::Gpt2Weights WeightsOf(const std::string& manifest) {
  checkpoint::Gpt2Weights weights;
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(manifest);
  EXPECT_TRUE(source.ok()) << source.status();
  if (!source.ok()) return weights;
  weights.config = source->config();
  for (const model::TensorRow& spec : model::ModelRows(weights.config)) {
    const std::vector<int64_t> zeros(spec.sharded_shape.size(), 0);
    absl::StatusOr<std::vector<float>> values =
        ReadCheckpointBox(*source, spec.name, zeros, spec.sharded_shape);
    EXPECT_TRUE(values.ok()) << values.status();
    weights.tensors[spec.name] = checkpoint::HostTensor{spec.shape, *values};
  }
  return weights;
}

// init_from: a fresh run (step 1, a fresh optimizer) from another run's parameters, on any plan
// and from any kind of checkpoint. The single-device run from our step and a tp2·pp2 run from its
// Hugging Face export train the same 3 steps.
TEST(InitFromTest, ParametersOfAnyCheckpointStartAFreshRunOnAnyPlan) {
  const std::string root = testing::MakeTempDir("shardline_init_from");
  ASSERT_EQ(RunPlan(Plan{}, kFirst, root + "/a", "").size(), static_cast<size_t>(kFirst));
  const std::string step = checkpoint::ManifestPath(root + "/a", kFirst);
  ASSERT_TRUE(checkpoint::ExportHfGpt2(WeightsOf(step), root + "/hf").ok());
  const std::vector<float> single = RunPlan(Plan{}, kFirst, root + "/single", "", step);
  const std::vector<float> sharded =
      RunPlan(Plan{2, 2, 1, 0, 2, {}}, kFirst, root + "/sharded", "", root + "/hf");
  ASSERT_EQ(single.size(), static_cast<size_t>(kFirst));
  ASSERT_EQ(sharded.size(), static_cast<size_t>(kFirst));
  for (int i = 0; i < kFirst; ++i) {
    EXPECT_NEAR(sharded[i], single[i], kLossRelTol * std::abs(single[i])) << "step " << i + 1;
  }
  // A fresh run: its first loss is that of the parameters it started from, not of GPT-2's
  // initialisation (the reference run's first loss), and it is lower after 3 trained steps.
  EXPECT_LT(single[0], Uninterrupted().losses[0]);
  const auto a = StateOf(root + "/single");
  const auto b = StateOf(root + "/sharded");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, want] : a) {
    ASSERT_TRUE(b.contains(name)) << name;
    double largest = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(want[i])));
      diff = std::max(diff, std::abs(static_cast<double>(b.at(name)[i]) - want[i]));
    }
    const bool moment = checkpoint::ParseStateTensorName(name).kind != checkpoint::StateKind::kParam;
    EXPECT_LE(moment ? diff / largest : diff, moment ? kMomentRelTol : kParamAbsTol) << name;
  }
  // The moments are those of 3 steps from zero, not 3 more on top of the first run's.
  absl::StatusOr<checkpoint::Manifest> manifest =
      checkpoint::ReadManifest(checkpoint::ManifestPath(root + "/sharded", kFirst));
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(manifest->step, kFirst);
  fs::remove_all(root);
}

Plan Single() { return Plan{}; }
Plan Llama(Plan plan) {
  plan.llama = true;
  return plan;
}
Plan Make(int tp, int pp, int dp, int zero, int micro_batch = 2, std::vector<int> stages = {}) {
  return Plan{tp, pp, dp, zero, micro_batch, std::move(stages)};
}
// pp 2 under the interleaved schedule (each stage two chunks of one layer) with `recompute`.
Plan Interleaved(int tp, int dp, int zero, std::string recompute) {
  Plan plan = Make(tp, 2, dp, zero);
  plan.interleaved = true;
  plan.recompute = std::move(recompute);
  return plan;
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, ResumeOnAnyPlanTest,
    ::testing::Values(
        Pair{Single(), Make(2, 2, 1, 0)},             // single → tp2·pp2
        Pair{Make(2, 2, 1, 0), Make(1, 1, 2, 3)},     // tp2·pp2 → dp2 zero3
        Pair{Make(1, 1, 2, 3), Make(2, 1, 1, 0)},     // dp2 zero3 → tp2
        Pair{Make(1, 2, 2, 1), Single()},             // pp2·dp2 zero1 → single
        Pair{Make(1, 1, 2, 2), Make(1, 1, 4, 1, 3)},  // dp2 zero2 → dp4 zero1
        // Uneven: stages 3|1 and a vocabulary of 257 over tp 2, then stages 1|3 and
        // ZeRO 2 over dp 3, whose partitions of a layer (12704 values) differ in size.
        Pair{Make(2, 2, 1, 0, 2, {3, 1}), Make(1, 2, 3, 2, 2, {1, 3})},
        // The schedule and the recomputation are not in the checkpoint's tensors:
        // 1F1B → interleaved with selective recomputation, and interleaved with
        // full recomputation and ZeRO 1 over dp 3 → single.
        Pair{Make(2, 2, 1, 0), Interleaved(1, 1, 0, "selective")},
        Pair{Interleaved(1, 3, 1, "full"), Single()},
        // Llama: one rank → key/value heads cut over tp 2 with pp 2 → shared by
        // two ranks each at tp 4 → ZeRO 3 over dp 2.
        Pair{Llama(Single()), Llama(Make(2, 2, 1, 0))},
        Pair{Llama(Make(2, 2, 1, 0)), Llama(Make(4, 1, 1, 0))},
        Pair{Llama(Make(4, 1, 1, 0)), Llama(Make(1, 1, 2, 3))}),
    [](const ::testing::TestParamInfo<Pair>& info) {
      return info.param.a.Name() + "_to_" + info.param.b.Name();
    });

// The largest absolute difference between two runs' tensors of `kind`, over every tensor of that
// kind in `want` (which `got` must hold too).
double LargestDifference(const std::map<std::string, std::vector<float>>& got,
                         const std::map<std::string, std::vector<float>>& want,
                         checkpoint::StateKind kind) {
  double largest = 0;
  int compared = 0;
  for (const auto& [name, values] : want) {
    if (checkpoint::ParseStateTensorName(name).kind != kind) continue;
    EXPECT_TRUE(got.contains(name)) << name;
    if (!got.contains(name)) continue;
    EXPECT_EQ(got.at(name).size(), values.size()) << name;
    if (got.at(name).size() != values.size()) continue;
    ++compared;
    for (size_t i = 0; i < values.size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(got.at(name)[i]) - values[i]));
    }
  }
  EXPECT_GT(compared, 0) << "no tensor of the kind";
  return largest;
}

// DiLoCo with H = 1, outer lr 1 and no outer momentum averages the sites' parameters after every
// inner step. With a linear inner update (Plan::linear_adamw) that is exactly a data-parallel step
// on the averaged gradient: the two runs end with the same parameters. (With AdamW's usual
// settings they differ by design: the average of the sites' normalised updates is not the
// normalised update of the average gradient.)
TEST(DilocoTest, EveryStepWithOuterLrOneIsPlainDataParallelism) {
  const std::string root = testing::MakeTempDir("shardline_diloco_h1");
  Plan plain = Make(1, 1, 2, 0);
  plain.linear_adamw = true;
  Plan diloco = plain;
  diloco.data_parallel = "{sync: diloco, every: 1, outer_lr: 1, outer_momentum: 0}";
  Plan slower = plain;  // the same with half the outer step: must differ, or the check is blind
  slower.data_parallel = "{sync: diloco, every: 1, outer_lr: 0.5, outer_momentum: 0}";
  ASSERT_EQ(RunPlan(plain, kSteps, root + "/plain", "").size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(RunPlan(diloco, kSteps, root + "/diloco", "").size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(RunPlan(slower, kSteps, root + "/slower", "").size(), static_cast<size_t>(kSteps));
  const auto want = StateOf(root + "/plain");
  const auto got = StateOf(root + "/diloco");
  const double same = LargestDifference(got, want, checkpoint::StateKind::kParam);
  const double half =
      LargestDifference(StateOf(root + "/slower"), want, checkpoint::StateKind::kParam);
  std::printf(
      "DiLoCo H=1 against plain data parallelism: largest parameter difference %.3g "
      "(outer lr 0.5: %.3g)\n",
      same, half);
  EXPECT_LE(same, kParamAbsTol);
  EXPECT_GT(half, 100 * kParamAbsTol);
  fs::remove_all(root);
}

// A DiLoCo run saved in the middle of an outer round (every 2: rounds end at steps 2, 4, 6; the
// save is at step 3) and resumed ends where the uninterrupted run does: every site's parameters
// and moments, the anchor and the outer momentum. With fragments 2 (Streaming DiLoCo) a fragment
// is due at step 3 and goes out at step 4's start, after the resume.
class DilocoResumeTest : public ::testing::TestWithParam<int> {};

TEST_P(DilocoResumeTest, ResumedInTheMiddleOfARoundEqualsTheUninterruptedRun) {
  const std::string root = testing::MakeTempDir("shardline_diloco_resume");
  Plan plan = Make(1, 1, 2, 0);
  plan.data_parallel = "{sync: diloco, every: 2, outer_lr: 0.7, outer_momentum: 0.9, fragments: " +
                       std::to_string(GetParam()) + "}";
  ASSERT_EQ(RunPlan(plan, kSteps, root + "/straight", "").size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(RunPlan(plan, kFirst, root + "/a", "").size(), static_cast<size_t>(kFirst));
  ASSERT_EQ(
      RunPlan(plan, kSteps, root + "/b", checkpoint::ManifestPath(root + "/a", kFirst)).size(),
      static_cast<size_t>(kSteps - kFirst));
  const auto want = StateOf(root + "/straight");
  const auto got = StateOf(root + "/b");
  EXPECT_EQ(got.size(), want.size());
  using K = checkpoint::StateKind;
  for (const K kind : {K::kParam, K::kExpAvg, K::kExpAvgSq, K::kOuterAnchor, K::kOuterMomentum,
                       K::kSiteParam, K::kSiteExpAvg, K::kSiteExpAvgSq}) {
    const double diff = LargestDifference(got, want, kind);
    const bool moment = kind == K::kExpAvg || kind == K::kExpAvgSq || kind == K::kSiteExpAvg ||
                        kind == K::kSiteExpAvgSq;
    // Moments by their size: exp_avg_sq of a ~1e-2 gradient is ~1e-4, its noise far below.
    EXPECT_LE(diff, moment ? 1e-7 : kParamAbsTol) << checkpoint::StateTensorName(kind, "*");
  }
  // The two sites trained on different samples: their parameters differ between syncs.
  const std::vector<float>& sites = want.at(checkpoint::StateTensorName(K::kSiteParam, "h.0.fc.w"));
  double apart = 0;
  const size_t half = sites.size() / 2;
  for (size_t i = 0; i < half; ++i)
    apart = std::max(apart, std::abs(double{sites[i]} - sites[half + i]));
  if (GetParam() == 1) EXPECT_LT(apart, 1e-12) << "every 2 ends a round at step 6: sites agree";
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Fragments, DilocoResumeTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "fragments" + std::to_string(info.param);
                         });

// Compressed gradients between hosts (here every rank is a host: Gloo), int8 with error
// feedback: a run saved at step 3 and resumed equals the uninterrupted one, error feedback
// included (each site's carried and server error are in the checkpoint; without them the resumed
// run would drop what step 3 left over). Resumed on dp 3, the two sites' errors are spread over
// three and the run goes on.
TEST(CompressedGradientsTest, AResumedInt8RunEqualsTheUninterruptedOne) {
  const std::string root = testing::MakeTempDir("shardline_compressed_resume");
  Plan plan = Make(1, 1, 2, 0);
  plan.gloo = true;
  plan.data_parallel = "{compression: int8, bucket_mb: 0.05}";
  ASSERT_EQ(RunPlan(plan, kSteps, root + "/straight", "").size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(RunPlan(plan, kFirst, root + "/a", "").size(), static_cast<size_t>(kFirst));
  const std::string saved = checkpoint::ManifestPath(root + "/a", kFirst);
  ASSERT_EQ(RunPlan(plan, kSteps, root + "/b", saved).size(), static_cast<size_t>(kSteps - kFirst));
  const auto want = StateOf(root + "/straight");
  const auto got = StateOf(root + "/b");
  using K = checkpoint::StateKind;
  for (const K kind : {K::kParam, K::kExpAvg, K::kExpAvgSq, K::kCarriedError, K::kServerError}) {
    EXPECT_LE(LargestDifference(got, want, kind), 1e-7) << checkpoint::StateTensorName(kind, "*");
  }
  // The error feedback is real: some of it is not zero.
  double carried = 0;
  for (const auto& [name, values] : want) {
    if (checkpoint::ParseStateTensorName(name).kind != K::kCarriedError) continue;
    for (float v : values) carried = std::max(carried, std::abs(double{v}));
  }
  EXPECT_GT(carried, 0);
  // Another plan: three sites take the two's error, spread.
  Plan wider = Make(1, 1, 3, 0);
  wider.gloo = true;
  wider.data_parallel = plan.data_parallel;
  EXPECT_EQ(RunPlan(wider, kSteps, root + "/c", saved).size(),
            static_cast<size_t>(kSteps - kFirst));
  fs::remove_all(root);
}

// PowerSGD compresses between hosts and still trains: its losses stay within 5% of exact data
// parallelism's over 6 steps (rank 2 of 32-wide matrices, error feedback on).
TEST(CompressedGradientsTest, PowerSgdTrainsCloseToExactDataParallelism) {
  const std::string root = testing::MakeTempDir("shardline_powersgd");
  Plan exact = Make(1, 1, 2, 0);
  exact.gloo = true;
  Plan powersgd = exact;
  powersgd.data_parallel = "{compression: powersgd, rank: 2}";
  const std::vector<float> want = RunPlan(exact, kSteps, root + "/exact", "");
  const std::vector<float> got = RunPlan(powersgd, kSteps, root + "/powersgd", "");
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  EXPECT_FLOAT_EQ(got[0], want[0]);  // the same start: the first loss precedes any reduction
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.05 * want[i]) << i;
  // and it did compress: the parameters differ from the exact run's.
  EXPECT_GT(LargestDifference(StateOf(root + "/powersgd"), StateOf(root + "/exact"),
                              checkpoint::StateKind::kParam),
            1e-6);
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardline::training
