// Turning a ClusterStatus into what a person reads (tables, like `ray status`) or a script
// reads (JSON).
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "protocol/shardline.capnp.h"

namespace shardline::cli {

nlohmann::json StatusToJson(wire::ClusterStatus::Reader status);
std::string FormatCluster(wire::ClusterStatus::Reader status, const std::string& endpoint);
// One job: its actors and its results.
std::string FormatJob(wire::JobStatus::Reader job);
std::string FormatResults(wire::JobStatus::Reader job);
// A serve job's service in one line: its URL, batch, KV cache and counters.
std::string FormatServing(wire::ServingStatus::Reader serving);
// The same for the cluster table's note: the URL, or that the shards are loading.
std::string FormatServingNote(wire::ServingStatus::Reader serving);
std::string FormatBytes(uint64_t bytes);  // "64 MiB", "4 B", "262148 B"

}  // namespace shardline::cli
