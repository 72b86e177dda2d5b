// Small helpers the client subcommands share.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "protocol/rpc_client.h"

namespace shardline::cli {

// The coordinator's ClusterStatus reply (of one job, or of all when `job_id` is empty).
absl::StatusOr<std::unique_ptr<protocol::Message>> FetchStatus(protocol::RpcClient& client,
                                                               const std::string& job_id,
                                                               std::chrono::milliseconds timeout);

}  // namespace shardline::cli
