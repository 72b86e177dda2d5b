#include "coordinator/coordinator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include <kj/exception.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "coordinator/bootstrap_tracker.h"
#include "coordinator/checkpoint_tracker.h"
#include "coordinator/layout_wire.h"
#include "coordinator/progress.h"
#include "coordinator/status_view.h"
#include "placement/checkpoint_state.h"
#include "placement/parallel_layout.h"
#include "spdlog/spdlog.h"

namespace shardline::coordinator {
namespace {

// The shape of a serve job's checkpoint as the memory model reads it, from its headers.
absl::StatusOr<model::ModelConfig> ReadServeModel(const placement::ServeSpec& serve) {
  auto config = checkpoint::ReadCheckpointConfig(serve.checkpoint, serve.hf_heads);
  if (!config.ok()) return Annotate(config.status(), "the serve job's checkpoint");
  RETURN_IF_ERROR(Annotate(config->EngineSupports(), "the serve job's checkpoint"));
  return config;
}

using protocol::Str;
using Payload = wire::Envelope::Payload;

constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kGaugeInterval = std::chrono::milliseconds(250);
constexpr std::chrono::milliseconds kMaxKvWait = std::chrono::minutes(10);
// How long an aborted serve job's leader has between its agent's SIGTERM and SIGKILL: it fails
// its open requests with a 503 naming the cause (milliseconds) and exits. Without it the agent's
// SIGKILL could come before that 503 was written, and the client saw a reset connection.
constexpr uint32_t kServeLeaderStopGraceMs = 500;
// Sizes and offsets from the wire stay below this, so sums of two never overflow an int64.
constexpr uint64_t kMaxDimension = uint64_t{1} << 62;

std::string Text(absl::string_view s) { return ToString(s); }

capnp::Text::Reader CapText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

double SecondsBetween(TimePoint a, TimePoint b) { return Seconds(b - a); }

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 const Clock* clock) {
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat timeout (" +
                                      std::to_string(options.heartbeat_timeout.count()) +
                                      " ms) must exceed the heartbeat interval (" +
                                      std::to_string(options.heartbeat_interval.count()) + " ms)");
  }
  if (!options.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(options.state_dir) / "jobs", ec);
    if (ec) {
      return absl::InvalidArgumentError("state dir " + options.state_dir +
                                        " cannot be created: " + ec.message());
    }
  }
  // One coordinator per state dir: a second one would supervise the same jobs twice.
  int lock_fd = -1;
  if (!options.state_dir.empty()) {
    const std::string lock_path = (std::filesystem::path(options.state_dir) / "lock").string();
    lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0) {
      return absl::InvalidArgumentError("state dir " + options.state_dir + ": cannot open " +
                                        lock_path + ": " + strerror(errno));
    }
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      std::string holder(32, '\0');
      const ssize_t n = ::pread(lock_fd, holder.data(), holder.size() - 1, 0);
      holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
      ::close(lock_fd);
      return absl::FailedPreconditionError(
          "state dir " + options.state_dir + " is in use by another coordinator" +
          (holder.empty() ? std::string() : " (pid " + holder + ")") +
          "; stop it first, or give this one another --state-dir");
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(lock_fd, 0) != 0 ||
        ::pwrite(lock_fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      spdlog::warn("could not write the pid into {}", lock_path);
    }
  }
  auto close_lock = [&lock_fd] {
    if (lock_fd >= 0) ::close(lock_fd);
    lock_fd = -1;
  };
  auto curve = protocol::ResolveServerCurve(options.curve);
  if (!curve.ok()) {
    close_lock();
    return curve.status();
  }
  auto metrics_server = monitoring::MetricsServer::Start(options.metrics_address);
  if (!metrics_server.ok()) {
    close_lock();
    return metrics_server.status();
  }
  auto coordinator = std::unique_ptr<Coordinator>(
      new Coordinator(std::move(options), clock, std::move(*metrics_server)));
  coordinator->state_dir_lock_fd_ = lock_fd;  // closed by the destructor from here on
  if (curve->has_value()) {
    (*curve)->observer = &coordinator->auth_counter_;
    coordinator->allowlist_ = (*curve)->allowlist;
  }
  ASSIGN_OR_RETURN(coordinator->channel_,
                   protocol::Channel::Bind(coordinator->options_.listen,
                                           curve->has_value() ? &**curve : nullptr));
  if (coordinator->allowlist_) {
    spdlog::info("CURVE on: coordinator key {}, allowlist {}", (*curve)->keys.public_key,
                 coordinator->allowlist_->file().string());
  } else {
    spdlog::warn(
        "--insecure: CURVE is OFF. Anyone who reaches {} can register a node, submit a "
        "job that runs programs on every agent's host, and read every job's store",
        coordinator->channel_->endpoint());
  }
  RETURN_IF_ERROR(coordinator->LoadHistory());
  return coordinator;
}

Coordinator::Coordinator(CoordinatorOptions options, const Clock* clock,
                         std::unique_ptr<monitoring::MetricsServer> metrics_server)
    : options_(std::move(options)),
      clock_(clock),
      started_(clock->Now()),
      metrics_server_(std::move(metrics_server)),
      wire_metrics_(metrics_server_->registry(), {{"component", "coordinator"}}),
      metrics_(metrics_server_->registry(), {{"component", "coordinator"}}),
      membership_(options_.heartbeat_timeout),
      scheduler_(membership_, calibration_, options_.cluster_id),
      supervisor_(options_.abort_grace),
      history_(options_.state_dir) {
  std::random_device random;
  char id[17];
  snprintf(id, sizeof(id), "%08x%08x", random(), random());
  instance_id_ = id;
}

Coordinator::~Coordinator() {
  channel_.reset();
  if (state_dir_lock_fd_ >= 0) ::close(state_dir_lock_fd_);
}

absl::Status Coordinator::Run(const std::atomic<bool>& stop, std::atomic<bool>* reload_allowlist) {
  spdlog::info("coordinator of cluster '{}' listening on {}, metrics on {}", options_.cluster_id,
               endpoint(), metrics_server_->address());
  while (!stop.load()) {
    auto frame = channel_->Receive(kPollInterval);
    if (!frame.ok()) {
      spdlog::error("receive failed: {}", Text(frame.status().message()));
    } else if (frame->has_value()) {
      HandleFrame(**frame);
      // Drain what is queued before the periodic work, but keep that work on time under load.
      for (int i = 0; i < 256; ++i) {
        auto more = channel_->Receive(std::chrono::milliseconds(0));
        if (!more.ok() || !more->has_value()) break;
        HandleFrame(**more);
      }
    }
    if (reload_allowlist != nullptr && reload_allowlist->exchange(false)) ReloadAllowlist();
    const TimePoint now = clock_->Now();
    auto dead = membership_.ExpireSilentNodes(now);
    if (!dead.empty()) OnNodesDead(dead);
    for (const auto& get : kv_.ExpireParked(now)) {
      metrics_.OnKvOperation("wait_timeout");
      ReplyError(get.peer, get.request_id,
                 absl::DeadlineExceededError("key '" + get.key + "' was not set in time"));
    }
    Supervise();
    background_.RunFinished();
    TryStartPendingJobs();
    if (now - last_gauge_update_ >= kGaugeInterval) {
      UpdateGauges();
      last_gauge_update_ = now;
    }
  }
  for (auto& [id, job] : jobs_) {
    if (job.state == JobState::kRunning) EndJob(job, JobState::kFailed, "coordinator shut down");
  }
  if (state_dir_lock_fd_ >= 0) {
    ::close(state_dir_lock_fd_);
    state_dir_lock_fd_ = -1;
  }
  spdlog::info("coordinator stopped");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The wire

void Coordinator::HandleFrame(protocol::Frame& frame) {
  auto decoded = protocol::Decode(frame.bytes.data(), frame.bytes.size(), options_.cluster_id);
  if (!decoded.ok()) {
    wire_metrics_.OnDecodeError(protocol::DecodeFailureName(decoded.failure));
    spdlog::debug("refused a frame: {}", Text(decoded.status.message()));
    ReplyError(frame.peer, decoded.request_id, decoded.status);
    return;
  }
  const auto& message = *decoded.message;
  wire_metrics_.OnReceived(protocol::PayloadName(message.which()));
  if (auto status = CheckActorToken(message); !status.ok()) {
    metrics_.OnAuthRefused("token");
    spdlog::debug("refused {} from {}: {}", protocol::PayloadName(message.which()),
                  Str(message.envelope().getSender()), Text(status.message()));
    ReplyError(frame.peer, message.request_id(), status);
    return;
  }
  if (allowlist_) {
    if (auto status = Authorize(frame.user_id, message.which()); !status.ok()) {
      spdlog::debug("refused {} from {}: {}", protocol::PayloadName(message.which()),
                    Str(message.envelope().getSender()), Text(status.message()));
      ReplyError(frame.peer, message.request_id(), status);
      return;
    }
    if (auto status = CheckNodeKey(frame.user_id, message); !status.ok()) {
      metrics_.OnAuthRefused("node_key");
      spdlog::debug("refused {} from {}: {}", protocol::PayloadName(message.which()),
                    Str(message.envelope().getSender()), Text(status.message()));
      ReplyError(frame.peer, message.request_id(), status);
      return;
    }
  }
  try {
    Dispatch(frame.peer, message);
  } catch (const kj::Exception& e) {
    // A message that passed the structural check can still hold e.g. an unterminated text.
    wire_metrics_.OnDecodeError("garbage");
    ReplyError(frame.peer, message.request_id(),
               absl::InvalidArgumentError(std::string("malformed ") +
                                          std::string(protocol::PayloadName(message.which())) +
                                          ": " + e.getDescription().cStr()));
  }
}

void Coordinator::Dispatch(const std::string& peer, const protocol::Message& message) {
  const auto payload = message.envelope().getPayload();
  const uint64_t id = message.request_id();
  absl::Status status;
  switch (payload.which()) {
    case Payload::REGISTER_NODE: status = OnRegisterNode(peer, id, payload.getRegisterNode()); break;
    case Payload::HEARTBEAT: status = OnHeartbeat(peer, id, payload.getHeartbeat()); break;
    case Payload::SUBMIT_JOB: status = OnSubmitJob(peer, id, payload.getSubmitJob()); break;
    case Payload::STATUS_REQUEST:
      status = OnStatusRequest(peer, id, payload.getStatusRequest());
      break;
    case Payload::CANCEL_JOB: status = OnCancelJob(peer, id, payload.getCancelJob()); break;
    case Payload::ACTOR_EXITED: status = OnActorExited(peer, id, payload.getActorExited()); break;
    case Payload::REGISTER_ACTOR:
      status = OnRegisterActor(peer, id, payload.getRegisterActor());
      break;
    case Payload::KV_REQUEST:
      status = OnKvRequest(peer, id, Str(message.envelope().getSender()), payload.getKvRequest());
      break;
    case Payload::COMM_JOIN: status = OnCommJoin(peer, id, payload.getCommJoin()); break;
    case Payload::COMM_READY: status = OnCommReady(peer, id, payload.getCommReady()); break;
    case Payload::COMM_FAILED: status = OnCommFailed(peer, id, payload.getCommFailed()); break;
    case Payload::STEP_REPORT: status = OnStepReport(peer, id, payload.getStepReport()); break;
    case Payload::ACTOR_DONE: status = OnActorDone(peer, id, payload.getActorDone()); break;
    case Payload::SHARD_SAVED: status = OnShardSaved(peer, id, payload.getShardSaved()); break;
    case Payload::CALIBRATION:
      status = OnCalibration(peer, id, payload.getCalibration());
      break;
    case Payload::ERROR:
    case Payload::ACK:
      return;  // peers answer our pushes; nothing waits for those answers
    default:
      wire_metrics_.OnDecodeError("unexpected");
      status = absl::InvalidArgumentError("the coordinator does not accept " +
                                          std::string(protocol::PayloadName(payload.which())) +
                                          " messages");
  }
  if (!status.ok()) {
    spdlog::warn("{} from {}: {}", protocol::PayloadName(payload.which()),
                 Str(message.envelope().getSender()), Text(status.message()));
    ReplyError(peer, id, status);
  }
}

namespace {

// The job, generation and rank an actor's message speaks for; nullopt for other messages.
struct ActorClaim {
  std::string job_id;
  uint32_t generation = 0;
  uint32_t rank = 0;
};

template <typename Reader>
ActorClaim ClaimOf(Reader payload) {
  return {Str(payload.getJobId()), payload.getGeneration(), payload.getRank()};
}

std::optional<ActorClaim> ActorClaimOf(const protocol::Message& message) {
  const auto payload = message.envelope().getPayload();
  switch (payload.which()) {
    case Payload::REGISTER_ACTOR: return ClaimOf(payload.getRegisterActor());
    case Payload::COMM_JOIN: return ClaimOf(payload.getCommJoin());
    case Payload::COMM_READY: return ClaimOf(payload.getCommReady());
    case Payload::COMM_FAILED: return ClaimOf(payload.getCommFailed());
    case Payload::STEP_REPORT: return ClaimOf(payload.getStepReport());
    case Payload::ACTOR_DONE: return ClaimOf(payload.getActorDone());
    case Payload::SHARD_SAVED: return ClaimOf(payload.getShardSaved());
    case Payload::CALIBRATION: return ClaimOf(payload.getCalibration());
    case Payload::KV_REQUEST: {
      // The store's job namespaces are an actor's, named by its sender "actor/JOB/GEN/RANK".
      const std::string sender = Str(message.envelope().getSender());
      const std::vector<std::string> parts = absl::StrSplit(sender, '/');
      uint32_t generation = 0, rank = 0;
      if (parts.size() == 4 && parts[0] == "actor" && absl::SimpleAtoi(parts[2], &generation) &&
          absl::SimpleAtoi(parts[3], &rank)) {
        return ActorClaim{parts[1], generation, rank};
      }
      const std::string key = Str(payload.getKvRequest().getKey());
      if (key.rfind("job/", 0) == 0) return ActorClaim{};  // not an actor: refused below
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

}  // namespace

std::string Coordinator::NewActorToken() {
  std::string token(16, '\0');
  size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t n = ::getrandom(token.data() + filled, token.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return token;
}

absl::Status Coordinator::CheckActorToken(const protocol::Message& message) {
  const auto claim = ActorClaimOf(message);
  if (!claim) return absl::OkStatus();
  if (claim->job_id.empty()) {
    return absl::PermissionDeniedError(
        "kv: the store's job/ keys belong to the jobs' actors; " +
        Str(message.envelope().getSender()) + " is not one");
  }
  const std::string who = "rank " + std::to_string(claim->rank) + " of job " + claim->job_id +
                          " generation " + std::to_string(claim->generation);
  auto job = jobs_.find(claim->job_id);
  const std::vector<std::string>* tokens = nullptr;
  if (job != jobs_.end()) {
    auto it = job->second.actor_tokens.find(claim->generation);
    if (it != job->second.actor_tokens.end()) tokens = &it->second;
  }
  if (tokens == nullptr || claim->rank >= tokens->size()) {
    return absl::PermissionDeniedError("no actor token was given for " + who +
                                       " (a generation this coordinator did not spawn)");
  }
  const auto given = message.envelope().getActorToken();
  const std::string& expected = (*tokens)[claim->rank];
  // Constant time: the comparison must not tell a guesser how many bytes were right.
  unsigned char differ = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size() && i < given.size(); ++i) {
    differ |= static_cast<unsigned char>(given[i] ^ static_cast<unsigned char>(expected[i]));
  }
  if (differ != 0) {
    return absl::PermissionDeniedError("the actor token does not match " + who +
                                       " (another rank's, or another generation's)");
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Authorize(const std::string& user_id,
                                    wire::Envelope::Payload::Which payload) {
  const auto entry = allowlist_->Find(user_id);
  if (!entry) {
    metrics_.OnAuthRefused("removed_key");
    return absl::UnauthenticatedError("CURVE key " + user_id +
                                      " is no longer on the coordinator's allowlist");
  }
  const bool client_message = payload == Payload::SUBMIT_JOB || payload == Payload::CANCEL_JOB ||
                              payload == Payload::STATUS_REQUEST;
  const bool node_message = !client_message || payload == Payload::STATUS_REQUEST;
  const bool allowed = entry->role == protocol::PeerRole::kClient ? client_message : node_message;
  if (allowed) return absl::OkStatus();
  metrics_.OnAuthRefused("role");
  return absl::PermissionDeniedError(
      "key '" + entry->name + "' has role " + std::string(protocol::PeerRoleName(entry->role)) +
      ", which may not send " + std::string(protocol::PayloadName(payload)) +
      (entry->role == protocol::PeerRole::kClient
           ? " (a client key submits, cancels and reads; nodes register with a node key)"
           : " (a node key registers nodes and runs actors; jobs are submitted with a client "
             "key)"));
}

absl::Status Coordinator::CheckNodeKey(const std::string& user_id,
                                       const protocol::Message& message) {
  const auto payload = message.envelope().getPayload();
  std::string node_id;
  switch (payload.which()) {
    case Payload::REGISTER_NODE: node_id = Str(payload.getRegisterNode().getNodeId()); break;
    case Payload::HEARTBEAT: node_id = Str(payload.getHeartbeat().getNodeId()); break;
    case Payload::ACTOR_EXITED: {
      // Names no node: the actor's node is the one this coordinator placed it on.
      const auto report = payload.getActorExited();
      auto job = jobs_.find(Str(report.getJobId()));
      if (job == jobs_.end() || report.getRank() >= job->second.actors.size()) {
        return absl::OkStatus();
      }
      node_id = job->second.actors[report.getRank()].node_id;
      break;
    }
    default: return absl::OkStatus();
  }
  auto pinned = node_keys_.find(node_id);
  if (pinned != node_keys_.end() && pinned->second == user_id) return absl::OkStatus();
  const auto holder = pinned == node_keys_.end() ? std::nullopt : allowlist_->Find(pinned->second);
  if (payload.which() == Payload::REGISTER_NODE && !holder) {
    node_keys_[node_id] = user_id;  // a new node id, or one whose key has left the allowlist
    return absl::OkStatus();
  }
  const auto sender = allowlist_->Find(user_id);
  const std::string sender_name = sender ? sender->name : user_id;
  if (!holder) {
    return absl::PermissionDeniedError("key '" + sender_name + "' may not send " +
                                       std::string(protocol::PayloadName(payload.which())) +
                                       " for node " + node_id + ", which it did not register");
  }
  return absl::PermissionDeniedError(
      "node " + node_id + " belongs to key '" + holder->name + "', which registered it; key '" +
      sender_name + "' may not register it or speak for it (give each host its own node id and " +
      "key: shardline keygen --name NAME --role node; to hand the id over, take '" +
      holder->name + "' off the allowlist and send the coordinator SIGHUP)");
}

void Coordinator::ReloadAllowlist() {
  if (!allowlist_) {
    spdlog::warn("SIGHUP: no allowlist to reload (--insecure)");
    return;
  }
  auto change = allowlist_->Reload();
  if (!change.ok()) {
    spdlog::error("SIGHUP: kept the old allowlist: {}", Text(change.status().message()));
    return;
  }
  spdlog::info("SIGHUP: reloaded {}: {} keys ({} added, {} removed)", allowlist_->file().string(),
               change->keys, change->added, change->removed);
}

std::unique_ptr<protocol::Outgoing> Coordinator::NewMessage(uint64_t request_id) {
  return std::make_unique<protocol::Outgoing>(options_.cluster_id, "coordinator", request_id);
}

void Coordinator::Send(const std::string& peer, protocol::Outgoing& message) {
  wire_metrics_.OnSent(protocol::PayloadName(message.envelope().getPayload().which()));
  auto status = channel_->Send(message, peer);
  if (!status.ok()) spdlog::debug("send failed: {}", Text(status.message()));
}

void Coordinator::ReplyError(const std::string& peer, uint64_t request_id,
                             const absl::Status& status) {
  auto reply = NewMessage(request_id);
  protocol::SetError(reply->payload(), status);
  Send(peer, *reply);
}

void Coordinator::ReplyAck(const std::string& peer, uint64_t request_id) {
  if (request_id == 0) return;
  auto reply = NewMessage(request_id);
  reply->payload().setAck();
  Send(peer, *reply);
}

// ---------------------------------------------------------------------------------------------
// Membership

absl::Status Coordinator::OnRegisterNode(const std::string& peer, uint64_t request_id,
                                         wire::RegisterNode::Reader request) {
  NodeInfo node;
  node.node_id = Str(request.getNodeId());
  node.instance_id = Str(request.getInstanceId());
  node.hostname = Str(request.getHostname());
  node.address = Str(request.getAddress());
  node.address_chosen_by = Str(request.getAddressChosenBy());
  node.metrics_address = Str(request.getMetricsAddress());
  node.pid = request.getPid();
  node.peer = peer;
  for (auto device : request.getDevices()) node.devices.push_back(ReadDevice(device));
  ASSIGN_OR_RETURN(const Membership::Rejoin rejoin, membership_.Register(node, clock_->Now()));
  switch (rejoin) {
    case Membership::Rejoin::kAgentRestarted:
      // A restarted agent has lost the actors it had: jobs that ran there cannot go on.
      spdlog::warn("node {} came back as a new agent (instance {})", node.node_id,
                   node.instance_id);
      FailJobsOnNode(node.node_id, "its agent restarted");
      break;
    case Membership::Rejoin::kDevicesChanged:
      spdlog::warn("node {} registered again with another device set", node.node_id);
      FailJobsOnNode(node.node_id, "its agent registered again with another device set");
      break;
    case Membership::Rejoin::kSameAgent:
      break;  // a lost reply: its generations keep their devices
    case Membership::Rejoin::kNew:
      spdlog::info("node {} registered from {} with {} devices", node.node_id, node.address,
                   node.devices.size());
      break;
  }
  auto reply = NewMessage(request_id);
  auto body = reply->payload().initRegisterNodeReply();
  body.setHeartbeatIntervalMs(static_cast<uint32_t>(options_.heartbeat_interval.count()));
  body.setHeartbeatTimeoutMs(static_cast<uint32_t>(options_.heartbeat_timeout.count()));
  body.setCoordinatorInstance(CapText(instance_id_));
  Send(peer, *reply);
  return absl::OkStatus();
}

absl::Status Coordinator::OnHeartbeat(const std::string& peer, uint64_t request_id,
                                      wire::Heartbeat::Reader request) {
  const std::string node_id = Str(request.getNodeId());
  RETURN_IF_ERROR(membership_.Heartbeat(node_id, Str(request.getInstanceId()), clock_->Now()));
  membership_.Find(node_id)->peer = peer;  // the agent may have reconnected
  // Which of the node's actors are stopped: the watchdog names them when a generation hangs.
  std::set<std::string>& stopped = membership_.Find(node_id)->stopped_actors;
  stopped.clear();
  for (auto ref : request.getStoppedActors()) {
    stopped.insert(ActorKey(Str(ref.getJobId()), ref.getGeneration(), ref.getRank()));
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

void Coordinator::OnNodesDead(const std::vector<std::string>& node_ids) {
  for (const auto& node_id : node_ids) {
    const NodeInfo* node = membership_.Find(node_id);
    const double silent = node ? SecondsBetween(node->last_heartbeat, clock_->Now()) : 0;
    spdlog::warn("node {} is dead: no heartbeat for {}", node_id, FormatSeconds(silent));
    metrics_.OnHeartbeatMissed();
    FailJobsOnNode(node_id, "no heartbeat for " + FormatSeconds(silent));
  }
}

void Coordinator::FailJobsOnNode(const std::string& node_id, const std::string& reason) {
  for (auto& [id, job] : jobs_) {
    std::string ranks;
    for (auto& actor : job.actors) {
      // An actor whose exit was never reported went down with its node, even when its
      // generation had already ended for another reason.
      if (actor.node_id != node_id || actor.exited || actor.state == ActorState::kSucceeded ||
          actor.state == ActorState::kLost) {
        continue;
      }
      actor.state = ActorState::kLost;
      actor.detail = "node " + node_id + " lost: " + reason;
      ranks += (ranks.empty() ? "rank " : ", rank ") + std::to_string(actor.rank);
    }
    if (ranks.empty() || job.state != JobState::kRunning) continue;
    Fault fault =
        MakeFault(job, FaultKind::kNodeLost, -1, node_id, "lost " + ranks + " (" + reason + ")");
    if (const NodeInfo* node = membership_.Find(node_id)) {
      fault.unseen_seconds = SecondsBetween(node->last_heartbeat, fault.at);
    }
    OnFault(job, std::move(fault));
  }
}

// ---------------------------------------------------------------------------------------------
// Jobs

absl::Status Coordinator::OnSubmitJob(const std::string& peer, uint64_t request_id,
                                      wire::SubmitJob::Reader request) {
  const std::string yaml = Str(request.getSpecYaml());
  std::string source = Str(request.getSourceName());
  if (source.empty()) source = "job spec";
  // A client that says nothing about its folders (an older one) gets the coordinator's own.
  const std::string here = AbsoluteDir(".");
  const std::string spec_dir =
      request.getSpecDir().size() ? AbsoluteDir(Str(request.getSpecDir())) : here;
  const std::string work_dir =
      request.getWorkDir().size() ? AbsoluteDir(Str(request.getWorkDir())) : here;
  ASSIGN_OR_RETURN(placement::JobSpec spec,
                   placement::ParseJobSpec(yaml, source, placement::PathBase{spec_dir, work_dir}));
  if (absl::Status memory = CheckMemoryTier(spec, membership_); !memory.ok()) {
    return Annotate(memory, source);
  }
  Job job;
  job.id = spec.name + "-" + std::to_string(next_job_number_++);
  job.spec = spec;
  job.spec_yaml = yaml;
  job.spec_dir = spec_dir;
  job.work_dir = work_dir;
  if (spec.kind == placement::JobKind::kTrain) {
    job.train.saving_dir = ResolveUnder(work_dir, spec.train.checkpoint.dir);
  }
  if (spec.parallel_auto) job.auto_max_actors = AutoMaxActors(spec);
  if (spec.kind == placement::JobKind::kServe) {
    // The checkpoint's shape (headers only), for the memory each rank needs: a model that cannot
    // be cut or held is refused here, not by a rank that ran out.
    ASSIGN_OR_RETURN(job.serve_model, ReadServeModel(spec.serve));
    if (absl::Status fits = scheduler_.CheckServeFits(job); !fits.ok()) {
      return Annotate(fits, source);
    }
  }
  job.backend = std::string(placement::BackendName(placement::ResolveBackend(spec)));
  job.submitted_unix_ms = UnixMillis();
  job.waiting_reason = "waiting for devices";
  if (spec.parallel_auto) {
    spdlog::info("job {} submitted: {} on {} {} devices, parallel: auto", job.id,
                 placement::JobKindName(spec.kind),
                 spec.actors > 0 ? "at most " + std::to_string(spec.actors) : "the free",
                 placement::DeviceKindName(spec.devices));
  } else {
    spdlog::info("job {} submitted: {} on {} {} actors{}", job.id,
                 placement::JobKindName(spec.kind), job.World(),
                 placement::DeviceKindName(spec.devices),
                 spec.kind != placement::JobKind::kCommCheck ? " (" + PlanSummary(spec) + ")"
                                                              : "");
  }
  const std::string id = job.id;
  jobs_[id] = std::move(job);
  job_order_.push_back(id);
  Persist(jobs_[id]);
  auto reply = NewMessage(request_id);
  reply->payload().initSubmitJobReply().setJobId(CapText(id));
  Send(peer, *reply);
  TryStartPendingJobs();
  return absl::OkStatus();
}

absl::Status Coordinator::OnCancelJob(const std::string& peer, uint64_t request_id,
                                      wire::CancelJob::Reader request) {
  const std::string id = Str(request.getJobId());
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError("no job '" + id + "'");
  if (!IsFinal(it->second.state)) EndJob(it->second, JobState::kCancelled, "cancelled by user");
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

checkpoint::ResumeRequest Coordinator::StartRequest(const Job& job) const {
  checkpoint::ResumeRequest request = placement::ResumeRequestOf(job.spec.train.checkpoint);
  if (!job.train.committed_here || job.train.saving_dir.empty()) return request;
  // A restart goes on from the job's own newest committed step, whatever the spec resumed from.
  request.dir = job.train.saving_dir;
  request.mode = checkpoint::ResumeMode::kLatest;
  request.path.clear();
  return request;
}

void Coordinator::DecideStart(Job& job) {
  const placement::TrainSpec& spec = job.spec.train;
  const checkpoint::ResumeRequest request = StartRequest(job);
  if (request.dir.empty() && request.mode != checkpoint::ResumeMode::kPath) {
    job.train.start = TrainRecord::Start::kDecided;  // nothing to read: a fresh start
    return;
  }
  job.train.start = TrainRecord::Start::kDeciding;
  job.waiting_reason = "checking its checkpoints (" +
                       (request.mode == checkpoint::ResumeMode::kPath ? request.path : request.dir) +
                       ")";
  const model::ModelConfig config = spec.model;
  const checkpoint::TrainState train = placement::CheckpointTrainStateOf(spec);
  // Verifying a step reads all of it: off the event loop. The task touches only its copies.
  background_.Post([this, id = job.id, request, config, train]() -> BackgroundWork::Finish {
    absl::StatusOr<checkpoint::ResumePlan> plan =
        checkpoint::PlanResume(checkpoint::DefaultFileSystem(), request, config, train);
    return [this, id, plan = std::move(plan)]() { OnStartDecided(id, plan); };
  });
}

void Coordinator::OnStartDecided(const std::string& job_id,
                                 const absl::StatusOr<checkpoint::ResumePlan>& plan) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  // Cancelled meanwhile, or decided already: nothing to apply.
  if (!job.WantsDevices() || job.train.start != TrainRecord::Start::kDeciding) return;
  if (!plan.ok()) {
    EndJob(job, JobState::kFailed,
           std::string(job.generations.empty() ? "cannot start: " : "cannot restart: ") +
               Text(plan.status().message()));
    return;
  }
  TrainRecord& train = job.train;
  train.start = TrainRecord::Start::kDecided;
  train.resume_manifest = plan->decision.manifest;
  train.resumed_step = plan->decision.step;
  train.resumed_from = train.resume_manifest.empty() ? "" : "disk";
  train.resume_note.clear();
  train.skipped = plan->decision.skipped;
  for (const checkpoint::SkippedStep& skipped : train.skipped) {
    spdlog::warn("job {}: skipped checkpoint step {}: {}", job.id, skipped.step, skipped.reason);
  }
  for (const std::string& line : plan->prepared) spdlog::info("job {}: {}", job.id, line);
  if (!train.resume_manifest.empty()) {
    // Where progress stands before the first report: at the step it resumes after.
    train.step = std::max(train.step, train.resumed_step);
    train.last_committed_step = std::max(train.last_committed_step, train.resumed_step);
    spdlog::info("job {}: resumes from step {} ({})", job.id, train.resumed_step,
                 train.resume_manifest);
  }
  if (!job.generations.empty()) {
    // A restart: what the last generation trained past the step this one resumes from is lost.
    GenerationRecord& ended = job.generations.back();
    ended.steps_lost = std::max<int64_t>(0, ended.last_step - train.resumed_step);
    train.step = train.resumed_step;
    train.logged_step = train.resumed_step;
    job.waiting_reason = "restarting after generation " + std::to_string(ended.generation) +
                         ": waiting for devices";
  } else {
    job.waiting_reason = "waiting for devices";
  }
  Persist(job);
}

void Coordinator::TryStartPendingJobs() {
  for (const auto& id : job_order_) {
    Job& job = jobs_[id];
    if (!job.WantsDevices()) continue;
    if (job.spec.kind == placement::JobKind::kTrain &&
        job.train.start != TrainRecord::Start::kDecided) {
      if (job.train.start == TrainRecord::Start::kUndecided) DecideStart(job);
      // A job whose checkpoints are still being read holds no devices: later jobs may start.
      if (job.train.start != TrainRecord::Start::kDecided) continue;
    }
    StartChoice choice = scheduler_.Choose(job);
    switch (choice.verdict) {
      case StartChoice::Verdict::kStart:
        StartGeneration(job, choice.placement);
        continue;
      case StartChoice::Verdict::kFail:
        EndJob(job, JobState::kFailed, choice.reason);
        continue;  // the next job may start
      case StartChoice::Verdict::kWait:
        job.waiting_reason = choice.reason;
        // First come, first served: a later, smaller job does not overtake a pending one. (An
        // auto job between generations re-plans on what it finds and holds nobody up.)
        if (job.spec.parallel_auto && job.state != JobState::kPending) continue;
        return;
    }
  }
}

void Coordinator::StartGeneration(Job& job, const Placement& placement) {
  // The communicator groups first: nothing is spawned for a layout that cannot be cut.
  std::vector<GroupRecord> groups;
  if (job.spec.kind != placement::JobKind::kCommCheck) {
    // A serve job's layout is tp × pp with dp 1: the same groups as training's.
    const auto& parallel = job.spec.parallel;
    auto grid = placement::RankGrid::Create(parallel.tp, parallel.pp, parallel.dp);
    if (grid.ok() && static_cast<size_t>(grid->world()) != placement.size()) {
      grid = absl::InternalError("the layout has " + std::to_string(grid->world()) +
                                 " ranks but " + std::to_string(placement.size()) +
                                 " devices were placed");
    }
    if (!grid.ok()) {
      EndJob(job, JobState::kFailed, "cannot lay out " + PlanSummary(job.spec) + ": " +
                                         Text(grid.status().message()));
      return;
    }
    // Every group of every kind, a group of one rank included: the actors bootstrap each group
    // they are in, and the deadline names the missing ranks group by group.
    for (auto& group : grid->AllGroups(job.spec.data_parallel.diloco())) {
      GroupRecord record;
      record.kind = group.kind;
      record.id = group.id;
      record.ranks = std::move(group.ranks);
      groups.push_back(std::move(record));
    }
    if (job.spec.kind == placement::JobKind::kTrain) {
      PrepareMemoryTier(job, placement, groups);
    }
  } else {
    GroupRecord world;
    world.kind = world.id = "world";
    for (size_t rank = 0; rank < placement.size(); ++rank) {
      world.ranks.push_back(static_cast<int>(rank));
    }
    groups.push_back(std::move(world));
  }
  const TimePoint now = clock_->Now();
  job.generation += 1;
  job.state = JobState::kRunning;
  job.phase = Phase::kSpawning;
  job.waiting_reason.clear();
  job.generation_started = now;
  job.bootstrap_deadline = now + job.spec.bootstrap_timeout;
  job.run_deadline = now + job.spec.run_timeout;
  job.actors.clear();
  job.groups = std::move(groups);
  job.plan.calibrated_ranks.clear();
  job.faults.clear();
  job.error.clear();  // a restart's cause stays in its generation's record
  job.watchdog = ProgressWatchdog(WatchdogFloor(job));
  GenerationRecord record;
  record.generation = job.generation;
  record.started_unix_ms = UnixMillis();
  record.world = static_cast<int>(placement.size());
  record.plan = job.spec.kind != placement::JobKind::kCommCheck
                    ? PlanSummary(job.spec) + " on " + std::to_string(placement.size()) + " actors"
                    : std::to_string(placement.size()) + " actors";
  record.resumed_step = job.train.resumed_step;
  record.last_step = job.train.resumed_step;
  record.resumed_from = job.train.resumed_from;
  record.resume_note = job.train.resume_note;
  job.generations.push_back(std::move(record));
  // A new generation reports its steps and saves its shards afresh; what was committed stays.
  job.train.first_step = -1;
  job.train.recent.clear();
  job.train.saving.clear();
  job.serving = ServingRecord{};
  HoldDevices(membership_, job.id, placement);
  std::vector<std::string>& tokens = job.actor_tokens[job.generation];
  tokens.clear();
  for (size_t rank = 0; rank < placement.size(); ++rank) tokens.push_back(NewActorToken());
  std::map<std::string, std::vector<int>> ranks_by_node;
  for (size_t rank = 0; rank < placement.size(); ++rank) {
    const auto& [node_id, device_slot] = placement[rank];
    const NodeInfo* node = membership_.Find(node_id);
    ActorRecord actor;
    actor.rank = static_cast<int>(rank);
    actor.node_id = node_id;
    actor.device = node->devices[device_slot];
    job.actors.push_back(actor);
    ranks_by_node[node_id].push_back(static_cast<int>(rank));
  }
  if (job.spec.kind == placement::JobKind::kTrain) scheduler_.PredictLayout(job);
  for (const auto& [node_id, ranks] : ranks_by_node) {
    NodeInfo* node = membership_.Find(node_id);
    auto message = NewMessage(0);
    auto spawn = message->payload().initSpawnActors();
    spawn.setJobId(CapText(job.id));
    spawn.setGeneration(job.generation);
    auto list = spawn.initActors(static_cast<unsigned>(ranks.size()));
    for (size_t i = 0; i < ranks.size(); ++i) {
      list[i].setRank(static_cast<uint32_t>(ranks[i]));
      FillDevice(list[i].initDevice(), job.actors[ranks[i]].device);
      list[i].setToken(protocol::AsData(tokens[ranks[i]]));
      // A serve job's leader answers its open requests (503, with the reason) before it goes.
      if (job.spec.kind == placement::JobKind::kServe && ranks[i] == 0) {
        list[i].setStopGraceMs(kServeLeaderStopGraceMs);
      }
    }
    Send(node->peer, *message);
  }
  spdlog::info("job {} generation {}: spawning {} actors on {} nodes", job.id, job.generation,
               placement.size(), ranks_by_node.size());
  Persist(job);
}

void Coordinator::PrepareMemoryTier(Job& job, const Placement& placement,
                                    std::vector<GroupRecord>& groups) {
  TrainRecord& train = job.train;
  std::vector<std::string> rank_nodes;
  for (const auto& [node_id, device_slot] : placement) rank_nodes.push_back(node_id);
  const MemoryChoice choice = ChooseMemoryResume(job, rank_nodes);
  if (choice.used) {
    train.resumed_from = choice.kind;
    train.resume_note.clear();
    spdlog::info("job {}: resumes from memory step {} ({}: the nodes' memory, not {})", job.id,
                 train.resumed_step, choice.kind,
                 train.resume_manifest.empty() ? "a fresh start" : train.resume_manifest);
    if (!job.generations.empty()) {
      GenerationRecord& ended = job.generations.back();
      ended.steps_lost = std::max<int64_t>(0, ended.last_step - train.resumed_step);
    }
    train.step = train.resumed_step;
    train.logged_step = train.resumed_step;
  } else if (!choice.note.empty() || train.memory_forgotten) {
    train.resume_note = !choice.note.empty()
                            ? choice.note
                            : "no memory step was used: they are known only to the coordinator "
                              "that committed them, and the coordinator restarted";
    train.memory_forgotten = false;
    spdlog::warn("job {}: {}; resumes from {}", job.id, train.resume_note,
                 train.resume_manifest.empty() ? "nothing (fresh)" : train.resume_manifest);
  }
  train.memory_buddies.clear();
  const placement::CheckpointSpec& checkpoint = job.spec.train.checkpoint;
  if (checkpoint.memory_interval == 0) return;
  if (checkpoint.memory_replicas > 0) {
    train.memory_buddies = MemoryBuddies(rank_nodes);
    if (train.memory_buddies.empty()) {
      spdlog::warn(
          "job {}: checkpoint.memory_replicas: this generation runs on one node; its "
          "memory steps have no replicas",
          job.id);
    }
  }
  // Files move between nodes (replicas, a resume's fetches) over a group of their own.
  if (std::set<std::string>(rank_nodes.begin(), rank_nodes.end()).size() > 1) {
    GroupRecord memory;
    memory.kind = memory.id = "memory";
    for (size_t rank = 0; rank < rank_nodes.size(); ++rank) {
      memory.ranks.push_back(static_cast<int>(rank));
    }
    groups.push_back(std::move(memory));
  }
}

absl::StatusOr<ActorRecord*> Coordinator::FindActor(const std::string& job_id, uint32_t generation,
                                                    uint32_t rank) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError("no job '" + job_id + "'");
  Job& job = it->second;
  if (job.state != JobState::kRunning) {
    return absl::FailedPreconditionError("job " + job_id + " is " +
                                         std::string(JobStateName(job.state)));
  }
  if (generation != job.generation) {
    return absl::FailedPreconditionError("job " + job_id + " is at generation " +
                                         std::to_string(job.generation) + ", not " +
                                         std::to_string(generation));
  }
  if (!job.GenerationLive()) {
    // Fenced: nothing an aborted generation sends (a late save, a step) is acted on.
    return absl::FailedPreconditionError("generation " + std::to_string(generation) + " of job " +
                                         job_id + " was aborted");
  }
  if (rank >= job.actors.size()) {
    return absl::OutOfRangeError("job " + job_id + " has no rank " + std::to_string(rank) +
                                 " (world size " + std::to_string(job.actors.size()) + ")");
  }
  return &job.actors[rank];
}

absl::Status Coordinator::OnRegisterActor(const std::string& peer, uint64_t request_id,
                                          wire::RegisterActor::Reader request) {
  const std::string job_id = Str(request.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, request.getGeneration(), request.getRank()));
  if (Str(request.getNodeId()) != actor->node_id) {
    return absl::PermissionDeniedError("rank " + std::to_string(actor->rank) +
                                       " belongs on node " + actor->node_id + ", not " +
                                       Str(request.getNodeId()));
  }
  if (actor->state != ActorState::kSpawning) {
    return absl::AlreadyExistsError("rank " + std::to_string(actor->rank) +
                                    " is already registered");
  }
  Job& job = jobs_[job_id];
  actor->state = ActorState::kRegistered;
  actor->peer = peer;
  actor->pid = request.getPid();
  actor->address = Str(request.getAddress());
  actor->metrics_address = Str(request.getMetricsAddress());
  if (job.phase == Phase::kSpawning) job.phase = Phase::kBootstrapping;

  auto reply = NewMessage(request_id);
  auto assignment = reply->payload().initAssignment();
  assignment.setJobId(CapText(job.id));
  assignment.setGeneration(job.generation);
  assignment.setRank(static_cast<uint32_t>(actor->rank));
  assignment.setWorldSize(static_cast<uint32_t>(job.actors.size()));
  assignment.setKind(CapText(std::string(placement::JobKindName(job.spec.kind))));
  assignment.setSpecYaml(CapText(job.spec_yaml));
  assignment.setBackend(CapText(job.backend));
  FillDevice(assignment.initDevice(), actor->device);
  assignment.setStorePrefix(CapText(job.StorePrefix()));
  assignment.setSpecDir(CapText(job.spec_dir));
  assignment.setWorkDir(CapText(job.work_dir));
  if (job.spec.kind != placement::JobKind::kCommCheck) {
    // The layout the ranks run: for `parallel: auto` the planner's, which the spec does not say.
    const placement::ParallelSpec& parallel = job.spec.parallel;
    FillParallelLayout(parallel, assignment.initParallel());
    if (job.spec.kind == placement::JobKind::kTrain) {
      if (!job.train.memory_resume.empty()) {
        assignment.setMemoryResume(CapText(job.train.memory_resume));
      } else {
        assignment.setResumeManifest(CapText(job.train.resume_manifest));
      }
      auto buddies =
          assignment.initMemoryBuddies(static_cast<unsigned>(job.train.memory_buddies.size()));
      for (size_t r = 0; r < job.train.memory_buddies.size(); ++r) {
        buddies.set(static_cast<unsigned>(r), job.train.memory_buddies[r]);
      }
      assignment.setCalibrate(job.Calibrates());
    }
    if (job.spec.kind == placement::JobKind::kServe && actor->rank == 0) {
      assignment.setServeListen(
          CapText(job.serve_listen.empty() ? job.spec.serve.listen : job.serve_listen));
    }
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(job.bootstrap_deadline -
                                                                          clock_->Now());
  assignment.setBootstrapTimeoutMs(static_cast<uint32_t>(std::max<int64_t>(left.count(), 1)));
  auto groups = assignment.initGroups(static_cast<unsigned>(job.groups.size()));
  for (size_t g = 0; g < job.groups.size(); ++g) {
    groups[g].setKind(CapText(job.groups[g].kind));
    groups[g].setId(CapText(job.groups[g].id));
    auto ranks = groups[g].initRanks(static_cast<unsigned>(job.groups[g].ranks.size()));
    for (size_t r = 0; r < job.groups[g].ranks.size(); ++r) {
      ranks.set(static_cast<unsigned>(r), static_cast<uint32_t>(job.groups[g].ranks[r]));
    }
  }
  Send(peer, *reply);
  return absl::OkStatus();
}

absl::Status Coordinator::OnKvRequest(const std::string& peer, uint64_t request_id,
                                      const std::string& sender,
                                      wire::KvRequest::Reader request) {
  const std::string key = Str(request.getKey());
  if (key.empty()) return absl::InvalidArgumentError("kv: empty key");
  // An actor's keys live under its generation's prefix while that generation runs: an aborted
  // generation's late writes and waits are refused (fencing).
  if (sender.rfind("actor/", 0) == 0) {
    const std::vector<std::string> parts = absl::StrSplit(sender, '/');
    auto job = parts.size() == 4 ? jobs_.find(parts[1]) : jobs_.end();
    if (job == jobs_.end() || !job->second.GenerationLive() ||
        std::to_string(job->second.generation) != parts[2]) {
      return absl::FailedPreconditionError("kv: " + sender + " is not an actor of a running "
                                           "generation");
    }
    if (key.rfind(job->second.StorePrefix() + "/", 0) != 0) {
      return absl::PermissionDeniedError("kv: key '" + key + "' is outside " +
                                         job->second.StorePrefix());
    }
  }
  switch (request.getOp()) {
    case wire::KvOp::SET: {
      metrics_.OnKvOperation("set");
      RETURN_IF_ERROR(kv_.CheckQuota(key, request.getValue().size()));
      for (const auto& waiting : kv_.Set(key, Str(request.getValue()))) {
        auto reply = NewMessage(waiting.request_id);
        reply->payload().initKvReply().setValue(protocol::AsData(*kv_.Get(key)));
        Send(waiting.peer, *reply);
      }
      ReplyAck(peer, request_id);
      return absl::OkStatus();
    }
    case wire::KvOp::GET: {
      metrics_.OnKvOperation("get");
      if (auto value = kv_.Get(key)) {
        auto reply = NewMessage(request_id);
        reply->payload().initKvReply().setValue(protocol::AsData(*value));
        Send(peer, *reply);
      } else {
        // A peer cannot park a request for longer than any bootstrap may take.
        const auto wait = std::min(std::chrono::milliseconds(request.getWaitMs()), kMaxKvWait);
        kv_.Park({key, peer, request_id, sender, clock_->Now() + wait});
      }
      return absl::OkStatus();
    }
    case wire::KvOp::ADD: {
      metrics_.OnKvOperation("add");
      RETURN_IF_ERROR(kv_.CheckQuota(key, 20));  // the longest int64 in decimal
      ASSIGN_OR_RETURN(int64_t value, kv_.Add(key, request.getDelta()));
      auto reply = NewMessage(request_id);
      reply->payload().initKvReply().setNumber(value);
      Send(peer, *reply);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("kv: unknown operation " +
                                    std::to_string(static_cast<int>(request.getOp())));
}

// ---------------------------------------------------------------------------------------------
// Bootstrap, progress, checkpoints

absl::StatusOr<Coordinator::GroupMember> Coordinator::FindGroupMember(const std::string& job_id,
                                                                     uint32_t generation,
                                                                     uint32_t rank,
                                                                     const std::string& group_id) {
  ASSIGN_OR_RETURN(ActorRecord * actor, FindActor(job_id, generation, rank));
  Job& job = jobs_[job_id];
  ASSIGN_OR_RETURN(GroupRecord * group, MemberGroup(job, group_id, actor->rank));
  return GroupMember{&job, actor, group};
}

absl::Status Coordinator::OnCommJoin(const std::string& peer, uint64_t request_id,
                                     wire::CommJoin::Reader report) {
  ASSIGN_OR_RETURN(GroupMember member,
                   FindGroupMember(Str(report.getJobId()), report.getGeneration(),
                                   report.getRank(), Str(report.getGroupId())));
  OnJoin(*member.group, *member.actor);
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnCommReady(const std::string& peer, uint64_t request_id,
                                      wire::CommReady::Reader report) {
  ASSIGN_OR_RETURN(GroupMember member,
                   FindGroupMember(Str(report.getJobId()), report.getGeneration(),
                                   report.getRank(), Str(report.getGroupId())));
  Job& job = *member.job;
  const TimePoint now = clock_->Now();
  const ReadyOutcome outcome = OnReady(job, *member.group, *member.actor, now);
  if (outcome.group_ready_seconds) {
    metrics_.ObserveBootstrap(member.group->kind, *outcome.group_ready_seconds);
    spdlog::info("job {} generation {}: group {} ready in {:.3f} s over {}", job.id,
                 job.generation, member.group->id, *outcome.group_ready_seconds,
                 Str(report.getTransport()));
  }
  if (outcome.generation_ready) {
    if (job.spec.kind == placement::JobKind::kTrain) {
      // A calibrating generation measures before its first step, for as long as the machine's
      // load makes it take: the bootstrap's deadline holds until the last rank's measurement is
      // in (OnCalibration), then the first step's allowance starts.
      const TimePoint not_before =
          job.Calibrates() && !job.PredictionCalibrated() ? job.bootstrap_deadline : now;
      job.watchdog.Arm(now, not_before);
    }
    spdlog::info("job {} generation {}: all communicators ready", job.id, job.generation);
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnCommFailed(const std::string& peer, uint64_t request_id,
                                       wire::CommFailed::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  actor->state = ActorState::kFailed;
  actor->detail = Str(report.getMessage());
  ReplyAck(peer, request_id);
  Job& job = jobs_[job_id];
  OnFault(job, MakeFault(job, FaultKind::kCommError, actor->rank, actor->node_id,
                         "could not join group " + Str(report.getGroupId()) + ": " + actor->detail +
                             "; " + DescribeAdvertisedAddresses(job)));
  return absl::OkStatus();
}

std::string Coordinator::DescribeAdvertisedAddresses(const Job& job) {
  // What each node of the generation advertised and why, so that an address its peers cannot
  // reach is named with how it was chosen (protocol/address_rule.h).
  std::string out = "the nodes advertised";
  std::set<std::string> seen;
  for (const ActorRecord& actor : job.actors) {
    if (!seen.insert(actor.node_id).second) continue;
    const NodeInfo* node = membership_.Find(actor.node_id);
    out += (seen.size() > 1 ? ", " : " ") + actor.node_id + " " +
           (node ? node->address + " (" + node->address_chosen_by + ")" : "?");
  }
  return out;
}

absl::Status Coordinator::OnStepReport(const std::string& peer, uint64_t request_id,
                                       wire::StepReport::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  if (job.spec.kind == placement::JobKind::kTrain) {
    StepSample sample;
    sample.step = static_cast<int64_t>(std::min<uint64_t>(report.getStep(), kMaxDimension));
    sample.loss = report.getLoss();
    sample.compute_seconds = report.getComputeSeconds();
    sample.comm_seconds = report.getCommSeconds();
    sample.bubble_seconds = report.getBubbleSeconds();
    sample.tokens_per_second = report.getTokensPerSecond();
    sample.logged = report.getLogged();
    if (report.hasNetworkBytesPerStep()) {
      const auto bytes = report.getNetworkBytesPerStep();
      // From the wire: a negative or non-finite figure is no measurement.
      const auto valid = [](double v) { return std::isfinite(v) && v >= 0; };
      if (valid(bytes.getWorld()) && valid(bytes.getTp()) && valid(bytes.getPp()) &&
          valid(bytes.getDp())) {
        sample.network_bytes_per_step =
            GroupBytes{bytes.getWorld(), bytes.getTp(), bytes.getPp(), bytes.getDp()};
      }
    }
    if (auto recovery = RecordStep(job, actor->rank, sample, clock_->Now())) {
      metrics_.OnRecovered(recovery->cause, recovery->seconds, recovery->steps_lost);
      metrics_.OnResumed(recovery->source, recovery->steps_lost);
      spdlog::info("job {} generation {}: first step {} {:.3f} s after the fault ({} steps lost)",
                   job.id, job.generation, sample.step, recovery->seconds, recovery->steps_lost);
      Persist(job);
    }
  }
  if (job.spec.kind == placement::JobKind::kServe && actor->rank == 0 && report.hasServing()) {
    const auto serving = report.getServing();
    // Counters from the wire, clamped so that none reads negative.
    const auto count = [](uint64_t v) {
      return static_cast<int64_t>(std::min<uint64_t>(v, uint64_t{1} << 62));
    };
    ServingRecord record;
    record.reported = true;
    record.url = Str(serving.getUrl());
    record.model = Str(serving.getModel());
    record.ready = serving.getReady();
    record.running = count(serving.getRunning());
    record.waiting = count(serving.getWaiting());
    record.tokens_generated = count(serving.getTokensGenerated());
    record.kv_blocks = count(serving.getKvBlocks());
    record.kv_blocks_used = count(serving.getKvBlocksUsed());
    record.preemptions = count(serving.getPreemptions());
    const bool became_ready = record.ready && !job.serving.ready;
    if (became_ready) {
      spdlog::info("job {} generation {}: serving {} at {}", job.id, job.generation, record.model,
                   record.url);
    }
    const std::string listened = job.serve_listen;
    if (auto recovery = RecordServing(job, record, clock_->Now())) {
      metrics_.OnRecovered(recovery->cause, recovery->seconds, recovery->steps_lost);
      spdlog::info("job {} generation {}: serving again {:.3f} s after the fault", job.id,
                   job.generation, recovery->seconds);
      Persist(job);
    } else if (job.serve_listen != listened) {
      Persist(job);  // the port a `listen: ...:0` got: a coordinator taking over keeps it
    }
  }
  for (auto r : report.getResults()) {
    CollectiveResultRecord result;
    result.op = Str(r.getOp());
    result.bytes = r.getBytes();
    result.ranks = r.getRanks();
    result.seconds = r.getSeconds();
    result.algorithm_gbps = r.getAlgorithmGBps();
    result.bus_gbps = r.getBusGBps();
    result.ok = r.getOk();
    result.detail = Str(r.getDetail());
    job.results.push_back(std::move(result));
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnShardSaved(const std::string& peer, uint64_t request_id,
                                       wire::ShardSaved::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  const std::string where = "job " + job_id + ", rank " + std::to_string(actor->rank) + ", step " +
                            std::to_string(report.getStep());
  checkpoint::SavedShard shard;
  shard.rank = actor->rank;
  shard.file = Str(report.getFile());
  shard.bytes = report.getFileBytes();
  shard.xxh3 = report.getFileXxh3();
  for (auto tensor : report.getTensors()) {
    checkpoint::SavedPiece piece;
    piece.name = Str(tensor.getName());
    piece.tensor = tensor.getTensor().size() ? Str(tensor.getTensor()) : piece.name;
    const std::string dtype = Str(tensor.getDtype());
    const std::optional<checkpoint::SafetensorsDType> parsed = checkpoint::ParseDType(dtype);
    if (!parsed) {
      return absl::InvalidArgumentError(where + ": tensor '" + piece.name + "': unknown dtype \"" +
                                        dtype + "\"");
    }
    piece.dtype = *parsed;
    piece.xxh3 = tensor.getXxh3();
    const auto read = [&](capnp::List<uint64_t>::Reader in, std::vector<int64_t>& out,
                          const char* what) -> absl::Status {
      for (uint64_t v : in) {
        if (v >= kMaxDimension) {
          return absl::InvalidArgumentError(where + ": tensor '" + piece.name + "': " + what +
                                            " value " + std::to_string(v) + " is too large");
        }
        out.push_back(static_cast<int64_t>(v));
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(read(tensor.getGlobalShape(), piece.global_shape, "global shape"));
    RETURN_IF_ERROR(read(tensor.getOffsets(), piece.offsets, "offset"));
    RETURN_IF_ERROR(read(tensor.getShape(), piece.shape, "shape"));
    shard.pieces.push_back(std::move(piece));
  }
  ShardReport saved;
  saved.step = report.getStep();
  saved.dir = ResolveUnder(job.work_dir, Str(report.getDir()));
  saved.shard = std::move(shard);
  saved.data.tokens =
      static_cast<int64_t>(std::min<uint64_t>(report.getDataTokens(), kMaxDimension));
  saved.data.xxh3 = report.getDataXxh3();
  const int64_t step = static_cast<int64_t>(saved.step);
  if (report.getMemory()) {
    std::vector<int64_t> replica_of;
    for (uint32_t rank : report.getReplicaOf()) replica_of.push_back(rank);
    saved.dir = Str(report.getDir());  // relative to the node's memory store
    ASSIGN_OR_RETURN(const ShardVerdict verdict,
                     AddMemoryShard(job, std::move(saved), actor->node_id, replica_of));
    if (!verdict.job_error.empty()) {
      EndJob(job, JobState::kFailed, verdict.job_error);
      return absl::FailedPreconditionError(verdict.job_error);
    }
    if (verdict.complete) {
      // A memory step that does not make a checkpoint costs its use, not the job: the disk
      // steps stay.
      if (auto status = CommitMemoryStep(job, step); !status.ok()) {
        spdlog::warn("job {}: {}", job.id, Text(status.message()));
      }
    }
    ReplyAck(peer, request_id);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const ShardVerdict verdict, AddShard(job, std::move(saved)));
  if (!verdict.job_error.empty()) {
    EndJob(job, JobState::kFailed, verdict.job_error);
    return absl::FailedPreconditionError(verdict.job_error);
  }
  if (!verdict.complete) {
    ReplyAck(peer, request_id);
    return absl::OkStatus();
  }
  // Every rank saved the step: commit it.
  if (auto status = CommitStep(job, step, checkpoint::DefaultFileSystem()); !status.ok()) {
    // The ranks' shards do not make a checkpoint (or it cannot be written): going on would
    // train on with nothing to resume from.
    EndJob(job, JobState::kFailed, Text(status.message()));
    return status;
  }
  Persist(job);
  MaybeGrow(job);
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnCalibration(const std::string& peer, uint64_t request_id,
                                        wire::Calibration::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  const std::string where = "job " + job_id + ", rank " + std::to_string(actor->rank);
  if (Str(report.getNodeId()) != actor->node_id) {
    return absl::PermissionDeniedError(where + " runs on node " + actor->node_id + ", not " +
                                       Str(report.getNodeId()));
  }
  const auto valid = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!valid(report.getComputeFlops()) || !valid(report.getComputeHalfDim()) ||
      !valid(report.getOptimizerBytesPerSecond())) {
    return absl::InvalidArgumentError(
        where + ": the layer and optimizer rates must be finite and ≥ 0, got " +
        std::to_string(report.getComputeFlops()) + " FLOP/s, half at " +
        std::to_string(report.getComputeHalfDim()) + ", optimizer " +
        std::to_string(report.getOptimizerBytesPerSecond()) + " B/s");
  }
  // Check the whole report before recording any of it.
  std::vector<std::pair<const GroupRecord*, wire::GroupBandwidth::Reader>> groups;
  for (auto measured : report.getGroups()) {
    const std::string group_id = Str(measured.getGroupId());
    auto group = std::find_if(job.groups.begin(), job.groups.end(),
                              [&](const GroupRecord& g) { return g.id == group_id; });
    if (group == job.groups.end() ||
        std::find(group->ranks.begin(), group->ranks.end(), actor->rank) == group->ranks.end()) {
      return absl::InvalidArgumentError(where + " is not a member of a group '" + group_id + "'");
    }
    if (!valid(measured.getBusBytesPerSecond()) || !valid(measured.getLatencySeconds())) {
      return absl::InvalidArgumentError(where + ", group " + group_id +
                                        ": bandwidth and latency must be finite and ≥ 0");
    }
    groups.emplace_back(&*group, measured);
  }
  const int64_t now = UnixMillis();
  // The coordinator's own record says which device and which nodes were measured, not the report.
  calibration_.RecordCompute(actor->node_id, DeviceLabel(actor->device),
                             ComputeRate{report.getComputeFlops(), report.getComputeHalfDim(),
                                         report.getOptimizerBytesPerSecond()},
                             job_id, now);
  const std::string source = job_id + "/" + std::to_string(job.generation);
  for (const auto& [group, measured] : groups) {
    std::vector<std::string> rank_nodes;
    for (int rank : group->ranks) rank_nodes.push_back(job.actors[rank].node_id);
    calibration_.RecordGroup(rank_nodes, measured.getBusBytesPerSecond(),
                             measured.getLatencySeconds(), source, job_id, now);
  }
  spdlog::debug("{}: calibration {:.3g} FLOP/s, {} groups", where, report.getComputeFlops(),
                groups.size());
  // Once every rank has measured, the job's own numbers price its layout.
  const bool first_from_rank = job.plan.calibrated_ranks.insert(actor->rank).second;
  if (first_from_rank && job.PredictionCalibrated()) {
    scheduler_.PredictLayout(job);
    if (job.watchdog.armed() && job.watchdog.newest_step() < 0) job.watchdog.Arm(clock_->Now());
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnActorDone(const std::string& peer, uint64_t request_id,
                                      wire::ActorDone::Reader report) {
  const std::string job_id = Str(report.getJobId());
  if (auto it = jobs_.find(job_id); it != jobs_.end() && it->second.phase == Phase::kAborting &&
                                    it->second.generation == report.getGeneration() &&
                                    report.getRank() < it->second.actors.size() &&
                                    !report.getOk()) {
    // A rank of an aborted generation failing: part of the cascade, kept for the record.
    Job& job = it->second;
    ActorRecord& actor = job.actors[report.getRank()];
    actor.state = ActorState::kFailed;
    actor.detail = Str(report.getMessage());
    ReplyAck(peer, request_id);
    OnFault(job, MakeFault(job, FaultKind::kAborted, actor.rank, actor.node_id,
                           "failed: " + actor.detail));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  ReplyAck(peer, request_id);
  if (report.getOk()) {
    actor->state = ActorState::kSucceeded;
    actor->detail = Str(report.getMessage());
    MaybeFinishJob(job);
  } else {
    actor->state = ActorState::kFailed;
    actor->detail = Str(report.getMessage());
    const auto code = static_cast<absl::StatusCode>(report.getErrorCode());
    const bool communicator = code == absl::StatusCode::kUnavailable ||
                              code == absl::StatusCode::kDeadlineExceeded ||
                              code == absl::StatusCode::kAborted;
    OnFault(job, MakeFault(job, communicator ? FaultKind::kCommError : FaultKind::kActorError,
                           actor->rank, actor->node_id, "failed: " + actor->detail));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::OnActorExited(const std::string& peer, uint64_t request_id,
                                        wire::ActorExited::Reader report) {
  ReplyAck(peer, request_id);
  const std::string job_id = Str(report.getJobId());
  const std::string how = Str(report.getDescription());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.generation != report.getGeneration() ||
      report.getRank() >= it->second.actors.size()) {
    return absl::OkStatus();  // an actor of a generation already ended: nothing to do
  }
  Job& job = it->second;
  ActorRecord& actor = job.actors[report.getRank()];
  actor.exited = true;
  if (job.state != JobState::kRunning) return absl::OkStatus();
  const bool clean = !report.getSignaled() && report.getCode() == 0;
  if (actor.state == ActorState::kSucceeded && clean) return absl::OkStatus();
  // An actor that reported its own failure exits after it: that report was the fault.
  const bool reported = actor.state == ActorState::kFailed;
  actor.state = ActorState::kFailed;
  if (reported) return absl::OkStatus();
  actor.detail = "exited: " + how;
  // Only the agent knows whether it killed the actor: an exit that reaches us after the abort
  // began may still be the fault that set it off (a killed rank's peers often report first).
  const bool aborted = report.getKilledByAgent();
  OnFault(job, MakeFault(job, aborted ? FaultKind::kAborted : FaultKind::kActorExit, actor.rank,
                         actor.node_id,
                         (aborted ? "was stopped by the abort: " : "") + how +
                             (clean ? " before reporting its result" : "")));
  return absl::OkStatus();
}

void Coordinator::MaybeFinishJob(Job& job) {
  const bool all_done = std::all_of(job.actors.begin(), job.actors.end(), [](const auto& a) {
    return a.state == ActorState::kSucceeded;
  });
  if (!all_done) return;
  const bool all_ok = std::all_of(job.results.begin(), job.results.end(),
                                  [](const auto& r) { return r.ok; });
  if (all_ok) {
    EndJob(job, JobState::kSucceeded, "");
  } else {
    std::string bad;
    for (const auto& r : job.results) {
      if (!r.ok) bad += (bad.empty() ? "" : "; ") + r.op + " " + std::to_string(r.bytes) + " B: " + r.detail;
    }
    EndJob(job, JobState::kFailed, "results did not verify: " + bad);
  }
}

void Coordinator::SendAbort(const Job& job, const std::string& reason, bool job_ended) {
  std::set<std::string> nodes;
  for (const ActorRecord& actor : job.actors) {
    if (!actor.exited && actor.state != ActorState::kLost) nodes.insert(actor.node_id);
  }
  // The job's end reaches every node: any may hold its memory steps, from any generation.
  if (job_ended) {
    for (const auto& [node_id, node] : membership_.nodes()) nodes.insert(node_id);
  }
  for (const auto& node_id : nodes) {
    const NodeInfo* node = membership_.Find(node_id);
    if (!node || !node->alive) continue;
    auto message = NewMessage(0);
    auto abort = message->payload().initAbortGeneration();
    abort.setJobId(CapText(job.id));
    abort.setGeneration(job.generation);
    abort.setReason(CapText(reason));
    abort.setJobEnded(job_ended);
    Send(node->peer, *message);
  }
}

void Coordinator::EndJob(Job& job, JobState state, const std::string& error) {
  if (IsFinal(job.state)) return;
  // A generation still holding actors and devices (CloseGeneration leaves kNone or kRestarting).
  const bool generation_open = job.state == JobState::kRunning && job.phase != Phase::kNone &&
                               job.phase != Phase::kRestarting;
  if (!job.generations.empty() && job.generations.back().ending == Ending::kRunning) {
    GenerationRecord& record = job.generations.back();
    record.ended_unix_ms = UnixMillis();
    record.ending = state == JobState::kSucceeded  ? Ending::kSucceeded
                    : state == JobState::kCancelled ? Ending::kCancelled
                                                    : Ending::kFailed;
  }
  job.state = state;
  job.error = error;
  job.phase = Phase::kNone;
  job.finished_unix_ms = UnixMillis();
  job.watchdog.Disarm();
  job.recovering_since.reset();
  if (generation_open) {
    metrics_.OnGeneration(state == JobState::kSucceeded ? "completed" : "aborted");
    for (auto& actor : job.actors) {
      if (actor.state != ActorState::kSucceeded && actor.state != ActorState::kFailed &&
          actor.state != ActorState::kLost) {
        actor.state = ActorState::kFailed;
        if (actor.detail.empty()) actor.detail = "aborted with its generation";
      }
    }
    SendAbort(job, state == JobState::kSucceeded ? "job succeeded" : error, /*job_ended=*/true);
    FreeDevices(membership_, job.id);
    kv_.ErasePrefix("job/" + job.id + "/");
  } else if (job.spec.kind == placement::JobKind::kTrain &&
             job.spec.train.checkpoint.memory_interval > 0 && !job.generations.empty()) {
    SendAbort(job, JobStateName(job.state).data(), /*job_ended=*/true);  // the nodes' memory steps
  }
  if (state == JobState::kSucceeded) {
    spdlog::info("job {} succeeded", job.id);
  } else {
    spdlog::warn("job {} {}: {}", job.id, JobStateName(state), error);
  }
  Persist(job);
}
// ---------------------------------------------------------------------------------------------
// Supervision (the rules are generation_supervisor.h's; this is their wiring to the wire)

Fault Coordinator::MakeFault(const Job& job, FaultKind kind, int rank, const std::string& node,
                             std::string detail) const {
  return supervisor_.MakeFault(job, kind, rank, node, std::move(detail), clock_->Now());
}

void Coordinator::OnFault(Job& job, Fault fault) {
  const bool aborting = job.state == JobState::kRunning && job.phase == Phase::kAborting;
  if (auto abort = supervisor_.OnFault(job, std::move(fault), clock_->Now())) {
    spdlog::warn("job {} generation {}: {}; aborting the generation", job.id, job.generation,
                 *abort);
    SendAbort(job, *abort);
  } else if (aborting) {  // kept with the generation's faults
    spdlog::info("job {} generation {}: also {}", job.id, job.generation,
                 DescribeFault(job.faults.faults().back()));
  }
}

void Coordinator::Supervise() {
  const TimePoint now = clock_->Now();
  for (auto& [id, job] : jobs_) {
    switch (supervisor_.Check(job, now)) {
      case GenerationSupervisor::Due::kNothing:
        break;
      case GenerationSupervisor::Due::kClose:
        CloseGeneration(job);
        break;
      case GenerationSupervisor::Due::kHung: {
        // Alive but silent: a stopped process (its agent says which) or a deadlock.
        std::vector<int> stopped;
        for (const ActorRecord& actor : job.actors) {
          const NodeInfo* host = membership_.Find(actor.node_id);
          if (host != nullptr && host->stopped_actors.count(ActorKey(
                                     job.id, job.generation, static_cast<uint32_t>(actor.rank)))) {
            stopped.push_back(actor.rank);
          }
        }
        OnFault(job, supervisor_.HangFault(job, stopped, now));
        break;
      }
      case GenerationSupervisor::Due::kBootstrapTimeout: {
        Fault fault = supervisor_.BootstrapFault(job, now);
        fault.detail += "; " + DescribeAdvertisedAddresses(job);
        OnFault(job, std::move(fault));
        break;
      }
      case GenerationSupervisor::Due::kRunTimeout:
        EndJob(job, JobState::kFailed,
               "run timeout of " + FormatSeconds(Seconds(job.spec.run_timeout)) + " reached");
        break;
      case GenerationSupervisor::Due::kWaitTimeout:
        EndJob(job, JobState::kFailed,
               "waited " + FormatSeconds(Seconds(job.spec.elastic.wait_timeout)) +
                   " (elastic.wait_timeout_s) to restart: " + job.waiting_reason);
        break;
    }
  }
}

void Coordinator::CloseGeneration(Job& job) {
  const GenerationSupervisor::Closure closure =
      supervisor_.Close(job, clock_->Now(), UnixMillis());
  FreeDevices(membership_, job.id);
  if (closure.blamed_rank >= 0) {
    const ActorRecord& blamed = job.actors[static_cast<size_t>(closure.blamed_rank)];
    const std::string why = DescribeFault(*job.generations.back().cause);
    AvoidDevice(membership_, blamed, why);
    spdlog::info("job {}: placements avoid {} of node {} until it registers again: {}", job.id,
                 DeviceLabel(blamed.device), blamed.node_id, why);
  }
  kv_.ErasePrefix("job/" + job.id + "/");
  metrics_.OnGeneration("aborted");
  const GenerationRecord& record = job.generations.back();
  if (!closure.error.empty()) {
    spdlog::warn("job {} {}; aborted in {:.3f} s", job.id, closure.error, record.abort_seconds);
  }
  if (!closure.restart) {
    EndJob(job, JobState::kFailed, closure.error);
    return;
  }
  if (!closure.restart_cause.empty()) metrics_.OnRestart(closure.restart_cause);
  spdlog::info("job {}: restarting after generation {} ({})", job.id, job.generation,
               record.ending == Ending::kGrow ? "to grow" : closure.error);
  Persist(job);
  TryStartPendingJobs();
}

void Coordinator::MaybeGrow(Job& job) {
  if (!job.GenerationLive()) return;
  const std::optional<int> larger = scheduler_.GrowTarget(job);
  if (!larger) return;
  const std::string reason = "growing from " + std::to_string(job.World()) + " to " +
                             std::to_string(*larger) + " actors after step " +
                             std::to_string(job.train.last_committed_step);
  spdlog::info("job {} generation {}: {}", job.id, job.generation, reason);
  supervisor_.BeginAbort(job, Ending::kGrow, clock_->Now());
  SendAbort(job, reason);
}

// ---------------------------------------------------------------------------------------------
// Status, persistence, metrics

absl::Status Coordinator::OnStatusRequest(const std::string& peer, uint64_t request_id,
                                          wire::StatusRequest::Reader request) {
  const std::string job_id = Str(request.getJobId());
  if (!job_id.empty() && !jobs_.count(job_id)) return absl::NotFoundError("no job '" + job_id + "'");
  auto reply = NewMessage(request_id);
  const StatusSource source{options_.cluster_id, metrics_server_->address(), started_,
                            membership_,         calibration_,               jobs_,
                            job_order_};
  FillStatus(reply->payload().initClusterStatus(), source, job_id, clock_->Now());
  Send(peer, *reply);
  return absl::OkStatus();
}

void Coordinator::Persist(const Job& job) { history_.Save(job); }

absl::Status Coordinator::LoadHistory() {
  std::vector<Job> loaded = history_.Load(clock_->Now());
  for (auto& job : loaded) {
    const auto dash = job.id.rfind('-');
    if (dash != std::string::npos) {
      next_job_number_ = std::max<uint64_t>(next_job_number_,
                                            std::strtoull(job.id.c_str() + dash + 1, nullptr, 10) + 1);
    }
    job_order_.push_back(job.id);
    const std::string id = job.id;
    // Memory steps are committed in the coordinator's memory: what this job had is unknown now.
    job.train.memory_forgotten = job.spec.kind == placement::JobKind::kTrain &&
                                 job.spec.train.checkpoint.memory_interval > 0 &&
                                 !IsFinal(job.state);
    jobs_[id] = std::move(job);
    Persist(jobs_[id]);
  }
  if (!loaded.empty()) spdlog::info("loaded {} jobs from {}", loaded.size(), options_.state_dir);
  return absl::OkStatus();
}

void Coordinator::UpdateGauges() {
  const ClusterGauges gauges = CountGauges(membership_, jobs_);
  metrics_.SetTrainJobs(gauges.train);
  metrics_.SetNodes(gauges.nodes);
  metrics_.SetDevices(gauges.devices);
  metrics_.SetActors(gauges.actors);
  metrics_.SetJobs(gauges.jobs);
}

}  // namespace shardline::coordinator
