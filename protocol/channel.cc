#include "protocol/channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "protocol/zap_handler.h"
#include "spdlog/spdlog.h"

namespace shardline::protocol {
namespace {

absl::Status ZmqError(const std::string& what, const zmq::error_t& e) {
  const int err = e.num();
  std::string message = what + ": " + e.what();
  if (err == EADDRINUSE) return absl::AlreadyExistsError(message);
  if (err == EHOSTUNREACH) return absl::UnavailableError(message);
  if (err == EINVAL || err == EPROTONOSUPPORT || err == ENODEV) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

void CommonOptions(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::linger, 0);
  // A hard cap far above kMaxFrameBytes: frames between the two limits are still read, so that
  // the receiver can answer "oversized" instead of ZeroMQ silently dropping the connection.
  socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(4 * kMaxFrameBytes));
  socket.set(zmq::sockopt::sndhwm, 10000);
  socket.set(zmq::sockopt::rcvhwm, 10000);
}

}  // namespace

zmq::context_t& ZmqContext() {
  static zmq::context_t* context = new zmq::context_t(1);  // leaked: sockets may outlive statics
  return *context;
}

Channel::Channel(std::unique_ptr<zmq::socket_t> socket, std::string endpoint, bool router)
    : socket_(std::move(socket)), endpoint_(std::move(endpoint)), router_(router) {}

Channel::~Channel() {
  if (monitor_) {
    zmq_socket_monitor(socket_->handle(), nullptr, 0);
    monitor_.reset();
  }
  socket_.reset();
  if (!zap_domain_.empty()) UnregisterZapDomain(zap_domain_);
}

void Channel::Monitor(int events) {
  static std::atomic<uint64_t> next_monitor{1};
  const std::string address = "inproc://shardline-monitor-" + std::to_string(next_monitor++);
  if (zmq_socket_monitor(socket_->handle(), address.c_str(), events) != 0) {
    throw zmq::error_t();
  }
  monitor_ = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::pair);
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(address);
}

void Channel::DrainMonitor() {
  // An event is two frames: 2 bytes of event and 4 of value, then the endpoint.
  zmq::message_t event, address;
  while (monitor_->recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)monitor_->recv(address, zmq::recv_flags::dontwait);
    if (event.size() < 6) continue;
    uint16_t id;
    uint32_t value;
    memcpy(&id, event.data(), 2);
    memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
    OnHandshakeEvent(id, value);
  }
}

void Channel::OnHandshakeEvent(uint16_t event, uint32_t value) {
  const bool mismatch = event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
                        value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH;
  if (router_) {
    // Refusals by the allowlist are the ZAP handler's to count; these never reached it. A peer
    // without CURVE that reads our greeting and hangs up before we read its own leaves us
    // NO_DETAIL (EPIPE), not a mechanism mismatch: counted as "handshake", as nothing says more.
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return;
    const std::string_view reason = mismatch ? "no_curve" : "handshake";
    if (observer_) observer_->OnAuthRefused(reason);
    spdlog::debug("handshake refused on {}: event {:#x} value {:#x} ({})", endpoint_, event, value,
                  reason);
    bool& logged = mismatch ? logged_no_curve_ : logged_handshake_;
    if (!logged) {
      logged = true;
      spdlog::warn(
          "refused a connection on {}: {} (logged once; counted in "
          "shardline_auth_refusals_total{{reason=\"{}\"}})",
          endpoint_,
          mismatch ? "the peer does not speak CURVE (no keys, or --insecure)"
                   : "its CURVE handshake failed (a wrong coordinator key, or not ZeroMQ)",
          reason);
    }
    return;
  }
  // A plain client fails a handshake for one reason only: the server wants CURVE (the event
  // that says so may come after the connection's close, NO_DETAIL).
  const bool refused = mismatch || event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                       (!curve_ && event != ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  handshake_refused_ = refused;
  if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
    handshake_failure_.clear();
  } else if (mismatch || !curve_) {
    handshake_failure_ =
        curve_ ? "the coordinator at " + endpoint_ +
                     " does not use CURVE (it runs with --insecure): connect with --insecure too"
               : "the coordinator at " + endpoint_ +
                     " requires CURVE keys and this process has none: give --keys DIR (a "
                     "directory made by `shardline keygen`, or $SHARDLINE_KEYS)";
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
    handshake_failure_ = "the coordinator at " + endpoint_ + " refused this process's CURVE key " +
                         public_key_ + " (ZAP status " + std::to_string(value) +
                         ": not on its allowlist)";
  } else {
    handshake_failure_ = "the CURVE handshake with " + endpoint_ +
                         " failed: is coordinator.key the public key of the coordinator there?";
  }
}

absl::StatusOr<std::unique_ptr<Channel>> Channel::Bind(const std::string& endpoint,
                                                       const ServerCurve* curve) {
  std::string bind_endpoint = endpoint;
  // "tcp://host:0" is the usual way to ask for any port; ZeroMQ spells it "*".
  if (bind_endpoint.size() > 2 && bind_endpoint.compare(bind_endpoint.size() - 2, 2, ":0") == 0) {
    bind_endpoint.replace(bind_endpoint.size() - 1, 1, "*");
  }
  try {
    auto socket = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::router);
    CommonOptions(*socket);
    socket->set(zmq::sockopt::router_mandatory, 1);
    std::string zap_domain;
    if (curve) {
      if (!curve->allowlist) return absl::InvalidArgumentError("a CURVE server needs an allowlist");
      zap_domain = RegisterZapDomain(curve->allowlist, curve->observer);
      socket->set(zmq::sockopt::curve_server, 1);
      socket->set(zmq::sockopt::curve_secretkey, curve->keys.secret_key);
      socket->set(zmq::sockopt::zap_domain, zap_domain);
    }
    auto channel = std::unique_ptr<Channel>(new Channel(std::move(socket), endpoint, true));
    channel->zap_domain_ = zap_domain;
    channel->curve_ = curve != nullptr;
    if (curve) {
      channel->observer_ = curve->observer;
      channel->Monitor(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
    }
    channel->socket_->bind(bind_endpoint);
    channel->endpoint_ = channel->socket_->get(zmq::sockopt::last_endpoint);
    return channel;
  } catch (const zmq::error_t& e) {
    return ZmqError("cannot listen on " + endpoint, e);
  }
}

absl::StatusOr<std::unique_ptr<Channel>> Channel::Connect(const std::string& endpoint,
                                                          const ClientCurve* curve) {
  try {
    auto socket = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::dealer);
    CommonOptions(*socket);
    if (curve) {
      socket->set(zmq::sockopt::curve_serverkey, curve->server_public_key);
      socket->set(zmq::sockopt::curve_publickey, curve->keys.public_key);
      socket->set(zmq::sockopt::curve_secretkey, curve->keys.secret_key);
    }
    auto channel = std::unique_ptr<Channel>(new Channel(std::move(socket), endpoint, false));
    channel->curve_ = curve != nullptr;
    if (curve) channel->public_key_ = curve->keys.public_key;
    // Plain clients too: against a CURVE server theirs is the mechanism mismatch to explain.
    channel->Monitor(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    channel->socket_->connect(endpoint);
    return channel;
  } catch (const zmq::error_t& e) {
    return ZmqError("cannot connect to " + endpoint, e);
  }
}

absl::Status Channel::Send(Outgoing& message, const std::string& peer) {
  auto words = message.Serialize();
  auto bytes = words.asBytes();
  return SendRaw(bytes.begin(), bytes.size(), peer);
}

absl::Status Channel::SendRaw(const void* data, size_t size, const std::string& peer) {
  try {
    if (router_) {
      if (!socket_->send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return absl::UnavailableError("send queue to peer full");
      }
    }
    if (!socket_->send(zmq::const_buffer(data, size), zmq::send_flags::dontwait)) {
      return absl::UnavailableError("send queue to " + endpoint_ + " is full");
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqError(router_ ? "sending to a peer that is gone" : "sending to " + endpoint_, e);
  }
}

absl::StatusOr<std::optional<Frame>> Channel::Receive(std::chrono::milliseconds timeout) {
  try {
    // Handshake events are handled on the way; only a new refusal ends the wait early (a
    // refusal seen before waits out the timeout, so that a retrying loop does not spin).
    const bool refused_before = handshake_refused_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      zmq::pollitem_t items[] = {{socket_->handle(), 0, ZMQ_POLLIN, 0},
                                 {monitor_ ? monitor_->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      if (zmq::poll(items, monitor_ ? 2 : 1, left) == 0) return std::optional<Frame>();
      if (items[0].revents & ZMQ_POLLIN) break;
      DrainMonitor();
      if ((handshake_refused_ && !refused_before) || std::chrono::steady_clock::now() >= deadline) {
        return std::optional<Frame>();
      }
    }
    Frame frame;
    if (router_) {
      zmq::message_t id;
      if (!socket_->recv(id, zmq::recv_flags::dontwait)) return std::optional<Frame>();
      frame.peer = id.to_string();
    }
    // A well-behaved peer sends one part; of a multi-part frame the last part is kept.
    zmq::message_t part;
    if (!socket_->recv(part, zmq::recv_flags::dontwait)) return std::optional<Frame>();
    while (part.more()) {
      if (!socket_->recv(part, zmq::recv_flags::dontwait)) break;
    }
    if (curve_) {
      // Set by the ZAP handler on every message of an accepted connection.
      if (const char* user_id = zmq_msg_gets(part.handle(), "User-Id")) frame.user_id = user_id;
    }
    frame.bytes = std::move(part);
    return std::optional<Frame>(std::move(frame));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<Frame>();
    return ZmqError("receiving on " + endpoint_, e);
  }
}

}  // namespace shardline::protocol
