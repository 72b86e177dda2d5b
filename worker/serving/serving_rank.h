// One rank's part of a serving group (tp tensor-parallel ranks in each of pp pipeline stages,
// numbered by placement::RankGrid(tp, pp, 1)), the same whoever started the group: `shardline
// serve --tp --pp` on one host, or the actors of a `kind: serve` job that the coordinator placed.
// Every rank checks the layout against the model before it loads anything, then reads only its
// boxes of the checkpoint. The leader (rank 0) also takes its API key and model name from here.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "placement/parallel_layout.h"
#include "worker/model/shard_layout.h"
#include "worker/serving/batching_engine.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::serving {

// Whether tp ranks in each of pp stages can split the model and each size its cache:
// InvalidArgument naming the numbers (the stages, ShardLayout's and CacheOptionsFor's checks).
// `tp_name` and `pp_name` name the layout's source in the messages ("--tp", "parallel.tp").
absl::Status CheckServingLayout(const model::ModelConfig& config, int tp, int pp,
                                const BatchingEngineOptions& engine,
                                const std::string& tp_name = "--tp",
                                const std::string& pp_name = "--pp");

// This rank's part of the parameters only (no gradients or optimizer state), read box by box: its
// tensor-parallel index of its stage's layers (`coords` in a RankGrid(tp, pp, 1)), in the memory of
// `backend`. Errors name the checkpoint.
absl::StatusOr<std::unique_ptr<model::ShardWeights>> LoadServingShard(
    const training::CheckpointSource& source, int tp, int pp, const placement::RankCoords& coords,
    kernels::Backend& backend);

// `groups` for a rank computing on `backend`: on a device backend the tensor-parallel group staged
// through host memory for the forward's all-reduces (ServingGroups::tp_forward, a
// comm::StagedCommunicator kept in `staged`); on the CPU `groups` as they are.
ServingGroups GroupsForBackend(ServingGroups groups, kernels::Backend& backend,
                               std::unique_ptr<comm::Communicator>& staged);

// The API key in the file `path`: its first line without surrounding white space.
// InvalidArgument naming the file when it cannot be read or that line is empty.
absl::StatusOr<std::string> ReadApiKeyFile(const std::string& path);

// The model name /v1/models lists for `checkpoint` when none is given: its file or folder name
// ("dir/" names dir), "shardline" when it has none.
std::string DefaultModelName(const std::string& checkpoint);

}  // namespace shardline::serving
