// `shardline train SPEC.yaml` and `shardline generate`: one device, no cluster needed.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <vector>

#include "checkpoint/layout.h"
#include "cli/commands.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "placement/train_spec.h"
#include "worker/model/data/tokenizer.h"
#include "worker/model/inference.h"
#include "worker/serving/serving_rank.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/trainer.h"

namespace shardline::cli {
namespace {

std::string Duration(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", s / 3600, s / 60 % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", s / 60, s % 60);
  }
  return buf;
}

}  // namespace

int Train(const TrainOptions& options) {
  auto spec = placement::LoadTrainSpecFile(options.spec_path);
  if (!spec.ok()) {
    std::cerr << "error: " << spec.status().message() << "\n";
    return 2;
  }
  if (options.steps > 0) spec->steps = options.steps;
  if (!options.checkpoint_dir.empty()) spec->checkpoint.dir = options.checkpoint_dir;
  if (!options.resume.empty()) {
    if (const absl::Status s = placement::SetResume(options.resume, spec->checkpoint); !s.ok()) {
      std::cerr << "error: --resume: " << s.message() << "\n";
      return 2;
    }
  }
  if (!options.init_from.empty()) spec->init_from = options.init_from;
  if (const absl::Status s = placement::CheckStartSources(*spec); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  // --device picks the device's default precision unless --precision is given too.
  if (!options.device.empty()) {
    if (const absl::Status s = placement::SetTrainDevice(options.device, *spec); !s.ok()) {
      std::cerr << "error: --device: " << s.message() << "\n";
      return 2;
    }
  }
  if (!options.precision.empty()) {
    if (const absl::Status s = placement::SetTrainPrecision(options.precision, *spec); !s.ok()) {
      std::cerr << "error: --precision: " << s.message() << "\n";
      return 2;
    }
  }
  std::cout << "Training " << spec->name << ": " << spec->model.layers << " layers, d_model "
            << spec->model.d_model << ", " << spec->model.heads << " heads, " << spec->steps
            << " steps of " << spec->batch << "×" << spec->seq_len << " tokens on "
            << (spec->data.path.empty() ? "the synthetic corpus" : spec->data.path) << " ("
            << placement::TrainDeviceName(*spec) << ")" << std::endl;
  InstallStopHandlers();
  // The checkpoint writer's thread reports commits while the loop reports steps: one line each.
  std::mutex out_mutex;
  const auto say = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(out_mutex);
    std::cout << line << std::endl;
  };
  training::TrainCallbacks callbacks;
  callbacks.on_start = [&](const training::TrainStart& start) {
    for (const checkpoint::SkippedStep& skipped : start.skipped) {
      say("Skipped checkpoint step " + std::to_string(skipped.step) + ": " + skipped.reason);
    }
    for (const std::string& line : start.prepared) say("Checkpoint dir: " + line);
    if (!start.resumed_from.empty()) {
      say("Resuming after step " + std::to_string(start.first_step - 1) + " from " +
          start.resumed_from);
    } else if (!start.initialized_from.empty()) {
      say("Starting from the parameters of " + start.initialized_from + " (a fresh optimizer)");
    }
  };
  callbacks.on_progress = [&](const training::TrainProgress& p) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "step %6lld/%lld  loss %.4f  grad norm %.3f  %8.0f tok/s  elapsed %s  ETA %s%s",
                  static_cast<long long>(p.step), static_cast<long long>(p.steps), p.loss,
                  p.grad_norm, p.tokens_per_second, Duration(p.elapsed_seconds).c_str(),
                  Duration(p.eta_seconds).c_str(), p.saving ? "  saving" : "");
    say(line);
  };
  callbacks.on_committed = [&](int64_t step, const std::string& manifest) {
    say("committed step " + std::to_string(step) + ": " + manifest);
  };
  auto result = training::Train(*spec, callbacks, &StopRequested());
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return 1;
  }
  if (result->losses.empty()) {
    std::printf("Nothing to train: the run is already at step %lld of %lld\n",
                static_cast<long long>(result->start.first_step - 1),
                static_cast<long long>(spec->steps));
  } else {
    std::printf("Final loss %.4f after step %lld (%zu steps this run); peak "
                "parameter/activation memory %.1f MiB\n",
                result->losses.back(),
                static_cast<long long>(result->start.first_step - 1 + result->losses.size()),
                result->losses.size(), result->peak_bytes / 1048576.0);
  }
  if (!result->checkpoint.empty()) std::cout << "Checkpoint: " << result->checkpoint << "\n";
  return StopRequested().load() ? 130 : 0;
}

absl::StatusOr<std::unique_ptr<kernels::Backend>> InferenceBackend(
    const std::string& device, kernels::CpuAllocator& allocator) {
  // One rule for device names: the train spec's.
  placement::TrainSpec parsed;
  RETURN_IF_ERROR(placement::SetTrainDevice(device, parsed));
  return kernels::CreateBackend(kernels::BackendOptions{
      .device = parsed.device == placement::TrainDevice::kCuda ? kernels::Device::kCuda
                                                               : kernels::Device::kCpu,
      .device_index = parsed.device_index,
      .cpu_allocator = &allocator});
}

int Generate(const GenerateCommandOptions& options) {
  // The device first: a wrong --device fails before anything is read.
  kernels::CpuAllocator allocator;
  auto backend = InferenceBackend(options.device, allocator);
  if (!backend.ok()) {
    const bool bad_name = absl::IsInvalidArgument(backend.status());
    std::cerr << "error: --device" << (bad_name ? "" : " " + options.device) << ": "
              << backend.status().message() << "\n";
    return bad_name ? 2 : 1;
  }
  auto path = checkpoint::ResolveCheckpoint(options.checkpoint);
  if (!path.ok()) {
    std::cerr << "error: " << path.status().message() << "\n";
    return 2;
  }
  // Before the model: a wrong --tokenizer fails before a large checkpoint is read.
  auto tokenizer = data::LoadTokenizer(training::TokenizerSpecFor(options.tokenizer, *path));
  if (!tokenizer.ok()) {
    const char* which =
        options.tokenizer.empty() ? "the checkpoint folder's tokenizer" : "--tokenizer";
    std::cerr << "error: " << which << ": " << tokenizer.status().message() << "\n";
    return 2;
  }
  // The engine's inference weights of the whole model (one rank: the serving shard at tp = pp =
  // 1), read box by box from any kind of checkpoint.
  auto source = training::CheckpointSource::Open(*path, options.hf_heads);
  if (!source.ok()) {
    std::cerr << "error: " << source.status().message() << "\n";
    return 1;
  }
  auto weights = serving::LoadServingShard(*source, 1, 1, placement::RankCoords{}, **backend);
  if (!weights.ok()) {
    std::cerr << "error: " << weights.status().message() << "\n";
    return 1;
  }
  const model::ModelConfig& config = (*weights)->weights().config;
  if (absl::Status fits = data::CheckTokenizerFitsModel(**tokenizer, config.vocab); !fits.ok()) {
    std::cerr << "error: " << *path << ": " << fits.message() << " (--tokenizer names another)\n";
    return 1;
  }
  // With the special tokens the tokenizer puts before a text (Llama's BOS), as transformers'
  // generate is given a prompt.
  const std::vector<data::Token> prompt = (*tokenizer)->EncodeWithSpecials(options.prompt);
  model::GenerateOptions generate;
  generate.max_new_tokens = options.max_new_tokens;
  generate.sampling.temperature = static_cast<float>(options.temperature);
  generate.sampling.top_k = options.top_k;
  generate.sampling.seed = options.seed;
  generate.use_kv_cache = !options.no_kv_cache;
  // Generation ends at an end-of-sequence token (any of them: Llama 3 instruct has several),
  // which is not printed, as `serve` does; --ignore-eos goes on to max_new_tokens.
  const std::vector<data::Token> stops =
      options.ignore_eos ? std::vector<data::Token>{} : (*tokenizer)->stop_tokens();
  std::vector<data::Token> tokens;
  auto generated = model::GenerateStreaming(
      (*weights)->weights(), **backend, prompt, generate, [&](int32_t token) {
        if (std::find(stops.begin(), stops.end(), token) != stops.end()) return false;
        tokens.push_back(token);
        return true;
      });
  if (!generated.ok()) {
    std::cerr << "error: " << generated.status().message() << "\n";
    return 1;
  }
  // A continuation of the prompt: a decoder that drops the space before a text's first word
  // (Llama 2's) must not drop it here.
  auto text = (*tokenizer)->DecodeContinuation(tokens);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return 1;
  }
  std::cout << options.prompt << *text << std::endl;
  return 0;
}

}  // namespace shardline::cli
