#include "protocol/channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

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

Channel::~Channel() = default;

absl::StatusOr<std::unique_ptr<Channel>> Channel::Bind(const std::string& endpoint) {
  std::string bind_endpoint = endpoint;
  // "tcp://host:0" is the usual way to ask for any port; ZeroMQ spells it "*".
  if (bind_endpoint.size() > 2 && bind_endpoint.compare(bind_endpoint.size() - 2, 2, ":0") == 0) {
    bind_endpoint.replace(bind_endpoint.size() - 1, 1, "*");
  }
  try {
    auto socket = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::router);
    CommonOptions(*socket);
    socket->set(zmq::sockopt::router_mandatory, 1);
    socket->bind(bind_endpoint);
    std::string bound = socket->get(zmq::sockopt::last_endpoint);
    return std::unique_ptr<Channel>(new Channel(std::move(socket), bound, true));
  } catch (const zmq::error_t& e) {
    return ZmqError("cannot listen on " + endpoint, e);
  }
}

absl::StatusOr<std::unique_ptr<Channel>> Channel::Connect(const std::string& endpoint) {
  try {
    auto socket = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::dealer);
    CommonOptions(*socket);
    socket->connect(endpoint);
    return std::unique_ptr<Channel>(new Channel(std::move(socket), endpoint, false));
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
    zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::optional<Frame>();
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
    frame.bytes = std::move(part);
    return std::optional<Frame>(std::move(frame));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<Frame>();
    return ZmqError("receiving on " + endpoint_, e);
  }
}

absl::StatusOr<std::string> LocalAddressFor(const std::string& endpoint) {
  // endpoint: tcp://HOST:PORT
  std::string rest = endpoint;
  const auto scheme = rest.find("://");
  if (scheme != std::string::npos) rest = rest.substr(scheme + 3);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("endpoint '" + endpoint + "' has no port");
  }
  std::string host = rest.substr(0, colon);
  if (host == "*" || host.empty()) return std::string("127.0.0.1");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &result); rc != 0) {
    return absl::InvalidArgumentError("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string address;
  if (fd >= 0 && connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
      address = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(result);
  if (address.empty()) return absl::UnavailableError("no route to " + host);
  return address;
}

}  // namespace shardline::protocol
