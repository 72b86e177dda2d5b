#include "worker/serving/serving_rank.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/comm/staged_communicator.h"

namespace shardline::serving {

absl::Status CheckServingLayout(const model::ModelConfig& config, int tp, int pp,
                                const BatchingEngineOptions& engine, const std::string& tp_name,
                                const std::string& pp_name) {
  if (pp < 1 || pp > config.layers) {
    return absl::InvalidArgumentError(absl::StrCat(pp_name, " ", pp, ": a model of ", config.layers,
                                                   " layers has 1 to ", config.layers,
                                                   " pipeline stages"));
  }
  auto layout = model::ShardLayout::Create(
      config, {.tp_size = tp, .tp_index = 0, .chunks = {{0, static_cast<int>(config.layers)}}});
  if (!layout.ok()) return Annotate(layout.status(), absl::StrCat(tp_name, " ", tp));
  return CacheOptionsFor(config, engine, tp, pp).status();
}

absl::StatusOr<std::unique_ptr<model::ShardWeights>> LoadServingShard(
    const training::CheckpointSource& source, int tp, int pp, const placement::RankCoords& coords,
    kernels::Backend& backend) {
  auto weights = model::ShardWeights::Load(
      source.config(), tp, coords.tp,
      [&](const std::string& name, const std::vector<int64_t>& offsets,
          const std::vector<int64_t>& shape) {
        return training::ReadCheckpointBox(source, name, offsets, shape);
      },
      backend, pp, coords.pp);
  if (!weights.ok()) return Annotate(weights.status(), source.path());
  return weights;
}

ServingGroups GroupsForBackend(ServingGroups groups, kernels::Backend& backend,
                               std::unique_ptr<comm::Communicator>& staged) {
  if (backend.device() == kernels::Device::kCpu || groups.tp == nullptr) return groups;
  staged = std::make_unique<comm::StagedCommunicator>(*groups.tp, backend);
  groups.tp_forward = staged.get();
  return groups;
}

absl::StatusOr<std::string> ReadApiKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot be read"));
  std::string key;
  std::getline(in, key);
  const auto first = key.find_first_not_of(" \t\r\n");
  const auto last = key.find_last_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the first line is empty"));
  }
  return key.substr(first, last - first + 1);
}

std::string DefaultModelName(const std::string& checkpoint) {
  std::filesystem::path p(checkpoint);
  if (!p.has_filename()) p = p.parent_path();  // "dir/" names dir
  const std::string name = p.filename().string();
  return name.empty() ? "shardline" : name;
}

}  // namespace shardline::serving
