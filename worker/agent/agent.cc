#include "worker/agent/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "checkpoint/memory_step.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "protocol/address_rule.h"
#include "spdlog/spdlog.h"
#include "worker/actor/actor.h"
#include "worker/wire_observer.h"

namespace shardline::agent {
namespace {

using protocol::Str;
using Payload = wire::Envelope::Payload;
using SteadyTime = std::chrono::steady_clock::time_point;

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::string RandomInstanceId() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

// A process's state letter and kernel flags, from /proc/PID/stat; nullopt when it cannot be read.
struct ProcStat {
  char state = '?';
  unsigned long flags = 0;
};
std::optional<ProcStat> ReadProcStat(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  // "PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS ...": COMM may hold spaces and
  // parentheses, so read after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 1));
  ProcStat parsed;
  std::string skip;
  fields >> parsed.state >> skip >> skip >> skip >> skip >> skip >> parsed.flags;
  return parsed;
}

// Whether the process is in the stopped state ('T': SIGSTOP, job control).
bool ProcessStopped(pid_t pid) {
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  return stat && stat->state == 'T';
}

// Whether the process is exiting or about to: a zombie, the kernel's PF_EXITING flag (it is
// tearing down), or a SIGKILL pending. False when /proc cannot tell.
bool AlreadyDying(pid_t pid) {
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  if (!stat) return false;
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  if (stat->state == 'Z' || stat->state == 'X' || (stat->flags & kPfExiting) != 0) return true;
  std::string line;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  constexpr unsigned long long kSigkillBit = 1ull << (SIGKILL - 1);
  while (std::getline(status, line)) {
    if (line.rfind("SigPnd:", 0) == 0 || line.rfind("ShdPnd:", 0) == 0) {
      if ((std::strtoull(line.c_str() + 7, nullptr, 16) & kSigkillBit) != 0) return true;
    }
  }
  return false;
}

std::string DeviceArg(wire::Device::Reader device) {
  return std::string(device.getKind() == wire::DeviceKind::CUDA ? "cuda:" : "cpu:") +
         std::to_string(device.getIndex());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (options.node_id.empty()) options.node_id = Hostname();
  if (options.memory_store.empty()) {
    options.memory_store = "/dev/shm/shardline/" + options.cluster_id + "/" + options.node_id;
  }
  if (options.actor_binary.empty()) options.actor_binary = SelfExecutable();
  ASSIGN_OR_RETURN(auto devices, DiscoverDevices(options.devices));
  if (!options.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.log_dir, ec);
    if (ec) return absl::InvalidArgumentError("log dir " + options.log_dir + ": " + ec.message());
  }
  ASSIGN_OR_RETURN(auto metrics_server, monitoring::MetricsServer::Start(options.metrics_address));
  auto agent = std::unique_ptr<Agent>(
      new Agent(std::move(options), std::move(devices), std::move(metrics_server)));
  ASSIGN_OR_RETURN(
      const protocol::AdvertisedAddress advertised,
      protocol::ChooseAdvertisedAddress(agent->options_.advertise_address,
                                        agent->options_.interface, agent->options_.coordinator));
  agent->address_ = advertised.address;
  agent->interface_ = advertised.interface;
  agent->address_chosen_by_ = advertised.how;
  spdlog::info("node {} advertises {} ({})", agent->options_.node_id, advertised.address,
               advertised.how);
  ASSIGN_OR_RETURN(const auto curve,
                   protocol::ResolveClientCurve(agent->options_.curve, protocol::PeerRole::kNode));
  if (!curve) {
    spdlog::warn(
        "--insecure: this agent and its actors talk to {} without CURVE; anyone who "
        "reaches that port can impersonate this node",
        agent->options_.coordinator);
  }
  ASSIGN_OR_RETURN(agent->client_, protocol::RpcClient::Connect(
                                       agent->options_.coordinator, agent->options_.cluster_id,
                                       "agent/" + agent->options_.node_id,
                                       curve ? &*curve : nullptr, agent->wire_observer_.get()));
  return agent;
}

Agent::Agent(AgentOptions options, std::vector<LocalDevice> devices,
             std::unique_ptr<monitoring::MetricsServer> metrics_server)
    : options_(std::move(options)),
      devices_(std::move(devices)),
      instance_id_(RandomInstanceId()),
      metrics_server_(std::move(metrics_server)),
      wire_metrics_(metrics_server_->registry(),
                    {{"component", "agent"}, {"node", options_.node_id}}),
      metrics_(metrics_server_->registry(), {{"component", "agent"}, {"node", options_.node_id}}),
      wire_observer_(std::make_unique<worker::MeteredWire>(wire_metrics_)) {}

Agent::~Agent() { KillActors("", 0); }

absl::Status Agent::SendRegistration() {
  auto message = client_->NewMessage();
  auto request = message->payload().initRegisterNode();
  request.setNodeId(options_.node_id);
  request.setInstanceId(instance_id_);
  request.setHostname(Hostname());
  request.setAddress(address_);
  request.setMetricsAddress(metrics_server_->address());
  request.setPid(static_cast<uint32_t>(getpid()));
  request.setAddressChosenBy(address_chosen_by_);
  auto list = request.initDevices(static_cast<unsigned>(devices_.size()));
  for (size_t i = 0; i < devices_.size(); ++i) {
    list[i].setKind(devices_[i].kind);
    list[i].setIndex(static_cast<uint32_t>(devices_[i].index));
    list[i].setMemoryBytes(devices_[i].memory_bytes);
    list[i].setName(devices_[i].name);
  }
  ASSIGN_OR_RETURN(register_request_, client_->Send(*message));
  register_sent_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status Agent::Run(const std::atomic<bool>& stop) {
  spdlog::info("agent for node {} ({} devices) connecting to {}, metrics on {}", options_.node_id,
               devices_.size(), options_.coordinator, metrics_server_->address());
  const SteadyTime started = std::chrono::steady_clock::now();
  constexpr auto kRegisterRetry = std::chrono::seconds(1);
  while (!stop.load() && !shutdown_requested_) {
    const SteadyTime now = std::chrono::steady_clock::now();
    if (!registered_) {
      // A refused handshake (no key, a key not on the allowlist) is retried by ZeroMQ, and
      // passes once the key is added and the coordinator reloads its allowlist.
      if (client_->handshake_failure() != logged_handshake_failure_) {
        logged_handshake_failure_ = client_->handshake_failure();
        if (!logged_handshake_failure_.empty()) spdlog::warn("{}", logged_handshake_failure_);
      }
      if (!ever_registered_ && now - started > options_.connect_timeout) {
        if (!last_refusal_.empty()) return absl::AlreadyExistsError(last_refusal_);
        if (!client_->handshake_failure().empty()) {
          return absl::UnauthenticatedError("could not register node " + options_.node_id + ": " +
                                            client_->handshake_failure());
        }
        return absl::DeadlineExceededError(
            "could not register node " + options_.node_id + " with the coordinator at " +
            options_.coordinator + " within " +
            std::to_string(options_.connect_timeout.count()) +
            " ms (is it running and reachable?)");
      }
      if (register_request_ == 0 || now - register_sent_ > kRegisterRetry) {
        RETURN_IF_ERROR(SendRegistration());
      }
    } else {
      if (now - last_ack_ > heartbeat_timeout_) {
        spdlog::error("coordinator silent for {} ms: killing {} actors and registering again",
                      std::chrono::duration_cast<std::chrono::milliseconds>(now - last_ack_).count(),
                      children_.size());
        metrics_.OnCoordinatorLost();
        KillActors("", 0);
        registered_ = false;
        register_request_ = 0;
      } else if (now >= next_heartbeat_) {
        auto message = client_->NewMessage();
        auto heartbeat = message->payload().initHeartbeat();
        heartbeat.setNodeId(options_.node_id);
        heartbeat.setInstanceId(instance_id_);
        heartbeat.setRunningActors(static_cast<uint32_t>(children_.size()));
        // Stopped actors (SIGSTOP, a debugger) are alive but make no progress: say which, so
        // that the coordinator's hang watchdog names them rather than the ranks waiting on them.
        std::vector<const Child*> stopped;
        for (const auto& [pid, child] : children_) {
          if (ProcessStopped(pid)) stopped.push_back(&child);
        }
        auto list = heartbeat.initStoppedActors(static_cast<unsigned>(stopped.size()));
        for (size_t i = 0; i < stopped.size(); ++i) {
          list[static_cast<unsigned>(i)].setJobId(stopped[i]->job_id);
          list[static_cast<unsigned>(i)].setGeneration(stopped[i]->generation);
          list[static_cast<unsigned>(i)].setRank(stopped[i]->rank);
        }
        auto sent = client_->Send(*message);
        if (sent.ok()) metrics_.OnHeartbeatSent();
        next_heartbeat_ = now + heartbeat_interval_;
      }
    }
    auto message = client_->NextMessage(std::chrono::milliseconds(20));
    if (!message.ok()) {
      spdlog::error("receive: {}", ToString(message.status().message()));
    } else if (*message) {
      RETURN_IF_ERROR(Handle(**message));
    }
    ReapActors();
  }
  KillActors("", 0);
  ReapActors();
  spdlog::info("agent for node {} stopped", options_.node_id);
  return absl::OkStatus();
}

absl::Status Agent::Handle(const protocol::Message& message) {
  const auto payload = message.envelope().getPayload();
  const auto now = std::chrono::steady_clock::now();
  switch (payload.which()) {
    case Payload::REGISTER_NODE_REPLY: {
      if (message.request_id() != register_request_) return absl::OkStatus();
      const auto reply = payload.getRegisterNodeReply();
      heartbeat_interval_ = std::chrono::milliseconds(reply.getHeartbeatIntervalMs());
      heartbeat_timeout_ = std::chrono::milliseconds(reply.getHeartbeatTimeoutMs());
      registered_ = ever_registered_ = true;
      last_ack_ = now;
      const std::string instance = Str(reply.getCoordinatorInstance());
      if (!coordinator_instance_.empty() && instance != coordinator_instance_ &&
          !children_.empty()) {
        spdlog::warn("the coordinator restarted (instance {} -> {}): killing the {} actors of its "
                     "generations",
                     coordinator_instance_, instance, children_.size());
        KillActors("", 0);
      }
      coordinator_instance_ = instance;
      next_heartbeat_ = now + heartbeat_interval_;
      spdlog::info("registered node {} (heartbeat every {} ms, timeout {} ms)", options_.node_id,
                   heartbeat_interval_.count(), heartbeat_timeout_.count());
      return absl::OkStatus();
    }
    case Payload::ERROR: {
      const absl::Status error = protocol::ErrorToStatus(payload.getError());
      if (message.request_id() == register_request_ && !registered_) {
        // Refused: another live agent holds this node id, or our devices are bad. An agent
        // restarted after a crash is refused until its old entry times out, so keep trying
        // until the connect timeout and then give the coordinator's reason.
        last_refusal_ = "the coordinator refused node " + options_.node_id + ": " +
                        ToString(error.message());
        spdlog::warn("{}", last_refusal_);
        if (error.code() == absl::StatusCode::kInvalidArgument ||
            error.code() == absl::StatusCode::kPermissionDenied) {
          return absl::Status(error.code(), last_refusal_);
        }
        return absl::OkStatus();
      }
      if (error.code() == absl::StatusCode::kNotFound && registered_) {
        spdlog::warn("coordinator no longer knows this node ({}): registering again",
                     ToString(error.message()));
        registered_ = false;
        register_request_ = 0;
      } else {
        spdlog::warn("coordinator answered: {}", ToString(error.message()));
      }
      return absl::OkStatus();
    }
    case Payload::ACK:
      last_ack_ = now;
      return absl::OkStatus();
    case Payload::SPAWN_ACTORS:
      last_ack_ = now;
      SpawnActors(payload.getSpawnActors());
      return absl::OkStatus();
    case Payload::ABORT_GENERATION: {
      const auto abort = payload.getAbortGeneration();
      spdlog::info("aborting job {} generation {}: {}", Str(abort.getJobId()),
                   abort.getGeneration(), Str(abort.getReason()));
      // Children that died already (the fault itself, often) are reported as they died, not
      // as killed by this abort.
      ReapActors();
      KillActors(Str(abort.getJobId()), abort.getGeneration(), Grace::kAsSpawned);
      if (abort.getJobEnded()) {
        ended_jobs_.insert(Str(abort.getJobId()));
        DropEndedJobsMemory();
      }
      return absl::OkStatus();
    }
    case Payload::SHUTDOWN:
      spdlog::info("shutdown requested: {}", Str(payload.getShutdown().getReason()));
      shutdown_requested_ = true;
      return absl::OkStatus();
    default:
      spdlog::warn("ignoring unexpected {} from the coordinator",
                   protocol::PayloadName(payload.which()));
      return absl::OkStatus();
  }
}

int Agent::ThreadsPerActor() const {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int devices = std::max<int>(1, static_cast<int>(devices_.size()));
  return std::max(1, cores / devices);
}

void Agent::SpawnActors(wire::SpawnActors::Reader request) {
  const std::string job_id = Str(request.getJobId());
  const uint32_t generation = request.getGeneration();
  for (auto actor : request.getActors()) {
    SpawnOptions spawn;
    // Flag and value on one line.
    // clang-format off
    spawn.argv = {options_.actor_binary, "actor",
                  "--coordinator", options_.coordinator,
                  "--cluster-id", options_.cluster_id,
                  "--job", job_id,
                  "--generation", std::to_string(generation),
                  "--rank", std::to_string(actor.getRank()),
                  "--node-id", options_.node_id,
                  "--device", DeviceArg(actor.getDevice()),
                  "--log-level", options_.log_level,
                  "--metrics", options_.actor_metrics_host + ":0",
                  "--advertise-address", address_,
                  "--memory-store", options_.memory_store};
    // clang-format on
    for (std::string& flag : options_.curve.Flags()) spawn.argv.push_back(std::move(flag));
    // The node's cores are shared by its CPU actors: each gets its share of threads for OpenMP
    // and OpenBLAS, as torchrun sets OMP_NUM_THREADS. Unshared, four actors on two cores run
    // eight busy threads and every collective waits for a descheduled peer. A value the agent
    // was started with wins.
    // The actor's secret through its environment (owner-readable), not its command line (world-
    // readable in /proc).
    spawn.extra_env.emplace_back(actor::kActorTokenEnv,
                                 absl::BytesToHexString(Str(actor.getToken())));
    const std::string threads = std::to_string(ThreadsPerActor());
    for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
      if (std::getenv(name) == nullptr) spawn.extra_env.emplace_back(name, threads);
    }
    // NCCL's bootstrap and data sockets on the node's advertised interface ('=': exactly that
    // name, not a prefix), so that nobody sets NCCL_SOCKET_IFNAME by hand; a value the agent was
    // started with wins.
    if (!interface_.empty() && std::getenv("NCCL_SOCKET_IFNAME") == nullptr) {
      spawn.extra_env.emplace_back("NCCL_SOCKET_IFNAME", "=" + interface_);
    }
    if (!options_.log_dir.empty()) {
      spawn.log_path = (std::filesystem::path(options_.log_dir) /
                        (job_id + ".g" + std::to_string(generation) + ".rank" +
                         std::to_string(actor.getRank()) + ".log"))
                           .string();
    }
    Child child{job_id, generation, actor.getRank()};
    child.stop_grace = std::chrono::milliseconds(actor.getStopGraceMs());
    auto pid = Spawn(spawn);
    if (!pid.ok()) {
      spdlog::error("spawning rank {} of {}: {}", actor.getRank(), job_id,
                    ToString(pid.status().message()));
      ReportExit(0, child, "could not be spawned: " + ToString(pid.status().message()), false, 127,
                 false);
      continue;
    }
    spdlog::info("spawned rank {} of job {} generation {} as pid {}", actor.getRank(), job_id,
                 generation, *pid);
    children_[*pid] = child;
  }
  metrics_.SetActorsRunning(static_cast<int64_t>(children_.size()));
}

void Agent::KillActors(const std::string& job_id, uint32_t generation, Grace grace) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [pid, child] : children_) {
    if (!job_id.empty() && child.job_id != job_id) continue;
    if (generation != 0 && child.generation != generation) continue;
    // SIGKILL, at once: an aborted actor may be stopped or blocked in a collective that would
    // wait out its timeout, and it has nothing to save (what is committed is on disk; a save in
    // flight belongs to the aborted generation and is never committed). The abort is bounded by
    // the agent's loop (it reaps every 20 ms) and the kernel's kill.
    //
    // Not SIGTERM with Communicator::Abort first and SIGKILL after a grace: Abort cannot wake a
    // wait inside Gloo's own collectives (on scratch buffers Gloo allocates), and a broken Gloo
    // context can block its destructor. Tried with a 500 ms grace: after kill -9 of one rank of
    // four, the three survivors aborted their communicators; the one whose collective had failed
    // already exited, the other two were still blocked when the grace ran out (the abort took
    // 0.53 s, against 0.02 s this way).
    //
    // The exception is an actor spawned with a stop grace (a serve job's leader): it answers its
    // open requests before it goes, and gets SIGKILL only if it outlives the grace.
    //
    // One that is dying already died of something else (often the very fault that set off the
    // abort: a killed rank's sockets close before it is a zombie, so its peers report first).
    const bool dying = AlreadyDying(pid);
    if (grace == Grace::kAsSpawned && child.stop_grace.count() > 0 && !child.sigkill_at) {
      ::kill(pid, SIGTERM);
      child.sigkill_at = now + child.stop_grace;
    } else {
      ::kill(pid, SIGKILL);
    }
    if (!dying) child.killed = true;
  }
}

void Agent::ReapActors() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [pid, child] : children_) {
    if (child.sigkill_at && now >= *child.sigkill_at) ::kill(pid, SIGKILL);
  }
  for (auto it = children_.begin(); it != children_.end();) {
    auto reaped = TryReap(it->first);
    if (!reaped.ok() || !reaped->has_value()) {
      ++it;
      continue;
    }
    const ExitStatus status = **reaped;
    spdlog::info("rank {} of job {} (pid {}) {}", it->second.rank, it->second.job_id, it->first,
                 status.Describe());
    metrics_.OnActorExit(status);
    ReportExit(it->first, it->second, status.Describe(), status.signaled, status.code,
               it->second.killed);
    it = children_.erase(it);
    metrics_.SetActorsRunning(static_cast<int64_t>(children_.size()));
  }
  DropEndedJobsMemory();
}

void Agent::DropEndedJobsMemory() {
  for (auto job = ended_jobs_.begin(); job != ended_jobs_.end();) {
    const bool running = std::any_of(children_.begin(), children_.end(), [&](const auto& child) {
      return child.second.job_id == *job;
    });
    if (running) {  // a killed actor may still be writing: once it is reaped
      ++job;
      continue;
    }
    // Job ids are the coordinator's "NAME-N" (checkpoint::MemoryJobDir refuses others).
    if (const auto dir = checkpoint::MemoryJobDir(options_.memory_store, *job); dir.ok()) {
      std::error_code error;
      std::filesystem::remove_all(*dir, error);
      if (error) spdlog::warn("removing {}: {}", *dir, error.message());
    }
    job = ended_jobs_.erase(job);
  }
}

void Agent::ReportExit(pid_t pid, const Child& child, const std::string& description,
                       bool signaled, int code, bool killed_by_agent) {
  auto message = client_->NewMessage();
  auto report = message->payload().initActorExited();
  report.setJobId(child.job_id);
  report.setGeneration(child.generation);
  report.setRank(child.rank);
  report.setPid(static_cast<uint32_t>(pid));
  report.setSignaled(signaled);
  report.setCode(code);
  report.setDescription(description);
  report.setKilledByAgent(killed_by_agent);
  auto sent = client_->Send(*message);
  if (!sent.ok()) spdlog::warn("reporting an exit: {}", ToString(sent.status().message()));
}

}  // namespace shardline::agent
