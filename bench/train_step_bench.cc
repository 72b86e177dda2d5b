// One training step of a GPT (forward to the loss + backward + AdamW with clipping) on the CPU, in
// tokens per second: the engine on one rank (OneRankGpt: ShardedGpt at tp = pp = dp = 1, what
// `shardline train` runs); bench/train_step_torch.py runs the same model in PyTorch and
// bench/train_step_compare.py runs both in one run and prints the ratio.
//
//   train_step_bench [--layers 12] [--d-model 768] [--heads 12] [--seq 256] [--batch 4]
//                    [--vocab 50304] [--steps 3] [--warmup 1] [--threads 2] [--kernels REPS]
//
// Prints each step's loss, norm and time, and one line
//   RESULT impl=shardline tokens_per_s=... step_s=... peak_bytes=... peak_kind=allocator
// where peak_bytes is the CpuAllocator's peak (parameters, gradients, AdamW moments, activations).
// The engine times its step as a whole (StepStats: compute, and on more than one rank the
// communication and the pipeline's waits); --kernels splits the compute further.
//
// --kernels REPS then times every kernel that one block's forward and backward and the head run
// (kernels/cpu/ called directly on buffers of the model's shapes, the best of REPS runs each), so
// that the phases can be split further: which GEMMs, attention, LayerNorm, GELU, cross-entropy.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench/step_bench_flags.h"
#include "kernels/allocator.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "model/model_config.h"
#include "worker/model/model_params.h"
#include "worker/model/one_rank_gpt.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options : shardline::bench::StepShape {
  int threads = 2;
  int kernels = 0;  // > 0: afterwards, time each kernel of one block and of the head, this many reps
  // Non-empty: write the initial parameters and the batch there, for the peer to start from the
  // same state (bench/train_step_torch.py --init-from): params.bin (f32, the layout's order),
  // tensors.txt (one "name offset dim..." per tensor) and tokens.bin (int32, B·T).
  std::string init_out;
};

Options Parse(int argc, char** argv) {
  using shardline::bench::IntFlag;
  Options o;
  const shardline::bench::ExtraFlag extra[] = {
      {"--threads", IntFlag(&o.threads)},
      {"--kernels", IntFlag(&o.kernels)},
      {"--init-out", [&o](const std::string& value) -> std::string {
         o.init_out = value;
         return value.empty() ? "an empty directory name" : "";
       }}};
  shardline::bench::ParseStepFlags(argc, argv, "train_step_bench",
                                   "[--threads N] [--kernels REPS] [--init-out DIR]", o, extra);
  if (o.threads < 1) {
    std::fprintf(stderr, "train_step_bench: --threads must be >= 1\n");
    std::exit(2);
  }
  return o;
}

void Check(const absl::Status& s, const char* what) {
  shardline::bench::CheckOrExit(s, "train_step_bench", what);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Times fn: the best of `reps` runs, in seconds.
template <typename Fn>
double Best(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const Clock::time_point a = Clock::now();
    fn();
    best = std::min(best, Seconds(a, Clock::now()));
  }
  return best;
}

// One block's and the head's kernels on the model's shapes, each timed on its own.
void ProfileKernels(const Options& o, double step_s) {
  namespace cpu = shardline::kernels::cpu;
  const int B = o.batch, T = o.seq, C = o.d_model, NH = o.heads, HS = C / NH, F = 4 * C;
  const int V = o.vocab, L = o.layers;
  const int N = B * T;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto buffer = [&](int64_t n, float stddev) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = stddev * normal(rng);
    return v;
  };
  // Activations ~ N(0,1), weights ~ N(0,0.02), as in training.
  auto x = buffer(int64_t{N} * C, 1), ln = buffer(int64_t{N} * C, 1), y = buffer(int64_t{N} * C, 1);
  auto dx = buffer(int64_t{N} * C, 1), dln = buffer(int64_t{N} * C, 1);
  auto mean = buffer(N, 0), rstd = buffer(N, 0);
  auto qkv = buffer(int64_t{N} * 3 * C, 1), dqkv = buffer(int64_t{N} * 3 * C, 0);
  auto atty = buffer(int64_t{N} * C, 1), datty = buffer(int64_t{N} * C, 1);
  auto lse = buffer(int64_t{B} * NH * T, 0);
  auto fch = buffer(int64_t{N} * F, 1), fch_gelu = buffer(int64_t{N} * F, 1);
  auto dfch = buffer(int64_t{N} * F, 0), dfch_gelu = buffer(int64_t{N} * F, 1);
  auto w_ln = buffer(C, 1), b_ln = buffer(C, 0), g_wln = buffer(C, 0), g_bln = buffer(C, 0);
  auto w_qkv = buffer(int64_t{3} * C * C, 0.02f), b_qkv = buffer(3 * C, 0);
  auto g_qkv = buffer(int64_t{3} * C * C, 0), g_bqkv = buffer(3 * C, 0);
  auto w_proj = buffer(int64_t{C} * C, 0.02f), b_proj = buffer(C, 0),
       g_proj = buffer(int64_t{C} * C, 0);
  auto w_fc = buffer(int64_t{F} * C, 0.02f), b_fc = buffer(F, 0), g_fc = buffer(int64_t{F} * C, 0);
  auto g_bfc = buffer(F, 0);
  auto w_fcp = buffer(int64_t{C} * F, 0.02f), g_fcp = buffer(int64_t{C} * F, 0);
  auto w_te = buffer(int64_t{V} * C, 0.02f), g_te = buffer(int64_t{V} * C, 0);
  auto logits = buffer(int64_t{N} * V, 1), dlogits = buffer(int64_t{N} * V, 0);
  auto losses = buffer(N, 0), lse_ce = buffer(N, 0), dlosses = std::vector<float>(N, 1.0f / N);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = static_cast<int32_t>(rng() % V);
  // A real forward's lse, so that the attention backward sees sane probabilities.
  cpu::AttentionForward(atty.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);

  struct Row {
    std::string group, name;
    double s;
    double flops;  // 0 when not a GEMM
  };
  std::vector<Row> rows;
  const int reps = o.kernels;
  auto gemm = [](int64_t n, int64_t c, int64_t oc) { return 2.0 * n * c * oc; };
  auto add = [&](const char* group, const char* name, double flops, auto&& fn) {
    rows.push_back({group, name, Best(reps, fn), flops});
  };
  // Block forward, in BlockForward's order.
  add("block fwd", "layernorm1", 0, [&] {
    cpu::LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w_ln.data(), b_ln.data(),
                          N, C);
  });
  add("block fwd", "gemm qkv", gemm(N, C, 3 * C),
      [&] { cpu::MatmulForward(qkv.data(), ln.data(), w_qkv.data(), b_qkv.data(), N, C, 3 * C); });
  add("block fwd", "attention", 0,
      [&] { cpu::AttentionForward(atty.data(), lse.data(), qkv.data(), B, T, NH, NH, HS); });
  add("block fwd", "gemm attn_proj", gemm(N, C, C),
      [&] { cpu::MatmulForward(y.data(), atty.data(), w_proj.data(), b_proj.data(), N, C, C); });
  add("block fwd", "residual x2", 0, [&] {
    cpu::ResidualForward(y.data(), y.data(), x.data(), int64_t{N} * C);
    cpu::ResidualForward(y.data(), y.data(), x.data(), int64_t{N} * C);
  });
  add("block fwd", "layernorm2", 0, [&] {
    cpu::LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w_ln.data(), b_ln.data(),
                          N, C);
  });
  add("block fwd", "gemm fc", gemm(N, C, F),
      [&] { cpu::MatmulForward(fch.data(), ln.data(), w_fc.data(), b_fc.data(), N, C, F); });
  add("block fwd", "gelu", 0,
      [&] { cpu::GeluForward(fch_gelu.data(), fch.data(), int64_t{N} * F); });
  add("block fwd", "gemm fc_proj", gemm(N, F, C),
      [&] { cpu::MatmulForward(y.data(), fch_gelu.data(), w_fcp.data(), b_proj.data(), N, F, C); });
  // Block backward, in BlockBackward's order (its zero fills as one row).
  add("block bwd", "zero scratch", 0, [&] {
    std::fill(dx.begin(), dx.end(), 0.0f);
    std::fill(dln.begin(), dln.end(), 0.0f);
    std::fill(dfch.begin(), dfch.end(), 0.0f);
    std::fill(dfch_gelu.begin(), dfch_gelu.end(), 0.0f);
    std::fill(datty.begin(), datty.end(), 0.0f);
    std::fill(dqkv.begin(), dqkv.end(), 0.0f);
    std::fill(dln.begin(), dln.end(), 0.0f);
  });
  add("block bwd", "residual x2", 0, [&] {
    cpu::ResidualBackward(dx.data(), nullptr, y.data(), int64_t{N} * C);
    cpu::ResidualBackward(dx.data(), nullptr, y.data(), int64_t{N} * C);
  });
  add("block bwd", "gemm fc_proj", 2 * gemm(N, F, C), [&] {
    cpu::MatmulBackward(dfch_gelu.data(), g_fcp.data(), g_bln.data(), y.data(), fch_gelu.data(),
                        w_fcp.data(), N, F, C);
  });
  add("block bwd", "gelu", 0,
      [&] { cpu::GeluBackward(dfch.data(), fch.data(), dfch_gelu.data(), int64_t{N} * F); });
  add("block bwd", "gemm fc", 2 * gemm(N, C, F), [&] {
    cpu::MatmulBackward(dln.data(), g_fc.data(), g_bfc.data(), dfch.data(), ln.data(), w_fc.data(),
                        N, C, F);
  });
  add("block bwd", "layernorm2", 0, [&] {
    cpu::LayerNormBackward(dx.data(), g_wln.data(), g_bln.data(), dln.data(), x.data(), w_ln.data(),
                           mean.data(), rstd.data(), N, C);
  });
  add("block bwd", "gemm attn_proj", 2 * gemm(N, C, C), [&] {
    cpu::MatmulBackward(datty.data(), g_proj.data(), g_bln.data(), y.data(), atty.data(),
                        w_proj.data(), N, C, C);
  });
  add("block bwd", "attention", 0, [&] {
    cpu::AttentionBackward(dqkv.data(), datty.data(), qkv.data(), atty.data(), lse.data(), B, T, NH,
                           NH, HS);
  });
  add("block bwd", "gemm qkv", 2 * gemm(N, C, 3 * C), [&] {
    cpu::MatmulBackward(dln.data(), g_qkv.data(), g_bqkv.data(), dqkv.data(), ln.data(),
                        w_qkv.data(), N, C, 3 * C);
  });
  add("block bwd", "layernorm1", 0, [&] {
    cpu::LayerNormBackward(dx.data(), g_wln.data(), g_bln.data(), dln.data(), x.data(), w_ln.data(),
                           mean.data(), rstd.data(), N, C);
  });
  // Head: HeadForward, LossForward, HeadBackward.
  add("head fwd", "layernorm f", 0, [&] {
    cpu::LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w_ln.data(), b_ln.data(),
                          N, C);
  });
  add("head fwd", "gemm lm_head", gemm(N, C, V),
      [&] { cpu::MatmulForward(logits.data(), ln.data(), w_te.data(), nullptr, N, C, V); });
  add("loss fwd", "cross-entropy", 0, [&] {
    cpu::CrossEntropyForward(losses.data(), lse_ce.data(), logits.data(), targets.data(), N, V);
  });
  add("head bwd", "zero dlogits", 0, [&] { std::fill(dlogits.begin(), dlogits.end(), 0.0f); });
  add("head bwd", "cross-entropy", 0, [&] {
    cpu::CrossEntropyBackward(dlogits.data(), logits.data(), lse_ce.data(), targets.data(),
                              dlosses.data(), N, V);
  });
  add("head bwd", "gemm lm_head", 2 * gemm(N, C, V), [&] {
    cpu::MatmulBackward(dln.data(), g_te.data(), nullptr, dlogits.data(), ln.data(), w_te.data(), N,
                        C, V);
  });
  add("head bwd", "layernorm f", 0, [&] {
    cpu::LayerNormBackward(dx.data(), g_wln.data(), g_bln.data(), dln.data(), x.data(), w_ln.data(),
                           mean.data(), rstd.data(), N, C);
  });

  double gemm_s = 0.0, other_s = 0.0;
  for (const Row& r : rows) {
    const int times = r.group.rfind("block", 0) == 0 ? L : 1;
    (r.flops > 0 ? gemm_s : other_s) += r.s * times;
  }
  const double sum_s = gemm_s + other_s;
  std::printf(
      "kernels (best of %d each; a block's rows x %d layers = per step; %% of their sum):\n", reps,
      L);
  std::printf("  %-10s %-15s %10s %10s %7s %9s\n", "phase", "kernel", "once s", "per step s",
              "% sum", "GFLOP/s");
  for (const Row& r : rows) {
    const int times = r.group.rfind("block", 0) == 0 ? L : 1;
    const double per_step = r.s * times;
    char gflops[32] = "";
    if (r.flops > 0) std::snprintf(gflops, sizeof gflops, "%9.1f", r.flops / r.s * 1e-9);
    std::printf("  %-10s %-15s %10.4f %10.4f %6.1f%% %9s\n", r.group.c_str(), r.name.c_str(), r.s,
                per_step, 100.0 * per_step / sum_s, gflops);
  }
  std::printf(
      "  sum %.3f s (the measured step: %.3f s; it adds embedding, AdamW and zeroing): GEMMs "
      "%.3f s (%.1f%%), other kernels %.3f s (%.1f%%)\n",
      sum_s, step_s, gemm_s, 100.0 * gemm_s / sum_s, other_s, 100.0 * other_s / sum_s);
}

// Options::init_out's files; exits with a message when one cannot be written.
void WriteInitialState(const std::string& dir, const shardline::model::ModelParams& model,
                       const std::vector<int32_t>& tokens) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto write = [&](const std::string& name, const void* data, size_t bytes) {
    std::ofstream out(std::filesystem::path(dir) / name, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) {
      std::fprintf(stderr, "train_step_bench: cannot write %s/%s\n", dir.c_str(), name.c_str());
      std::exit(1);
    }
  };
  const std::span<const float> params = model.values();
  write("params.bin", params.data(), params.size_bytes());
  write("tokens.bin", tokens.data(), tokens.size() * sizeof(int32_t));
  std::string manifest;
  for (const auto& tensor : model.layout().tensors()) {
    manifest += tensor.name + " " + std::to_string(tensor.offset);
    for (int64_t d : tensor.shape) manifest += " " + std::to_string(d);
    manifest += "\n";
  }
  write("tensors.txt", manifest.data(), manifest.size());
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = Parse(argc, argv);

  // Threads before the first GEMM: OpenBLAS is dlopen'ed on first use (kernels/cpu/blas.cc) and
  // reads OPENBLAS_NUM_THREADS then; libgomp has already read OMP_NUM_THREADS at load time, so its
  // pool is sized with omp_set_num_threads.
  const std::string threads = std::to_string(opt.threads);
  setenv("OMP_NUM_THREADS", threads.c_str(), 1);
  setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
  omp_set_num_threads(opt.threads);

  const shardline::model::ModelConfig config = opt.Config();
  Check(config.Validate(), "config");

  shardline::model::OneRankOptions options{
      .config = config, .batch = opt.batch, .seq_len = opt.seq};
  options.adamw.adamw.weight_decay = 0.1f;
  options.adamw.max_grad_norm = 1.0;
  constexpr float kLearningRate = 3e-4f;
  shardline::kernels::CpuAllocator allocator;
  shardline::kernels::cpu::CpuBackend backend(allocator);
  auto created = shardline::model::OneRankGpt::Create(options, backend);
  Check(created.status(), "OneRankGpt::Create");
  shardline::model::OneRankGpt& model = **created;
  Check(model.InitGpt2(1337), "InitGpt2");
  const int64_t num_params = shardline::model::ParamLayout(config).total();

  // Random tokens; the targets are the next token (the last position wraps to the first), as a
  // language-model batch would have them.
  const int B = opt.batch;
  const int T = opt.seq;
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(0, opt.vocab - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T);
  for (int32_t& t : tokens) t = token(rng);
  std::vector<int32_t> targets(tokens.size());
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) targets[size_t(b) * T + t] = tokens[size_t(b) * T + (t + 1) % T];
  }

  if (!opt.init_out.empty()) {
    auto params = model.Params();
    Check(params.status(), "reading the initial parameters");
    WriteInitialState(opt.init_out, *params, tokens);
  }

  std::printf("config: %s B=%d T=%d params=%lld threads=%d omp_max_threads=%d\n",
              config.DebugString().c_str(), B, T, static_cast<long long>(num_params), opt.threads,
              omp_get_max_threads());
  std::fflush(stdout);

  float first_loss = 0.0f;
  float last_loss = 0.0f;
  double timed_s = 0.0;
  const int total = opt.warmup + opt.steps;
  for (int step = 1; step <= total; ++step) {
    const bool timed = step > opt.warmup;
    const Clock::time_point start = Clock::now();
    auto stats = model.Step(tokens, targets, step, kLearningRate);
    Check(stats.status(), "Step");
    const double step_s = Seconds(start, Clock::now());
    if (step == 1) first_loss = stats->loss;
    last_loss = stats->loss;
    std::printf("step %d%s: loss %.4f grad_norm %.4f %.3f s\n", step, timed ? "" : " (warmup)",
                stats->loss, stats->grad_norm, step_s);
    std::fflush(stdout);
    if (timed) timed_s += step_s;
  }

  const double step_s = timed_s / opt.steps;
  const double tokens_per_s = static_cast<double>(B) * T / step_s;
  std::printf("loss: first %.4f last %.4f\n", first_loss, last_loss);
  std::printf(
      "RESULT impl=shardline tokens_per_s=%.2f step_s=%.6f peak_bytes=%zu "
      "peak_kind=allocator\n",
      tokens_per_s, step_s, allocator.stats().peak_bytes);
  std::fflush(stdout);
  if (opt.kernels > 0) ProfileKernels(opt, step_s);
  return 0;
}
