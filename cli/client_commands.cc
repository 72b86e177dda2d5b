// submit, status, cancel: short-lived clients of the coordinator.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/coordinator_client.h"
#include "cli/status_view.h"
#include "common/status_macros.h"
#include "placement/job_spec.h"
#include "protocol/rpc_client.h"

namespace shardline::cli {
namespace {

using protocol::Str;

void HandleStop(int) { StopRequested().store(true); }

void HandleReload(int) { ReloadRequested().store(true); }

absl::StatusOr<std::unique_ptr<protocol::RpcClient>> Connect(const ClientOptions& client) {
  return ConnectToCoordinator(client);
}

int Fail(const absl::Status& status) {
  std::cerr << "error: " << status.message() << "\n";
  return 1;
}

}  // namespace

std::atomic<bool>& StopRequested() {
  static std::atomic<bool> stop{false};
  return stop;
}

void InstallStopHandlers() {
  struct sigaction action {};
  action.sa_handler = HandleStop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::atomic<bool>& ReloadRequested() {
  static std::atomic<bool> reload{false};
  return reload;
}

void InstallReloadHandler() {
  struct sigaction action {};
  action.sa_handler = HandleReload;
  sigemptyset(&action.sa_mask);
  sigaction(SIGHUP, &action, nullptr);
}

absl::StatusOr<std::unique_ptr<protocol::RpcClient>> ConnectToCoordinator(
    const ClientOptions& client) {
  ASSIGN_OR_RETURN(const auto curve,
                   protocol::ResolveClientCurve(client.curve, protocol::PeerRole::kClient));
  if (!curve) {
    std::cerr << "warning: --insecure: talking to " << client.coordinator
              << " without CURVE authentication or encryption\n";
  }
  return protocol::RpcClient::Connect(client.coordinator, client.cluster_id, "cli",
                                      curve ? &*curve : nullptr);
}

int Keygen(const KeygenOptions& options) {
  if (options.name.empty()) {
    if (auto status = protocol::MakeKeyDir(options.out); !status.ok()) return Fail(status);
    const protocol::KeyDir dir{options.out};
    std::cout << "Made the cluster's CURVE keys in " << options.out << ":\n"
              << "  " << dir.CoordinatorSecret().string() << "  the coordinator's (keep it there)\n"
              << "  " << dir.IdentitySecret(protocol::PeerRole::kNode).string()
              << "  agents' (copy it, with coordinator.key, to every node)\n"
              << "  " << dir.IdentitySecret(protocol::PeerRole::kClient).string()
              << "  clients' (submit, status, cancel, plan)\n"
              << "  " << dir.Allowlist().string()
              << "  the keys the coordinator accepts (SIGHUP reloads it)\n"
              << "Use it with --keys " << options.out << " or SHARDLINE_KEYS=" << options.out
              << "\n";
    return 0;
  }
  const auto role = protocol::ParsePeerRole(options.role);
  if (!role) {
    return Fail(
        absl::InvalidArgumentError("--role must be node or client, not '" + options.role + "'"));
  }
  if (auto status = protocol::AddIdentity(options.out, options.name, *role); !status.ok()) {
    return Fail(status);
  }
  std::cout << "Added " << options.role << " key " << options.name << " ("
            << (std::filesystem::path(options.out) / (options.name + ".key_secret")).string()
            << ") to " << protocol::KeyDir{options.out}.Allowlist().string()
            << "; `kill -HUP` the coordinator to accept it\n";
  return 0;
}

// Fetches the status (of one job, or of all when `job_id` is empty).
absl::StatusOr<std::unique_ptr<protocol::Message>> FetchStatus(protocol::RpcClient& client,
                                                               const std::string& job_id,
                                                               std::chrono::milliseconds timeout) {
  auto message = client.NewMessage();
  message->payload().initStatusRequest().setJobId(job_id);
  return client.Call(*message, timeout);
}

SubmitFolders FoldersOf(const std::string& spec_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path here = fs::current_path(ec);
  SubmitFolders folders;
  folders.work_dir = here.lexically_normal().string();
  fs::path spec_dir = fs::path(spec_path).parent_path();
  if (spec_dir.is_relative()) spec_dir = here / spec_dir;
  folders.spec_dir = spec_dir.lexically_normal().string();
  // "a/b/" keeps its slash through lexically_normal; the coordinator compares folders as text.
  if (folders.spec_dir.size() > 1 && folders.spec_dir.back() == '/') folders.spec_dir.pop_back();
  return folders;
}

int Submit(const ClientOptions& client_options, const SubmitOptions& options) {
  std::ifstream in(options.spec_path);
  if (!in) return Fail(absl::NotFoundError("cannot read job spec " + options.spec_path));
  std::stringstream text;
  text << in.rdbuf();
  const SubmitFolders folders = FoldersOf(options.spec_path);
  // Validate here too: the user sees the error before anything reaches the cluster.
  auto spec = placement::ParseJobSpec(text.str(), options.spec_path,
                                      placement::PathBase{folders.spec_dir, folders.work_dir});
  if (!spec.ok()) return Fail(spec.status());

  auto client = Connect(client_options);
  if (!client.ok()) return Fail(client.status());
  auto message = (*client)->NewMessage();
  auto submit = message->payload().initSubmitJob();
  submit.setSpecYaml(text.str());
  submit.setSourceName(options.spec_path);
  submit.setSpecDir(folders.spec_dir);
  submit.setWorkDir(folders.work_dir);
  auto reply = (*client)->Call(*message, client_options.timeout);
  if (!reply.ok()) return Fail(reply.status());
  const std::string job_id = Str((*reply)->envelope().getPayload().getSubmitJobReply().getJobId());
  std::cout << "submitted job " << job_id << "\n";
  if (!options.wait) return 0;

  const auto deadline = std::chrono::steady_clock::now() + options.wait_timeout;
  std::string last_phase;
  uint64_t last_step = 0;
  bool start_shown = false;
  size_t generations_ended = 0;  // of a train job, already shown
  std::string serving_shown;     // a serve job's URL and readiness, as last shown
  while (!StopRequested().load()) {
    auto status = FetchStatus(**client, job_id, client_options.timeout);
    if (!status.ok()) return Fail(status.status());
    auto job = (*status)->envelope().getPayload().getClusterStatus().getJobs()[0];
    const std::string state = Str(job.getState());
    const std::string phase = state + " " + Str(job.getPhase());
    if (phase != last_phase) {
      std::cout << "  " << phase << (job.getError().size() ? ": " + Str(job.getError()) : "")
                << std::endl;
      last_phase = phase;
    }
    if (job.hasTrain() && !start_shown && state == "running") {
      for (const std::string& line : FormatTrainStart(job)) std::cout << "  " << line << std::endl;
      start_shown = true;
    }
    for (const std::string& line : NewlyEndedGenerations(job, &generations_ended)) {
      std::cout << "  " << line << std::endl;
    }
    if (job.hasServing() && FormatServingNote(job.getServing()) != serving_shown) {
      serving_shown = FormatServingNote(job.getServing());
      std::cout << "  serving: " << serving_shown << std::endl;
    }
    if (job.hasTrain() && job.getTrain().getLoggedStep() != last_step) {
      last_step = job.getTrain().getLoggedStep();
      std::cout << "  " << FormatTrainProgress(job) << std::endl;
    }
    if (state == "succeeded" || state == "failed" || state == "cancelled") {
      std::cout << "\n" << FormatJob(job);
      return state == "succeeded" ? 0 : 1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail(absl::DeadlineExceededError("job " + job_id + " still " + state + " after " +
                                              std::to_string(options.wait_timeout.count()) + " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return 130;
}

int Status(const ClientOptions& client_options, const StatusOptions& options) {
  auto client = Connect(client_options);
  if (!client.ok()) return Fail(client.status());
  auto reply = FetchStatus(**client, options.job_id, client_options.timeout);
  if (!reply.ok()) return Fail(reply.status());
  auto status = (*reply)->envelope().getPayload().getClusterStatus();
  if (options.json) {
    std::cout << StatusToJson(status).dump(2) << "\n";
  } else if (!options.job_id.empty()) {
    std::cout << FormatJob(status.getJobs()[0]);
  } else {
    std::cout << FormatCluster(status, client_options.coordinator);
  }
  return 0;
}

int Cancel(const ClientOptions& client_options, const std::string& job_id) {
  auto client = Connect(client_options);
  if (!client.ok()) return Fail(client.status());
  auto message = (*client)->NewMessage();
  message->payload().initCancelJob().setJobId(job_id);
  auto reply = (*client)->Call(*message, client_options.timeout);
  if (!reply.ok()) return Fail(reply.status());
  std::cout << "cancelled job " << job_id << "\n";
  return 0;
}

}  // namespace shardline::cli
