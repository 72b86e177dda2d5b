#include "tests/integration/local_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/coordinator_client.h"
#include "cli/status_view.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "monitoring/testing/http_get.h"
#include "protocol/rpc_client.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "shardline-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) return "/tmp";
  return tmpl;
}

// `ip` by its path (Spawn does not search PATH): Debian's iproute2 puts it in /usr/sbin.
std::string IpCommand() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "/usr/sbin/ip";
}

}  // namespace

std::string ShardlineBinary() {
  const char* path = std::getenv("SHARDLINE_BINARY");
  return path ? path : SHARDLINE_BINARY_PATH;
}

std::string SourceDir() {
  const char* path = std::getenv("SHARDLINE_SOURCE_DIR");
  return path ? path : SHARDLINE_SOURCE_PATH;
}

CommandResult RunShardline(const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  const std::string dir = MakeTempDir();
  SpawnOptions spawn;
  spawn.argv = {ShardlineBinary()};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.extra_env = env;
  spawn.log_path = dir + "/output";
  CommandResult result;
  auto pid = Spawn(spawn);
  if (!pid.ok()) {
    result.output = std::string(pid.status().message());
    return result;
  }
  auto exited = WaitFor(*pid, timeout);
  ExitStatus status;
  if (exited.ok() && exited->has_value()) {
    status = **exited;
  } else {
    status = Terminate(*pid, 2s);
    result.output = "[killed after timeout]\n";
  }
  result.exit_code = status.signaled ? 128 + status.code : status.code;
  result.output += ReadFile(spawn.log_path);
  fs::remove_all(dir);
  return result;
}

double SumOfSamples(const std::string& exposition, const std::string& metric,
                    const std::string& labels) {
  double sum = -1;
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(metric, 0) != 0 || line.size() <= metric.size()) continue;
    const char next = line[metric.size()];
    if (next != '{' && next != ' ') continue;
    if (!labels.empty() && line.find(labels) == std::string::npos) continue;
    sum = std::max(sum, 0.0) + std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

double ScrapeSum(const std::string& address, const std::string& metric,
                 const std::string& labels) {
  auto response = monitoring::testing::HttpGet(address, "/metrics");
  if (!response.ok() || response->status != 200) return -1;
  return SumOfSamples(response->body, metric, labels);
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return false;
  // A zombie still answers kill(0); its /proc state says Z.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  std::getline(stat, content);
  const auto close = content.rfind(')');
  return close == std::string::npos || content.size() < close + 3 || content[close + 2] != 'Z';
}

LocalCluster::LocalCluster(Options options) : options_(options), dir_(MakeTempDir()) {
  if (options_.insecure) return;
  // A failure here shows as the coordinator's refusal to start, naming the key files.
  const protocol::KeyDir keys{key_dir()};
  if (auto made = protocol::MakeKeyDir(keys.dir); !made.ok()) {
    fprintf(stderr, "LocalCluster: %s\n", std::string(made.message()).c_str());
    return;
  }
  auto client = protocol::LoadClientCurve(keys, protocol::PeerRole::kClient);
  auto node = protocol::LoadClientCurve(keys, protocol::PeerRole::kNode);
  if (client.ok()) client_curve_ = *client;
  if (node.ok()) node_curve_ = *node;
}

std::vector<std::string> LocalCluster::CurveFlags() const {
  if (options_.insecure) return {"--insecure"};
  return {"--keys", key_dir()};
}

LocalCluster::~LocalCluster() {
  for (auto& [node, pid] : agents_) {
    if (pid > 0) Terminate(pid, 3s);
  }
  if (coordinator_pid_ > 0) Terminate(coordinator_pid_, 3s);
  std::error_code ec;
  if (!std::getenv("SHARDLINE_KEEP_TEST_DIRS")) {
    fs::remove_all(dir_, ec);
    fs::remove_all(MemoryStoreRoot(), ec);
  }
}

std::string LocalCluster::MemoryStoreRoot() const {
  // Host memory, as the agents' default: a tmpfs. Named after the cluster's own folder, so that
  // clusters of tests running side by side never share one.
  const fs::path shm = "/dev/shm";
  const std::string name = fs::path(dir_).filename().string() + "-memory";
  return fs::is_directory(shm) ? (shm / name).string() : dir_ + "/memory";
}

std::string LocalCluster::MemoryStore(const std::string& node_id) const {
  return MemoryStoreRoot() + "/" + node_id;
}

std::vector<std::pair<std::string, std::string>> LocalCluster::DaemonEnv() const {
  if (!kAddressSanitizer || !options_.measures_memory) return {};
  const char* asan = std::getenv("ASAN_OPTIONS");
  return {{"ASAN_OPTIONS", std::string(asan ? asan : "") + ":quarantine_size_mb=0"}};
}

absl::Status LocalCluster::StartCoordinator() {
  SpawnOptions spawn;
  spawn.extra_env = DaemonEnv();
  const std::string endpoint_file = dir_ + "/endpoint";
  fs::remove(endpoint_file);
  spawn.argv = {ShardlineBinary(),
                "coordinator",
                "--listen",
                endpoint_.empty() ? "tcp://" + options_.coordinator_host + ":0" : endpoint_,
                "--endpoint-file",
                endpoint_file,
                "--metrics",
                "127.0.0.1:0",
                "--state-dir",
                dir_ + "/state",
                "--heartbeat-interval-ms",
                std::to_string(options_.heartbeat_interval.count()),
                "--heartbeat-timeout-ms",
                std::to_string(options_.heartbeat_timeout.count()),
                "--log-level",
                "debug"};
  for (const std::string& flag : CurveFlags()) spawn.argv.push_back(flag);
  spawn.log_path = dir_ + "/coordinator.log";
  ASSIGN_OR_RETURN(coordinator_pid_, Spawn(spawn));
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!fs::exists(endpoint_file)) {
    auto exited = TryReap(coordinator_pid_);
    if (exited.ok() && exited->has_value()) {
      coordinator_pid_ = 0;
      return absl::InternalError("coordinator exited: " + Log("coordinator"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("coordinator did not start: " + Log("coordinator"));
    }
    std::this_thread::sleep_for(10ms);
  }
  endpoint_ = ReadFile(endpoint_file);
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartCoordinator() {
  if (coordinator_pid_ > 0) {
    ::kill(coordinator_pid_, SIGKILL);
    (void)WaitFor(coordinator_pid_, 10s);
    coordinator_pid_ = 0;
  }
  return StartCoordinator();
}

absl::StatusOr<pid_t> LocalCluster::StartAgent(
    const std::string& node_id, const std::string& devices,
    const std::vector<std::pair<std::string, std::string>>& env,
    const std::vector<std::string>& extra_args) {
  return SpawnAgent({}, node_id, devices, env, extra_args);
}

absl::StatusOr<pid_t> LocalCluster::StartAgentIn(const std::string& netns,
                                                 const std::string& node_id,
                                                 const std::string& devices,
                                                 const std::vector<std::string>& extra_args) {
  // `ip netns exec` enters the namespace and execs the agent: the pid is the agent's.
  return SpawnAgent({IpCommand(), "netns", "exec", netns}, node_id, devices, {}, extra_args);
}

absl::StatusOr<pid_t> LocalCluster::SpawnAgent(
    const std::vector<std::string>& prefix, const std::string& node_id, const std::string& devices,
    const std::vector<std::pair<std::string, std::string>>& env,
    const std::vector<std::string>& extra_args) {
  SpawnOptions spawn;
  spawn.argv = prefix;
  for (const std::string& arg :
       {ShardlineBinary(), std::string("agent"), std::string("--coordinator"), endpoint_,
        std::string("--devices"), devices, std::string("--node-id"), node_id,
        std::string("--metrics"), std::string("127.0.0.1:0"), std::string("--log-dir"),
        dir_ + "/actors", std::string("--log-level"), std::string("debug"),
        std::string("--memory-store"), MemoryStore(node_id)}) {
    spawn.argv.push_back(arg);
  }
  for (const std::string& flag : CurveFlags()) spawn.argv.push_back(flag);
  spawn.argv.insert(spawn.argv.end(), extra_args.begin(), extra_args.end());
  spawn.extra_env = DaemonEnv();
  spawn.extra_env.insert(spawn.extra_env.end(), env.begin(), env.end());
  spawn.log_path = dir_ + "/agent-" + node_id + ".log";
  ASSIGN_OR_RETURN(pid_t pid, Spawn(spawn));
  // A second agent under the same id is a test of its own; keep the first for cleanup.
  if (agents_.count(node_id)) {
    agents_[node_id + "#" + std::to_string(pid)] = pid;
  } else {
    agents_[node_id] = pid;
  }
  latest_agent_[node_id] = pid;
  return pid;
}

absl::Status LocalCluster::WaitForAliveNodes(int count, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto status = Status();
    if (status.ok()) {
      int alive = 0;
      for (const auto& node : (*status)["nodes"]) alive += node["state"] == "alive" ? 1 : 0;
      if (alive >= count) return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("fewer than " + std::to_string(count) +
                                         " nodes alive; coordinator log:\n" + Log("coordinator"));
    }
    std::this_thread::sleep_for(50ms);
  }
}

absl::StatusOr<std::string> LocalCluster::Submit(const std::string& yaml) {
  ASSIGN_OR_RETURN(auto client,
                   protocol::RpcClient::Connect(endpoint_, "shardline", "test", client_curve()));
  auto message = client->NewMessage();
  auto submit = message->payload().initSubmitJob();
  submit.setSpecYaml(yaml);
  submit.setSourceName("test.yaml");
  ASSIGN_OR_RETURN(auto reply, client->Call(*message, 10s));
  return protocol::Str(reply->envelope().getPayload().getSubmitJobReply().getJobId());
}

absl::StatusOr<nlohmann::json> LocalCluster::Status() {
  ASSIGN_OR_RETURN(auto client,
                   protocol::RpcClient::Connect(endpoint_, "shardline", "test", client_curve()));
  ASSIGN_OR_RETURN(auto reply, cli::FetchStatus(*client, "", 10s));
  return cli::StatusToJson(reply->envelope().getPayload().getClusterStatus());
}

absl::StatusOr<nlohmann::json> LocalCluster::Job(const std::string& job_id) {
  ASSIGN_OR_RETURN(auto client,
                   protocol::RpcClient::Connect(endpoint_, "shardline", "test", client_curve()));
  ASSIGN_OR_RETURN(auto reply, cli::FetchStatus(*client, job_id, 10s));
  auto json = cli::StatusToJson(reply->envelope().getPayload().getClusterStatus());
  return json["jobs"][0];
}

absl::StatusOr<nlohmann::json> LocalCluster::WaitForJob(
    const std::string& job_id, const std::function<bool(const nlohmann::json&)>& done,
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  nlohmann::json last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto job = Job(job_id);
    if (job.ok()) {
      last = *job;
      if (done(last)) return last;
    }
    std::this_thread::sleep_for(50ms);
  }
  return absl::DeadlineExceededError("job " + job_id + " did not get there in time; last: " +
                                     last.dump() + "\ncoordinator log tail:\n" +
                                     Log("coordinator").substr(
                                         Log("coordinator").size() > 4000
                                             ? Log("coordinator").size() - 4000
                                             : 0));
}

absl::StatusOr<nlohmann::json> LocalCluster::WaitForJobEnd(const std::string& job_id,
                                                           std::chrono::milliseconds timeout) {
  return WaitForJob(
      job_id,
      [](const nlohmann::json& job) {
        const auto state = job["state"].get<std::string>();
        return state == "succeeded" || state == "failed" || state == "cancelled";
      },
      timeout);
}

std::string LocalCluster::metrics_address() {
  auto status = Status();
  if (!status.ok()) return "";
  return (*status)["metrics_address"].get<std::string>();
}

std::string LocalCluster::Log(const std::string& name) const {
  return ReadFile(dir_ + "/" + name + ".log");
}

}  // namespace shardline::testing
