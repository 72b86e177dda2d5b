// `shardline serve`: one checkpoint behind the OpenAI-compatible HTTP API, generated in this
// process with continuous batching (worker/serving/batching_engine.h).
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "checkpoint/layout.h"
#include "cli/commands.h"
#include "kernels/allocator.h"
#include "worker/model/data/tokenizer.h"
#include "worker/serving/batching_engine.h"
#include "worker/serving/http_server.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::cli {
namespace {

// "HOST:PORT" (port 0: any free port); false with `error` set when it is not that.
bool ParseListen(const std::string& listen, std::string* host, int* port, std::string* error) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    *error = "--listen '" + listen + "' is not HOST:PORT";
    return false;
  }
  *host = listen.substr(0, colon);
  const std::string digits = listen.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *port);
  if (ec != std::errc() || end != digits.data() + digits.size() || *port < 0 || *port > 65535) {
    *error = "--listen '" + listen + "': the port '" + digits + "' is not a number in 0..65535";
    return false;
  }
  return true;
}

// The key of --api-key-file: its first line without surrounding white space.
bool ReadKeyFile(const std::string& path, std::string* key, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "--api-key-file " + path + ": cannot be read";
    return false;
  }
  std::getline(in, *key);
  const auto first = key->find_first_not_of(" \t\r\n");
  const auto last = key->find_last_not_of(" \t\r\n");
  *key = first == std::string::npos ? "" : key->substr(first, last - first + 1);
  if (key->empty()) {
    *error = "--api-key-file " + path + ": the first line is empty";
    return false;
  }
  return true;
}

std::string DefaultModelName(const std::string& checkpoint) {
  std::filesystem::path p(checkpoint);
  if (!p.has_filename()) p = p.parent_path();  // "dir/" names dir
  const std::string name = p.filename().string();
  return name.empty() ? "shardline" : name;
}

}  // namespace

int Serve(const ServeOptions& options) {
  serving::HttpServerOptions http;
  std::string error;
  if (!ParseListen(options.listen, &http.host, &http.port, &error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  http.api_key = options.api_key;
  if (!options.api_key_file.empty() && !ReadKeyFile(options.api_key_file, &http.api_key, &error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  http.model_name =
      options.model_name.empty() ? DefaultModelName(options.checkpoint) : options.model_name;

  auto path = checkpoint::ResolveCheckpoint(options.checkpoint);
  if (!path.ok()) {
    std::cerr << "error: --checkpoint: " << path.status().message() << "\n";
    return 2;
  }
  auto tokenizer = data::LoadTokenizer(DefaultTokenizerSpec(options.tokenizer, *path));
  if (!tokenizer.ok()) {
    std::cerr << "error: --tokenizer: " << tokenizer.status().message() << "\n";
    return 2;
  }
  kernels::CpuAllocator allocator;
  // The parameters only (no gradients or optimizer state), read box by box: the same loading a
  // tensor-parallel rank does for its part.
  auto source = training::CheckpointSource::Open(*path, options.hf_heads);
  if (!source.ok()) {
    std::cerr << "error: " << source.status().message() << "\n";
    return 1;
  }
  auto weights = model::ShardWeights::Load(
      source->config(), /*tp_size=*/1, /*tp_index=*/0,
      [&](const std::string& name, const std::vector<int64_t>& offsets,
          const std::vector<int64_t>& shape) {
        return training::ReadCheckpointBox(*source, name, offsets, shape);
      },
      allocator);
  if (!weights.ok()) {
    std::cerr << "error: " << source->path() << ": " << weights.status().message() << "\n";
    return 1;
  }
  const model::GptConfig& config = source->config();
  if (config.vocab < (*tokenizer)->vocab_size()) {
    std::cerr << "error: " << *path << " has a vocabulary of " << config.vocab
              << " tokens, fewer than the " << (*tokenizer)->vocab_size() << " of "
              << (*tokenizer)->Describe() << " (--tokenizer names another)\n";
    return 1;
  }

  auto engine = serving::BatchingEngine::Create(
      (*weights)->weights(),
      serving::BatchingEngineOptions{.max_running = options.max_running,
                                     .max_tokens_per_step = options.max_tokens_per_step,
                                     .block_size = options.block_size,
                                     .kv_cache_bytes = options.kv_cache_mib << 20,
                                     .max_queue = options.max_queue},
      allocator);
  if (!engine.ok()) {
    std::cerr << "error: " << engine.status().message() << "\n";
    return engine.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  InstallStopHandlers();
  auto server = serving::HttpServer::Start(http, **engine, **tokenizer);
  if (!server.ok()) {
    std::cerr << "error: --listen: " << server.status().message() << "\n";
    return 1;
  }
  const serving::BatchingStats batching = (*engine)->Batching();
  std::cout << "serving " << http.model_name << " at " << (*server)->url() << "/v1 (batches of "
            << options.max_running << ", " << options.max_tokens_per_step
            << " tokens per step, KV cache of " << batching.kv_blocks << " blocks of "
            << options.block_size << " positions)" << std::endl;
  while (!StopRequested().load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::cout << "stopping" << std::endl;
  (*server)->Stop();
  (*engine)->Shutdown();
  return 0;
}

}  // namespace shardline::cli
