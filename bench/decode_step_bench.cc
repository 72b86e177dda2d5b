// One continuously batched decode step of the serving engine's forward (model::PagedGptForward,
// the code `shardline serve` runs) on GPT-2 small with GPT-2's random initialisation: S sequences
// whose prompts were prefilled to --context positions each decode one token per step, greedy, for
// --steps steps. Prints the prefill step's milliseconds (the first step: a cold cache, and at the
// first run also the packing), milliseconds per decode step and tokens/s per batch size, without
// HTTP, clients or a tokenizer: the steady figure under bench/serve_compare.py's noisy end-to-end
// one (that benchmark's TPOT at concurrency S is this step plus the server's and the clients' share
// of the cores). Profile it with `perf record bench/decode_step_bench --batch 8`.
//
//   bench/decode_step_bench [--batch 1,8] [--context 32] [--steps 48] [--layers 12]
//
// Threads: OMP_NUM_THREADS (the serving benchmark runs 2).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/vector_math.h"
#include "worker/model/model_params.h"
#include "worker/model/paged_inference.h"

namespace {

using namespace shardline;
using Clock = std::chrono::steady_clock;

std::vector<int> ParseList(const char* text) {
  std::vector<int> values;
  for (char* p = const_cast<char*>(text); *p != '\0';) {
    values.push_back(static_cast<int>(std::strtol(p, &p, 10)));
    if (*p == ',') ++p;
  }
  return values;
}

struct StepTimes {
  double prefill_ms = 0;  // the one step of every sequence's prompt
  double decode_ms = 0;   // per decode step
};

// The prefill of `S` sequences of `context` tokens each in one step, then decode steps.
StepTimes DecodeMilliseconds(const model::InferenceWeights& weights, kernels::Backend& backend,
                             int S, int context, int steps) {
  const model::ModelConfig& c = weights.config;
  constexpr int kBlockSize = 16;
  const int blocks_per_seq = (context + steps + kBlockSize) / kBlockSize;
  const model::PagedCacheOptions options{.num_blocks = S * blocks_per_seq,
                                         .block_size = kBlockSize,
                                         .max_tokens_per_step = S * context,
                                         .max_seqs_per_step = S};
  auto forward = model::PagedGptForward::Create(weights, options, backend);
  if (!forward.ok()) {
    std::fprintf(stderr, "decode_step_bench: %s\n", forward.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<int32_t> tables(static_cast<size_t>(S) * blocks_per_seq);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  // The prefill: every sequence's prompt (token ids that differ by sequence) in one step.
  std::vector<int32_t> tokens, positions, seq, rows;
  for (int s = 0; s < S; ++s) {
    for (int p = 0; p < context; ++p) {
      tokens.push_back((1000 * s + 7 * p) % c.vocab);
      positions.push_back(p);
      seq.push_back(s);
    }
    rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
  }
  const auto step = [&]() -> std::vector<int32_t> {
    const model::PagedStep paged{.tokens = tokens,
                                 .positions = positions,
                                 .token_seq = seq,
                                 .block_tables = tables,
                                 .num_seqs = S,
                                 .max_blocks_per_seq = blocks_per_seq,
                                 .logit_rows = rows};
    auto logits = (*forward)->Forward(paged);
    if (!logits.ok()) {
      std::fprintf(stderr, "decode_step_bench: %s\n", logits.status().ToString().c_str());
      std::exit(1);
    }
    std::vector<int32_t> next(S);
    for (int s = 0; s < S; ++s) {
      next[s] = static_cast<int32_t>(
          kernels::cpu::ArgMax(logits->data() + int64_t{s} * c.vocab, c.vocab));
    }
    return next;
  };
  const auto prefill_start = Clock::now();
  std::vector<int32_t> next = step();
  const double prefill = std::chrono::duration<double>(Clock::now() - prefill_start).count();
  // Decode: one token per sequence and step, at the next position; the first step is not timed.
  double seconds = 0;
  for (int t = 0; t <= steps; ++t) {
    tokens = next;
    positions.assign(S, context + t);
    seq.resize(S);
    rows.resize(S);
    for (int s = 0; s < S; ++s) seq[s] = rows[s] = s;
    const auto start = Clock::now();
    next = step();
    if (t > 0) seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  return StepTimes{.prefill_ms = prefill * 1e3, .decode_ms = seconds / steps * 1e3};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> batches = {1, 8};
  int context = 32, steps = 48, layers = 12;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "decode_step_bench: %s needs a value\n", flag.c_str());
      return 2;
    }
    if (flag == "--batch") {
      batches = ParseList(argv[i + 1]);
    } else if (flag == "--context") {
      context = std::atoi(argv[i + 1]);
    } else if (flag == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else if (flag == "--layers") {
      layers = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--batch 1,8] [--context 32] [--steps 48] [--layers 12]\n",
                   argv[0]);
      return 2;
    }
  }
  if (context < 1 || steps < 1 || layers < 1 ||
      std::any_of(batches.begin(), batches.end(), [](int b) { return b < 1; }) ||
      context + steps + 1 > 1024) {
    std::fprintf(stderr,
                 "decode_step_bench: need --batch >= 1, --context >= 1, --steps >= 1, "
                 "--layers >= 1 and context + steps < 1024\n");
    return 2;
  }
  const model::ModelConfig config{
      .layers = layers, .heads = 12, .d_model = 768, .vocab = 50257, .max_seq_len = 1024};
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend gpt_backend(allocator);
  auto gpt = model::ModelParams::Gpt2Init(config, 0);
  if (!gpt.ok()) {
    std::fprintf(stderr, "decode_step_bench: %s\n", gpt.status().ToString().c_str());
    return 1;
  }
  const model::InferenceWeights weights = model::InferenceWeights::Of(*gpt);
  std::printf("GPT-2 small shape (%s), %d threads, BLAS %s\n", config.DebugString().c_str(),
              omp_get_max_threads(), kernels::cpu::BlasDescription().c_str());
  std::printf("sequences | context | prefill ms | ms per step | tokens/s\n");
  for (const int S : batches) {
    const StepTimes t = DecodeMilliseconds(weights, gpt_backend, S, context, steps);
    std::printf("%9d | %7d | %10.1f | %11.2f | %8.1f\n", S, context, t.prefill_ms, t.decode_ms,
                S * 1e3 / t.decode_ms);
    std::fflush(stdout);
  }
  return 0;
}
