// Small helpers the client subcommands share.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/rpc_client.h"

namespace shardline::cli {

struct ClientOptions;

// A client of the coordinator with the CURVE client key of `client.curve` (or none, loudly,
// under --insecure).
absl::StatusOr<std::unique_ptr<protocol::RpcClient>> ConnectToCoordinator(
    const ClientOptions& client);

// The coordinator's ClusterStatus reply (of one job, or of all when `job_id` is empty).
absl::StatusOr<std::unique_ptr<protocol::Message>> FetchStatus(protocol::RpcClient& client,
                                                               const std::string& job_id,
                                                               std::chrono::milliseconds timeout);

// The SubmitJob folders of a spec file: the file's absolute folder (against which a train job's
// data.path resolves) and the current directory (checkpoint.dir).
struct SubmitFolders {
  std::string spec_dir;
  std::string work_dir;
};
SubmitFolders FoldersOf(const std::string& spec_path);

// A train job's progress on one line (status_view.cc): step/steps, loss, tokens/s, ETA, the
// compute/comm/bubble split of a step, the last committed checkpoint and the plan. Expects a job
// with train progress (JobStatus.hasTrain()).
std::string FormatTrainProgress(wire::JobStatus::Reader job);
// Where a train job started, one line each ("resumed after step 200", "skipped checkpoint step
// 300: ...", "started from the parameters of ..."); empty for a fresh start or one not decided
// yet.
std::vector<std::string> FormatTrainStart(wire::JobStatus::Reader job);
// A train job's generations, one line each (when, plan, resumed step, how it ended, steps lost,
// recovery time); nothing for a job that ran one generation and is not elastic.
std::vector<std::string> FormatGenerations(wire::JobStatus::Reader job);
// The lines of the generations that ended since `*shown` of them were (a progress view prints
// each once, as its restart happens); advances `*shown`.
std::vector<std::string> NewlyEndedGenerations(wire::JobStatus::Reader job, size_t* shown);

}  // namespace shardline::cli
