// `shardline slurm SPEC`: a Shardline cluster inside a SLURM allocation, one task per node.
//
// In the batch script (or an salloc shell) it starts itself as a job step, one task per node
// (`srun --ntasks-per-node=1 --kill-on-bad-exit=0`). In the step, the task on the first node
// makes the allocation's CURVE keys in a rendezvous directory only the user reads, starts the
// coordinator and publishes its endpoint there (a file renamed into place: no port guessed),
// starts its own node's agent, submits SPEC and follows it; its exit code is the job's result
// and so the step's. Every other task waits for the endpoint and runs its node's agent until the
// first task removes the directory at the end. scancel's SIGTERM stops every process and the
// first task removes the directory on its way out.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/coordinator_start.h"
#include "cli/slurm_allocation.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "protocol/address_rule.h"
#include "protocol/curve.h"
#include "spdlog/spdlog.h"

namespace shardline::cli {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kEndpointFile = "coordinator.endpoint";
// What the first node could not do, for the other nodes to say too.
constexpr const char* kFailureFile = "failed";

// `program`'s path on $PATH ("" when it is not there): Spawn execs a path.
std::string OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    const fs::path candidate = fs::path(std::string(dir)) / program;
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

// Runs a short command (scontrol) to its end, within `timeout`, and returns what it printed.
absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv,
                                          std::chrono::milliseconds timeout) {
  std::string command;
  for (const std::string& arg : argv) command += (command.empty() ? "" : " ") + arg;
  const std::string program = OnPath(argv[0]);
  if (program.empty()) {
    return absl::NotFoundError("`" + argv[0] +
                               "` is not on $PATH (SLURM's client commands must "
                               "be installed on every node)");
  }
  char path[] = "/tmp/shardline-slurm-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("cannot make a temporary file for `" + argv[0] + "`");
  close(fd);
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.argv[0] = program;
  spawn.log_path = path;
  auto pid = Spawn(spawn);
  if (!pid.ok()) {
    fs::remove(path);
    return absl::NotFoundError("cannot run `" + argv[0] +
                               "`: " + std::string(pid.status().message()));
  }
  auto exited = WaitFor(*pid, timeout);
  std::optional<ExitStatus> status = exited.ok() ? *exited : std::nullopt;
  if (!status) status = Terminate(*pid, 1s);
  std::string output = ReadWholeFile(path);
  fs::remove(path);
  if (!exited.ok() || !exited->has_value()) {
    return absl::DeadlineExceededError("`" + command + "` did not finish within " +
                                       std::to_string(timeout.count() / 1000) + " s");
  }
  if (!status->success()) {
    // exec failing in the child is exit code 127.
    return absl::FailedPreconditionError("`" + command + "` failed (" + status->Describe() +
                                         "): " + output);
  }
  return output;
}

// The node names of the allocation, expanded by SLURM itself: never guessed from the
// compressed list, never a silent localhost when scontrol is missing.
absl::StatusOr<std::vector<std::string>> ExpandNodeList(const std::string& node_list) {
  auto output = RunAndCapture({"scontrol", "show", "hostnames", node_list}, 30s);
  if (!output.ok()) {
    return absl::Status(output.status().code(), "cannot expand the allocation's node list '" +
                                                    node_list +
                                                    "': " + std::string(output.status().message()));
  }
  return ParseHostnames(*output, node_list);
}

// The address the coordinator advertises: --interface's, else the one this node uses to reach
// another node of the allocation at the NodeAddr slurm.conf gives it (the address SLURM itself
// reaches it at), else loopback for a one-node allocation.
absl::StatusOr<protocol::AdvertisedAddress> CoordinatorAddress(
    const SlurmOptions& options, const std::vector<std::string>& nodes) {
  if (!options.interface.empty())
    return protocol::ChooseAdvertisedAddress("", options.interface, "");
  if (nodes.size() < 2) return protocol::AdvertisedAddress{"127.0.0.1", "lo", "one node"};
  std::string peers;
  for (size_t i = 1; i < nodes.size(); ++i) peers += (i > 1 ? "," : "") + nodes[i];
  auto output = RunAndCapture({"scontrol", "show", "node", "-o", peers}, 30s);
  if (!output.ok()) {
    return absl::Status(output.status().code(),
                        "cannot look up the other nodes' addresses (give --interface): " +
                            std::string(output.status().message()));
  }
  const auto addresses = ParseNodeAddresses(*output);
  const auto it = addresses.find(nodes[1]);
  if (it == addresses.end()) {
    return absl::NotFoundError("`scontrol show node -o " + peers + "` gave no NodeAddr for " +
                               nodes[1] + " (give --interface)");
  }
  auto chosen = protocol::ChooseAdvertisedAddress("", "", "tcp://" + it->second + ":9");
  if (!chosen.ok()) return chosen.status();
  chosen->how =
      "the interface " + chosen->interface + " routes to " + nodes[1] + " (" + it->second + ")";
  return chosen;
}

fs::path RendezvousDir(const SlurmOptions& options, const SlurmTask& task) {
  if (!options.rendezvous_dir.empty()) return options.rendezvous_dir;
  const char* home = std::getenv("HOME");
  return fs::path(home && *home ? home : "/tmp") / ".shardline" / "slurm" /
         (task.job_id + "." + task.step_id);
}

// Makes `dir` and its missing parents readable by this user only.
absl::Status MakePrivateDir(const fs::path& dir) {
  std::error_code ec;
  fs::path so_far;
  for (const fs::path& part : dir) {
    so_far /= part;
    if (fs::exists(so_far)) continue;
    if (!fs::create_directory(so_far, ec) || ec) {
      return absl::PermissionDeniedError("cannot make " + so_far.string() + ": " + ec.message());
    }
    fs::permissions(so_far, fs::perms::owner_all, fs::perm_options::replace, ec);
  }
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec)
    return absl::PermissionDeniedError("cannot restrict " + dir.string() + ": " + ec.message());
  return absl::OkStatus();
}

std::vector<std::string> AgentArgv(const SlurmOptions& options, const SlurmTask& task,
                                   const std::string& endpoint, const fs::path& keys) {
  std::vector<std::string> argv = {
      SelfExecutable(), "agent",
      "--coordinator",  endpoint,
      "--devices",      options.devices.empty() ? AllocatedDevices(task) : options.devices,
      "--keys",         keys.string(),
      "--log-level",    options.log_level};
  // Else the agent's own default, the host name.
  if (!task.node_name.empty()) argv.insert(argv.end(), {"--node-id", task.node_name});
  if (!options.interface.empty()) argv.insert(argv.end(), {"--interface", options.interface});
  return argv;
}

// The batch script's `shardline slurm ...`: the same command as a step, one task per node.
int StartStep(const SlurmTask& task, int argc, char** argv) {
  std::vector<std::string> args = {"srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                                   "--no-kill", SelfExecutable()};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> c_args;
  for (std::string& arg : args) c_args.push_back(arg.data());
  c_args.push_back(nullptr);
  std::cout << "shardline slurm: job " << task.job_id << " on " << task.node_list
            << ": starting one task per node with srun" << std::endl;
  execvp("srun", c_args.data());
  std::cerr << "error: cannot run srun (" << std::strerror(errno)
            << "): SLURM's client commands must be on PATH\n";
  return 1;
}

// Nodes after the first: an agent for the coordinator the first node publishes.
int RunFollowerNode(const SlurmOptions& options, const SlurmTask& task, const fs::path& dir) {
  const fs::path endpoint_file = dir / kEndpointFile;
  const auto deadline = std::chrono::steady_clock::now() + options.start_timeout;
  bool dir_seen = false;
  while (!fs::exists(endpoint_file)) {
    if (StopRequested().load()) return 143;
    if (fs::exists(dir / kFailureFile)) {
      std::cerr << "error: node " << task.node_name
                << ": the first node failed: " << ReadWholeFile(dir / kFailureFile) << "\n";
      return 1;
    }
    if (dir_seen && !fs::exists(dir)) {
      std::cerr << "error: node " << task.node_name << ": the first node gave up before "
                << "publishing the coordinator (its error is in the job's output)\n";
      return 1;
    }
    dir_seen = dir_seen || fs::exists(dir);
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "error: node " << task.node_name << ": the first node published no "
                << "coordinator endpoint in " << endpoint_file.string() << " within "
                << options.start_timeout.count() << " s (is " << dir.string()
                << " on a file system every node shares? else give --rendezvous-dir)\n";
      return 1;
    }
    std::this_thread::sleep_for(100ms);
  }
  const std::string endpoint = ReadWholeFile(endpoint_file);
  SpawnOptions agent;
  agent.argv = AgentArgv(options, task, endpoint, dir / "keys");
  auto pid = Spawn(agent);
  if (!pid.ok()) {
    std::cerr << "error: " << pid.status().message() << "\n";
    return 1;
  }
  // Until the first node ends the job (it removes the endpoint first), scancel, or the agent's
  // own end (it gives up on a coordinator it never reached).
  while (true) {
    auto exited = TryReap(*pid);
    if (exited.ok() && exited->has_value()) {
      // Killed, this node is lost to the job like any failed node: the coordinator re-plans
      // (an elastic job goes on) and the first node's exit code says how the job ended.
      if ((*exited)->signaled) {
        std::cerr << "node " << task.node_name << ": its agent was " << (*exited)->Describe()
                  << "; the coordinator counts the node as lost\n";
        return 0;
      }
      return (*exited)->code;
    }
    if (StopRequested().load()) {
      Terminate(*pid, 5s);
      return 143;
    }
    if (!fs::exists(endpoint_file)) {
      Terminate(*pid, 5s);
      return 0;
    }
    std::this_thread::sleep_for(100ms);
  }
}

// The child daemons of the first node, stopped by the destructor whatever happens.
class FirstNode {
 public:
  explicit FirstNode(fs::path dir) : dir_(std::move(dir)) {}
  ~FirstNode() {
    // The endpoint first: the other nodes stop their agents when it goes.
    std::error_code ec;
    fs::remove(dir_ / kEndpointFile, ec);
    if (agent_ > 0) Terminate(agent_, 5s);
    if (coordinator_ > 0) Terminate(coordinator_, 5s);
    fs::remove_all(dir_, ec);
  }

  absl::StatusOr<std::string> Start(const SlurmOptions& options, const SlurmTask& task) {
    ASSIGN_OR_RETURN(const std::vector<std::string> nodes, ExpandNodeList(task.node_list));
    ASSIGN_OR_RETURN(const protocol::AdvertisedAddress address, CoordinatorAddress(options, nodes));
    RETURN_IF_ERROR(protocol::MakeKeyDir((dir_ / "keys").string()));
    SpawnOptions coordinator;
    // Written under another name and renamed by this task once the coordinator listens: the
    // other nodes never see a half-made rendezvous.
    const fs::path written = dir_ / "coordinator.endpoint.written";
    // Flag and value on one line.
    // clang-format off
    coordinator.argv = {SelfExecutable(), "coordinator",
                        "--listen", nodes.size() < 2 ? "tcp://127.0.0.1:0" : "tcp://0.0.0.0:0",
                        "--advertise-address", address.address,
                        "--endpoint-file", written.string(),
                        "--state-dir", (dir_ / "state").string(),
                        "--keys", (dir_ / "keys").string(),
                        "--log-level", options.log_level};
    // clang-format on
    ASSIGN_OR_RETURN(coordinator_, Spawn(coordinator));
    // Its log is the job's output (inherited stderr).
    ASSIGN_OR_RETURN(const std::string endpoint,
                     AwaitCoordinatorEndpoint(coordinator_, written, 30s));
    spdlog::info("SLURM job {}: coordinator at {} ({}), {} node(s): {}", task.job_id, endpoint,
                 address.how, nodes.size(), fmt::join(nodes, ","));
    fs::rename(written, dir_ / kEndpointFile);
    SpawnOptions agent;
    agent.argv = AgentArgv(options, task, endpoint, dir_ / "keys");
    ASSIGN_OR_RETURN(agent_, Spawn(agent));
    return endpoint;
  }

  // Tells the other nodes, which wait for the endpoint, why it will not come.
  void Fail(const std::string& why) {
    std::ofstream(dir_ / kFailureFile) << why;
    // Long enough for their next look (every 100 ms) before the directory goes.
    std::this_thread::sleep_for(500ms);
  }

 private:
  fs::path dir_;
  pid_t coordinator_ = 0, agent_ = 0;
};

}  // namespace

int Slurm(const SlurmOptions& options, int argc, char** argv) {
  auto task = ReadSlurmTask([](const char* name) { return std::getenv(name); });
  if (!task.ok()) {
    std::cerr << "error: " << task.status().message() << "\n";
    return 1;
  }
  if (task->step_id.empty()) return StartStep(*task, argc, argv);
  InstallStopHandlers();
  const fs::path dir = RendezvousDir(options, *task);
  if (task->node_index != 0) return RunFollowerNode(options, *task, dir);

  if (fs::exists(dir)) {
    std::cerr << "error: the rendezvous directory " << dir.string()
              << " exists already (another `shardline slurm` in this step?)\n";
    return 1;
  }
  if (auto made = MakePrivateDir(dir); !made.ok()) {
    std::cerr << "error: " << made.message() << "\n";
    return 1;
  }
  FirstNode first(dir);
  absl::StatusOr<std::string> endpoint = first.Start(options, *task);
  if (!endpoint.ok()) {
    std::cerr << "error: " << endpoint.status().message() << "\n";
    first.Fail(std::string(endpoint.status().message()));
    return 1;
  }
  ClientOptions client;
  client.coordinator = *endpoint;
  client.curve.key_dir = (dir / "keys").string();
  client.timeout = 10s;
  SubmitOptions submit;
  submit.spec_path = options.spec_path;
  submit.wait = true;
  submit.wait_timeout = options.wait_timeout;
  return Submit(client, submit);
}

}  // namespace shardline::cli
