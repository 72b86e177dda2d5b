// A ZeroMQ socket carrying Envelope frames. The coordinator binds a ROUTER; agents, actors and
// the CLI connect DEALERs. Every receive has an explicit timeout; nothing blocks forever.
// Not thread-safe: one thread owns a Channel (as ZeroMQ requires of its sockets).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "protocol/envelope.h"

namespace shardline::protocol {

// One received frame, not yet decoded. `peer` is the ROUTER's routing id of the sender (empty on
// a DEALER).
struct Frame {
  std::string peer;
  zmq::message_t bytes;
};

class Channel {
 public:
  // Binds a ROUTER on `endpoint` ("tcp://127.0.0.1:5555"; port "*" or 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<Channel>> Bind(const std::string& endpoint);
  // Connects a DEALER to `endpoint`. Succeeds at once: ZeroMQ connects in the background.
  static absl::StatusOr<std::unique_ptr<Channel>> Connect(const std::string& endpoint);

  ~Channel();

  // The endpoint actually bound or connected (with the real port after "*").
  const std::string& endpoint() const { return endpoint_; }

  // Sends to `peer` (ROUTER) or to the connected peer (DEALER; `peer` ignored). A ROUTER send to
  // a peer that is gone is Unavailable.
  absl::Status Send(Outgoing& message, const std::string& peer = {});
  // Sends raw bytes: for tests that feed a peer bad frames.
  absl::Status SendRaw(const void* data, size_t size, const std::string& peer = {});

  // Waits up to `timeout` for a frame; nullopt when none came.
  absl::StatusOr<std::optional<Frame>> Receive(std::chrono::milliseconds timeout);

 private:
  Channel(std::unique_ptr<zmq::socket_t> socket, std::string endpoint, bool router);

  std::unique_ptr<zmq::socket_t> socket_;
  std::string endpoint_;
  bool router_;
};

// The process-wide ZeroMQ context (one I/O thread).
zmq::context_t& ZmqContext();

// The local address this host uses to reach `endpoint`'s host (by asking the kernel's routing
// table with an unconnected UDP socket): what a node advertises to its peers.
absl::StatusOr<std::string> LocalAddressFor(const std::string& endpoint);

}  // namespace shardline::protocol
