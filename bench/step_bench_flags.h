// The command line of the training-step benchmarks (train_step_bench on the CPU,
// train_step_gpu_bench on CUDA): the model and batch shape and step counts they share, which
// bench/train_step_compare.py passes to both sides, plus each one's own flags.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "model/model_config.h"

namespace shardline::bench {

struct StepShape {
  int layers = 12;
  int d_model = 768;
  int heads = 12;
  int seq = 256;
  int batch = 4;
  int vocab = 50304;
  int steps = 3;   // timed
  int warmup = 1;  // untimed, first
  int llama = 0;   // 1: the Llama family (RMSNorm, SwiGLU, rotary, no biases)
  int kv_heads = 0;  // Llama's key/value heads; 0: heads
  int d_ff = 0;      // 0: 4·d_model

  // A config of this shape, tied embeddings, max_seq_len = seq: GPT-2's choices, or Llama's.
  model::ModelConfig Config() const {
    model::ModelConfig config;
    config.layers = layers;
    config.heads = heads;
    config.d_model = d_model;
    config.d_ff = d_ff;
    config.vocab = vocab;
    config.max_seq_len = seq;
    if (llama != 0) {
      config = model::ModelConfig::Llama(config);
      config.kv_heads = kv_heads;
    }
    config.tied_embeddings = true;
    return config;
  }
};

// A flag of one benchmark's own: `set` takes its value and returns why it is bad, or "".
struct ExtraFlag {
  const char* name;
  std::function<std::string(const std::string& value)> set;
};

// A non-negative integer flag's setter.
inline std::function<std::string(const std::string&)> IntFlag(int* out) {
  return [out](const std::string& value) -> std::string {
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || v < 0 || v > (1L << 30)) {
      return "not a non-negative integer: " + value;
    }
    *out = static_cast<int>(v);
    return "";
  };
}

// Reads argv into `shape` and the `extra` flags ("--flag VALUE" each). On --help or a bad flag it
// prints why and "usage: PROGRAM [--layers N] ... EXTRA_USAGE" to stderr and exits 2.
inline void ParseStepFlags(int argc, char** argv, const char* program, const char* extra_usage,
                           StepShape& shape, std::span<const ExtraFlag> extra) {
  auto usage = [&](const std::string& why) {
    std::fprintf(stderr,
                 "%s: %s\nusage: %s [--layers N] [--d-model N] [--heads N] [--seq N] [--batch N] "
                 "[--vocab N] [--steps N] [--warmup N] [--llama 1 --kv-heads N] [--d-ff N] %s\n",
                 program, why.c_str(), program, extra_usage);
    std::exit(2);
  };
  const ExtraFlag shared[] = {
      {"--layers", IntFlag(&shape.layers)}, {"--d-model", IntFlag(&shape.d_model)},
      {"--heads", IntFlag(&shape.heads)},   {"--seq", IntFlag(&shape.seq)},
      {"--batch", IntFlag(&shape.batch)},   {"--vocab", IntFlag(&shape.vocab)},
      {"--steps", IntFlag(&shape.steps)},   {"--warmup", IntFlag(&shape.warmup)},
      {"--llama", IntFlag(&shape.llama)},   {"--kv-heads", IntFlag(&shape.kv_heads)},
      {"--d-ff", IntFlag(&shape.d_ff)}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage("help");
    const ExtraFlag* flag = nullptr;
    for (const std::span<const ExtraFlag> flags : {std::span<const ExtraFlag>(shared), extra}) {
      for (const ExtraFlag& f : flags) {
        if (arg == f.name) flag = &f;
      }
    }
    if (flag == nullptr) usage("unknown argument " + arg);
    if (i + 1 >= argc) usage(arg + " needs a value");
    if (const std::string why = flag->set(argv[++i]); !why.empty()) usage(arg + ": " + why);
  }
  if (shape.steps < 1) usage("--steps must be >= 1");
  if (shape.batch < 1 || shape.seq < 1) usage("--batch and --seq must be >= 1");
}

// Exits 1, printing "PROGRAM: WHAT: STATUS", unless `status` is OK.
inline void CheckOrExit(const absl::Status& status, const char* program, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s: %s\n", program, what, status.ToString().c_str());
  std::exit(1);
}

}  // namespace shardline::bench
