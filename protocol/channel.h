// A ZeroMQ socket carrying Envelope frames. The coordinator binds a ROUTER; agents, actors and
// the CLI connect DEALERs. Every receive has an explicit timeout; nothing blocks forever.
// With CURVE (protocol/curve.h) the ROUTER lets in only the keys of its allowlist, and a DEALER
// learns why the server refused it (its socket monitor's handshake events) instead of waiting.
// Not thread-safe: one thread owns a Channel (as ZeroMQ requires of its sockets).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "protocol/curve.h"
#include "protocol/envelope.h"

namespace shardline::protocol {

// One received frame, not yet decoded. `peer` is the ROUTER's routing id of the sender (empty on
// a DEALER).
struct Frame {
  std::string peer;
  // The sender's CURVE public key (z85) as the ZAP handler accepted it; empty without CURVE.
  std::string user_id;
  zmq::message_t bytes;
};

class Channel {
 public:
  // Binds a ROUTER on `endpoint` ("tcp://127.0.0.1:5555"; port "*" or 0 picks a free one), a
  // CURVE server when `curve` is given (its allowlist is shared, not copied), else plain.
  static absl::StatusOr<std::unique_ptr<Channel>> Bind(const std::string& endpoint,
                                                       const ServerCurve* curve = nullptr);
  // Connects a DEALER to `endpoint`, a CURVE client when `curve` is given. Succeeds at once:
  // ZeroMQ connects (and handshakes) in the background.
  static absl::StatusOr<std::unique_ptr<Channel>> Connect(const std::string& endpoint,
                                                          const ClientCurve* curve = nullptr);

  ~Channel();

  // The endpoint actually bound or connected (with the real port after "*").
  const std::string& endpoint() const { return endpoint_; }

  // Sends to `peer` (ROUTER) or to the connected peer (DEALER; `peer` ignored). A ROUTER send to
  // a peer that is gone is Unavailable.
  absl::Status Send(Outgoing& message, const std::string& peer = {});
  // Sends raw bytes: for tests that feed a peer bad frames.
  absl::Status SendRaw(const void* data, size_t size, const std::string& peer = {});

  // Waits up to `timeout` for a frame; nullopt when none came. On a DEALER it also returns
  // (nullopt) as soon as the handshake with the server fails: see handshake_failure().
  absl::StatusOr<std::optional<Frame>> Receive(std::chrono::milliseconds timeout);

  // A DEALER's last failed handshake with its server, as a sentence for the user ("the
  // coordinator at ... refused this key ..."); empty while none failed since the last success.
  const std::string& handshake_failure() const { return handshake_failure_; }
  // Whether that failure is the server's answer (no CURVE on one side, a key it refused) and so
  // will not pass on a retry; a handshake cut short (a restarting server) is not.
  bool handshake_refused() const { return handshake_refused_; }

 private:
  Channel(std::unique_ptr<zmq::socket_t> socket, std::string endpoint, bool router);
  // Starts the socket monitor that reports handshake events.
  void Monitor(int events);
  void DrainMonitor();
  void OnHandshakeEvent(uint16_t event, uint32_t value);

  std::unique_ptr<zmq::socket_t> socket_;
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR, connected to socket_'s monitor
  std::string endpoint_;
  bool router_;
  bool curve_ = false;
  std::string zap_domain_;            // a CURVE ROUTER's, unregistered on destruction
  std::string public_key_;            // a CURVE DEALER's own, for the messages
  AuthObserver* observer_ = nullptr;  // a CURVE ROUTER's
  std::string handshake_failure_;
  bool handshake_refused_ = false;
  bool logged_no_curve_ = false, logged_handshake_ = false;
};

// The process-wide ZeroMQ context (one I/O thread).
zmq::context_t& ZmqContext();

}  // namespace shardline::protocol
