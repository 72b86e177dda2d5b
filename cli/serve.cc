// `shardline serve`: one checkpoint behind the OpenAI-compatible HTTP API, generated with
// continuous batching (worker/serving/batching_engine.h) in this process, or with --tp T --pp P
// over T·P processes of this host (T tensor-parallel ranks in each of P pipeline stages, numbered
// by placement::RankGrid): this one (rank 0: the engine and the HTTP server) and T·P-1
// `serve-rank` followers it starts (comm::LocalRankGroup), each loading only its shard.
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "cli/commands.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "placement/job_spec.h"
#include "placement/parallel_layout.h"
#include "worker/comm/local_rank_group.h"
#include "worker/model/data/tokenizer.h"
#include "worker/model/shard_layout.h"
#include "worker/serving/batching_engine.h"
#include "worker/serving/chat_format.h"
#include "worker/serving/http_server.h"
#include "worker/serving/serving_rank.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::cli {
namespace {

// "HOST:PORT" (port 0: any free port); false with `error` set when it is not that.
bool ParseListen(const std::string& listen, std::string* host, int* port, std::string* error) {
  const absl::Status parsed = placement::ParseHostPort(listen, host, port);
  if (!parsed.ok()) *error = absl::StrCat("--listen ", parsed.message());
  return parsed.ok();
}

// What every rank of a group is started with, from rank 0's flags: one description, so that
// every rank sizes the same cache.
ServeRankOptions RankOptionsOf(const ServeOptions& options, const std::string& resolved, int rank,
                               const std::string& store_dir) {
  return ServeRankOptions{.checkpoint = resolved,
                          .hf_heads = options.hf_heads,
                          .rank = rank,
                          .tp = options.tp,
                          .pp = options.pp,
                          .store_dir = store_dir,
                          .max_running = options.max_running,
                          .max_tokens_per_step = options.max_tokens_per_step,
                          .block_size = options.block_size,
                          .kv_cache_mib = options.kv_cache_mib,
                          .log_level = options.log_level,
                          .device = options.device};
}

serving::BatchingEngineOptions EngineOptionsOf(const ServeRankOptions& rank, int max_queue) {
  return serving::BatchingEngineOptions{.max_running = rank.max_running,
                                        .max_tokens_per_step = rank.max_tokens_per_step,
                                        .block_size = rank.block_size,
                                        .kv_cache_bytes = rank.kv_cache_mib << 20,
                                        .max_queue = max_queue};
}

// The `serve-rank` command line of a follower; main.cc parses it back into ServeRankOptions.
std::vector<std::string> ServeRankCommand(const ServeRankOptions& o) {
  return {SelfExecutable(),
          "serve-rank",
          "--log-level",
          o.log_level,
          "--checkpoint",
          o.checkpoint,
          "--hf-heads",
          std::to_string(o.hf_heads),
          "--rank",
          std::to_string(o.rank),
          "--tp",
          std::to_string(o.tp),
          "--pp",
          std::to_string(o.pp),
          "--store",
          o.store_dir,
          "--max-running",
          std::to_string(o.max_running),
          "--max-tokens-per-step",
          std::to_string(o.max_tokens_per_step),
          "--block-size",
          std::to_string(o.block_size),
          "--kv-cache-mib",
          std::to_string(o.kv_cache_mib),
          "--device",
          o.device};
}

// The followers' share of this host's cores for OpenMP and OpenBLAS, as the agent gives its
// actors (unshared, N ranks run N pools on the same cores and every collective waits for a
// descheduled peer); a value serve was started with wins. Rank 0's own pool was sized when it
// started: OMP_NUM_THREADS set for serve sizes every rank's.
std::vector<std::pair<std::string, std::string>> FollowerThreadsEnv(int ranks) {
  const std::string threads = std::to_string(std::max(1, UsableCpus() / ranks));
  std::vector<std::pair<std::string, std::string>> env;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (std::getenv(name) == nullptr) env.emplace_back(name, threads);
  }
  return env;
}

// The group's bootstrap and per-operation timeouts, the same on every rank. A follower waits this
// long for the next step; an idle leader sends a heartbeat every second.
comm::CpuCommOptions GroupCommOptions() { return comm::CpuCommOptions{}; }

// "tp 2, pp 2": the group in messages.
std::string GroupName(int tp, int pp) { return absl::StrCat("tp ", tp, ", pp ", pp); }

// Ranks 1..tp·pp-1 of `serve --tp --pp`, loading `resolved` (comm::LocalRankGroup::Start).
absl::StatusOr<std::unique_ptr<comm::LocalRankGroup>> StartFollowers(const ServeOptions& options,
                                                                     const std::string& resolved) {
  return comm::LocalRankGroup::Start(comm::LocalRankGroupOptions{
      .tp = options.tp,
      .pp = options.pp,
      .command =
          [&](int rank, const std::string& dir) {
            return ServeRankCommand(RankOptionsOf(options, resolved, rank, dir));
          },
      .extra_env = FollowerThreadsEnv(options.tp * options.pp),
      .comm = GroupCommOptions()});
}

serving::ServingGroups ServingGroupsOf(const comm::RankCommunicators& communicators) {
  return serving::ServingGroups{.world = communicators.world.get(),
                                .tp = communicators.tp.get(),
                                .pp = communicators.pp.get()};
}

// Serves until a stop is requested (OK) or the engine or a rank of its group fails (the error).
absl::Status ServeUntilStopped(const serving::BatchingEngine& engine, comm::LocalRankGroup* group) {
  while (!StopRequested().load()) {
    // A dead follower fails the engine's next collective (within the heartbeat); its exit says
    // more than the engine's stop, so it is looked for first.
    if (group != nullptr) {
      if (absl::Status followers = group->CheckFollowers(); !followers.ok()) {
        return Annotate(followers, "the serving group failed");
      }
    }
    if (!engine.Ready()) {
      return absl::UnavailableError("the engine stopped after a failed step");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::OkStatus();
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
  if (!options.api_key_file.empty()) {
    auto key = serving::ReadApiKeyFile(options.api_key_file);
    if (!key.ok()) {
      std::cerr << "error: --api-key-file " << key.status().message() << "\n";
      return 2;
    }
    http.api_key = *key;
  }
  http.model_name = options.model_name.empty() ? serving::DefaultModelName(options.checkpoint)
                                               : options.model_name;
  // The device before anything is read or started (the followers create theirs the same way).
  kernels::CpuAllocator allocator;
  auto device = InferenceBackend(options.device, allocator);
  if (!device.ok()) {
    const bool bad_name = absl::IsInvalidArgument(device.status());
    std::cerr << "error: --device" << (bad_name ? "" : " " + options.device) << ": "
              << device.status().message() << "\n";
    return bad_name ? 2 : 1;
  }
  kernels::Backend& backend = **device;

  auto path = checkpoint::ResolveCheckpoint(options.checkpoint);
  if (!path.ok()) {
    std::cerr << "error: --checkpoint: " << path.status().message() << "\n";
    return 2;
  }
  const std::string tokenizer_spec = training::TokenizerSpecFor(options.tokenizer, *path);
  auto tokenizer = data::LoadTokenizer(tokenizer_spec);
  if (!tokenizer.ok()) {
    std::cerr << "error: --tokenizer: " << tokenizer.status().message() << "\n";
    return 2;
  }
  // The model's chat template lives with its tokenizer (tokenizer_config.json).
  auto chat = serving::ChatFormatFor(tokenizer_spec);
  if (!chat.ok()) {
    std::cerr << "error: chat template: " << chat.status().message() << "\n";
    return 1;
  }
  http.chat = *chat;
  auto source = training::CheckpointSource::Open(*path, options.hf_heads);
  if (!source.ok()) {
    std::cerr << "error: " << source.status().message() << "\n";
    return 1;
  }
  const model::ModelConfig& config = source->config();
  if (absl::Status fits = data::CheckTokenizerFitsModel(**tokenizer, config.vocab); !fits.ok()) {
    std::cerr << "error: " << *path << ": " << fits.message() << " (--tokenizer names another)\n";
    return 1;
  }
  const serving::BatchingEngineOptions engine_options =
      EngineOptionsOf(RankOptionsOf(options, *path, 0, ""), options.max_queue);
  if (absl::Status fits =
          serving::CheckServingLayout(config, options.tp, options.pp, engine_options);
      !fits.ok()) {
    std::cerr << "error: " << fits.message() << "\n";
    return 2;
  }
  // tp and pp are >= 1 here (--tp's range, CheckServingLayout).
  const placement::RankGrid grid = *placement::RankGrid::Create(options.tp, options.pp, 1);
  const std::string group_name = GroupName(options.tp, options.pp);

  // From here a stop request ends the start-up too, so the followers and the store go with it.
  InstallStopHandlers();
  // Declared before the engine, so the engine (whose communicator it owns) goes first.
  std::unique_ptr<comm::LocalRankGroup> group;
  if (grid.world() > 1) {
    auto started = StartFollowers(options, *path);
    if (!started.ok()) {
      std::cerr << "error: serving group (" << group_name << "): " << started.status().message()
                << "\n";
      return 1;
    }
    group = std::move(*started);
  }
  // The followers load their shards while this rank loads its own.
  auto weights =
      serving::LoadServingShard(*source, options.tp, options.pp, grid.Coords(0), backend);
  if (!weights.ok()) {
    std::cerr << "error: " << weights.status().message() << "\n";
    return 1;
  }
  serving::ServingGroups groups;  // all null: one rank
  if (group != nullptr) {
    auto joined = group->Join(StopRequested());
    if (absl::IsCancelled(joined.status())) {
      std::cout << "stopping" << std::endl;
      return 0;
    }
    if (!joined.ok()) {
      std::cerr << "error: serving group (" << group_name << "): " << joined.status().message()
                << "\n";
      return 1;
    }
    groups = ServingGroupsOf(**joined);
  }
  std::unique_ptr<comm::Communicator> staged_tp;
  groups = serving::GroupsForBackend(groups, backend, staged_tp);

  auto engine =
      serving::BatchingEngine::Create((*weights)->weights(), engine_options, backend, groups);
  if (!engine.ok()) {
    std::cerr << "error: " << engine.status().message() << "\n";
    return engine.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  auto server = serving::HttpServer::Start(http, **engine, **tokenizer);
  if (!server.ok()) {
    std::cerr << "error: --listen: " << server.status().message() << "\n";
    return 1;
  }
  const serving::BatchingStats batching = (*engine)->Batching();
  std::cout << "serving " << http.model_name << " at " << (*server)->url() << "/v1 (tp "
            << options.tp << ", pp " << options.pp << ", batches of " << options.max_running << ", "
            << options.max_tokens_per_step << " tokens per step, KV cache of " << batching.kv_blocks
            << " blocks of " << options.block_size << " positions"
            << (grid.world() > 1 ? " on each rank" : "") << ")" << std::endl;
  std::cout << "chat completions: " << http.chat.Describe() << std::endl;
  const absl::Status served = ServeUntilStopped(**engine, group.get());
  std::cout << "stopping" << std::endl;
  (*server)->Stop();
  (*engine)->Shutdown();  // tells the followers to stop
  if (!served.ok()) {
    std::cerr << "error: " << served.message() << "\n";
    return 1;
  }
  if (group != nullptr) {
    if (absl::Status stopped = group->Finish(std::chrono::seconds(10)); !stopped.ok()) {
      std::cerr << "error: serving group (" << group_name << "): " << stopped.message() << "\n";
      return 1;
    }
  }
  return 0;
}

int ServeRank(const ServeRankOptions& options) {
  // The leader stops the group. A signal sent to the whole process group (Ctrl-C in a terminal, a
  // service manager's stop) must not end a follower before its leader says so; a follower still
  // dies with its leader (the parent-death signal).
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  auto grid = placement::RankGrid::Create(options.tp, options.pp, 1);
  if (!grid.ok() || options.rank < 1 || options.rank >= grid->world()) {
    std::cerr << "error: rank " << options.rank << " is not a follower of a group of "
              << GroupName(options.tp, options.pp) << "\n";
    return 2;
  }
  const placement::RankCoords coords = grid->Coords(options.rank);
  const std::string who =
      absl::StrCat("rank ", options.rank, " of ", GroupName(options.tp, options.pp),
                   " (tensor-parallel index ", coords.tp, ", stage ", coords.pp, "): ");
  auto source = training::CheckpointSource::Open(options.checkpoint, options.hf_heads);
  if (!source.ok()) {
    std::cerr << "error: " << who << source.status().message() << "\n";
    return 1;
  }
  kernels::CpuAllocator allocator;
  auto device = InferenceBackend(options.device, allocator);
  if (!device.ok()) {
    std::cerr << "error: " << who << "--device " << options.device << ": "
              << device.status().message() << "\n";
    return 1;
  }
  kernels::Backend& backend = **device;
  auto weights = serving::LoadServingShard(*source, options.tp, options.pp, coords, backend);
  if (!weights.ok()) {
    std::cerr << "error: " << who << weights.status().message() << "\n";
    return 1;
  }
  auto communicators =
      comm::JoinLocalRankGroup(options.store_dir, options.rank, *grid, GroupCommOptions());
  if (!communicators.ok()) {
    std::cerr << "error: " << who << communicators.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<comm::Communicator> staged_tp;
  const serving::ServingGroups groups =
      serving::GroupsForBackend(ServingGroupsOf(*communicators), backend, staged_tp);
  const absl::Status served = serving::RunServingFollower(
      (*weights)->weights(), EngineOptionsOf(options, /*max_queue=*/1), backend, groups);
  if (!served.ok()) {
    std::cerr << "error: " << who << served.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace shardline::cli
